"""The training loop and what a run writes: the run directory, per-step metrics, MFU,
TensorBoard scalars. `loop.train` is the one entry point."""
