"""A run whose loss stopped being a finite number: it ends at that step, on every rank, with
the last good checkpoint kept and what to change said."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from ratrain import checkpoint
from ratrain.checkpoint import saving
from ratrain.config import RunConfig
from ratrain.errors import UserError


class TrainingDiverged(UserError):
    """The loss stopped being a finite number; the run ends with the last good checkpoint kept."""


def diverged(row: dict, cfg: RunConfig, saver: saving.Saver, where: Path,
             publishes: bool) -> NoReturn:
    """`row`: the step's metrics row; `where`: the run's checkpoints, which this rank publishes
    (`publishes`) or waits to see published."""
    saver.wait()  # a save in flight is of a good step: it counts, on every rank
    if saver.times and not publishes:
        saving.wait_published(where, saver.times[-1]["step"], cfg.parallel.comm_timeout_s)
    newest = checkpoint.complete_dirs(where)
    kept = f"the last good checkpoint is {newest[-1].name}" if newest else "no checkpoint was saved"
    fix = "lower the learning rate"
    if cfg.train.dtype == "float16":  # loss scaling guards the gradients, not this
        fix += (" or train in bfloat16 (--dtype bfloat16: float16's activations overflow "
                "past 65504, bfloat16 has float32's range)")
    raise TrainingDiverged(f"loss is {row['loss']} at step {row['step']}; {kept}; {fix}")
