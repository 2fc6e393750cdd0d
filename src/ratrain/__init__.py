"""ratrain: resource-aware pipeline + data-parallel training for LLaMA-family models."""

__version__ = "0.1.0"
