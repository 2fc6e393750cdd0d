"""`--tensorboard`: each step's metrics as TensorBoard scalars under RUN_DIR/tensorboard/.

Needs the `tensorboard` package (`pip install 'ratrain[tensorboard]'`); torch's SummaryWriter
writes the event files. On resume, events past the resumed step are purged, as metrics.jsonl is
cut back, so the curves describe one run; a run that starts afresh in a directory with events
(`--resume auto` before any checkpoint) purges them all, as it empties metrics.jsonl.
"""

from __future__ import annotations

from pathlib import Path

from ratrain.errors import UserError

# metrics.jsonl key -> TensorBoard tag
SCALARS = {
    "loss": "loss/train",
    "val_loss": "loss/validation",
    "lr": "optimizer/lr",
    "grad_norm": "optimizer/grad_norm",
    "loss_scale": "optimizer/loss_scale",
    "tokens_per_s": "throughput/tokens_per_s",
    "mfu": "throughput/mfu",
    "step_time_s": "throughput/step_time_s",
    "peak_memory_bytes": "memory/peak_bytes",
}
PER_RANK = {  # lists of one value per rank (or replica, or island), a tag each
    "peak_memory_bytes_per_rank": "memory/peak_bytes/rank_{}",
    "ledger_peak_bytes_per_rank": "memory/ledger_peak_bytes/rank_{}",
    "rss_growth_bytes_per_rank": "memory/rss_growth_bytes/rank_{}",
    "loss_per_replica": "loss/train/replica_{}",
    "loss_per_island": "loss/train/island_{}",  # --sync diloco:...:islands=K
    "loss_scale_per_replica": "optimizer/loss_scale/replica_{}",
}


def check_available() -> None:
    """A UserError, before a run starts, if the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise UserError("--tensorboard needs the tensorboard package: "
                        "pip install 'ratrain[tensorboard]'") from None


def scalars_of(row: dict) -> dict[str, float]:
    """The TensorBoard tags and values of one metrics.jsonl row."""
    out = {tag: float(row[key]) for key, tag in SCALARS.items() if row.get(key) is not None}
    for key, tag in PER_RANK.items():
        for rank, value in enumerate(row.get(key) or []):
            if value is not None:
                out[tag.format(rank)] = float(value)
    return out


class TensorBoardLog:
    def __init__(self, run_dir: str | Path, resume_step: int | None = None):
        check_available()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"),
                                    purge_step=(resume_step or 0) + 1)

    def write(self, row: dict) -> None:
        for tag, value in scalars_of(row).items():
            self.writer.add_scalar(tag, value, row["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
