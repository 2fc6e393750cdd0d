"""`--tensorboard`: each step's metrics as TensorBoard scalars under RUN_DIR/tensorboard/.

Needs the `tensorboard` package (`pip install 'ratrain[tensorboard]'`). On resume, events past
the resumed step are purged, as metrics.jsonl is cut back, so the curves describe one run; a run
that starts afresh in a directory with events (`--resume auto` before any checkpoint) purges them
all, as it empties metrics.jsonl.

The events are written here, in the step's thread, each row's whole or not at all: torch's
SummaryWriter wrote them from a thread of its own, whose failure on a full disk printed its
traceback and came back as a raw OSError at a later step. A failed write is a warning, and
TensorBoard off for the rest of the run, not the run's end: the scalars are a copy of
metrics.jsonl's rows (which the report and a resume read, and whose own failed write ends the
run, naming the newest checkpoint), as the report is a side output whose failure is a warning.
"""
from __future__ import annotations

import io
import itertools
import os
import socket
import sys
import time
from pathlib import Path

from ratrain.config import append_whole
from ratrain.errors import UserError

_files = itertools.count()  # the event file's last name part, as tensorboard's own writer has it

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
    """Appends each row's scalars to one event file of RUN_DIR/tensorboard/ (a new file each
    time the run starts: TensorBoard reads a directory's files in order); `path` None: off."""

    def __init__(self, run_dir: str | Path, resume_step: int | None = None):
        check_available()
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        log_dir = Path(run_dir) / "tensorboard"
        self.path: Path | None = log_dir / "events.out.tfevents.{:010d}.{}.{}.{}".format(
            int(time.time()), socket.gethostname(), os.getpid(), next(_files))
        purge = (resume_step or 0) + 1  # the events of this step and after, an earlier run's
        first = [Event(wall_time=time.time(), file_version="brain.Event:2"),
                 Event(step=purge, file_version="brain.Event:2"),
                 Event(step=purge, session_log=SessionLog(status=SessionLog.START))]
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._off(e, log_dir)
            return
        self._append(first)

    def write(self, row: dict) -> None:
        if self.path is None:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        now = time.time()
        self._append([Event(wall_time=now, step=row["step"],
                            summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))
                      for tag, value in scalars_of(row).items()])

    def close(self) -> None:
        """(Nothing is held open between rows.)"""

    def _append(self, events) -> None:
        """The events' records appended whole, or cut back to the file as it was."""
        from tensorboard.summary.writer.record_writer import RecordWriter

        buffer = io.BytesIO()
        records = RecordWriter(buffer)
        for event in events:
            records.write(event.SerializeToString())
        try:
            append_whole(self.path, buffer.getvalue())
        except OSError as e:
            self._off(e, self.path)

    def _off(self, e: OSError, path: Path) -> None:
        self.path = None
        print(f"warning: could not write {path}: {e.strerror or e}; TensorBoard is off for the "
              "rest of this run (metrics.jsonl keeps every step's metrics)",
              file=sys.stderr, flush=True)
