"""The setup stage: a run config (and an optional plan file) in, a checked plan out."""
