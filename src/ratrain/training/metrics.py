"""Step metrics: JSON lines in the run directory, and what rank 0 adds to them (MFU,
TensorBoard)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ratrain.config import append_whole, write_whole
from ratrain.errors import RunFailure, UserError


class RunDirWriteError(RunFailure):
    """A file of the run directory (metrics.jsonl, summary.json, trace.json) could not be
    written: a full disk, most often. A RunFailure, so that the launcher relays its message
    (which names the file) from whichever rank wrote it."""


def write_failed(path: Path, e: OSError, checkpoints) -> RunDirWriteError:
    """The error of a failed write of `path` (a file of the run directory), saying what the run
    keeps: the newest complete checkpoint in `checkpoints` (the run's checkpoint directory, as
    checkpoint.root takes it; None: none)."""
    from ratrain import checkpoint

    kept = (checkpoint.what_is_kept(checkpoints, path.parent) if checkpoints is not None
            else "there is no checkpoint to resume from")
    return RunDirWriteError(f"could not write {path}: {e.strerror or e}; {kept}")


class MetricsLog:
    """Appends one JSON object per line to run_dir/metrics.jsonl.

    On resume the log is cut back to the checkpoint's step first, so the file always describes one
    consistent run; `kept` holds the rows before it (the run's earlier parts). A float that is
    not finite (a float16 step's overflowed grad_norm, a diverged one's) is written as null:
    JSON has no NaN, and strict parsers refuse Python's.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None, checkpoints=None):
        """`checkpoints`: the run's checkpoint directory, which a failed write's error names
        the newest of."""
        self.path = Path(path)
        self.checkpoints = checkpoints
        self.kept: list[dict] = []
        try:
            if resume_step is not None and self.path.exists():
                self.kept = [finite(row) for row in read_metrics(self.path)
                             if row["step"] <= resume_step]
                # replaced whole: a kill while it is written leaves the earlier file, not a part
                write_whole(self.path, "".join(_line(row) for row in self.kept))
            elif resume_step is None:
                self.path.write_text("")
        except OSError as e:
            raise write_failed(self.path, e, checkpoints) from None

    def write(self, row: dict) -> None:
        """Appends the row whole or not at all: unbuffered, so that nothing is left to flush
        on close after a failed write, and cut back to the rows before it if the disk filled
        part way through the line."""
        try:
            append_whole(self.path, _line(row).encode())
        except OSError as e:  # (a half row left: read_metrics leaves a cut last line out)
            raise write_failed(self.path, e, self.checkpoints) from None


def _line(row: dict) -> str:
    return json.dumps(finite(row), allow_nan=False) + "\n"


def finite(value):
    """`value` with its floats that are not finite, at any depth, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


class MetricsDamaged(UserError, ValueError):
    """A line of metrics.jsonl, not its last, that is not a row (the file was edited, or two
    writers mixed their lines): the message names the file and the line."""


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl; a last line cut short (the machine died, or its disk
    filled, while the line was written) is left out, rather than stop every later resume
    and report of the run at a JSON error."""
    return [row for _, row in numbered_rows(path)]


def numbered_rows(path: str | Path, lone_line_damaged: bool = False) -> list[tuple[int, dict]]:
    """read_metrics's rows, each with its line number: for a reader that checks the rows'
    values (report/run.py), whose refusal names the line. `lone_line_damaged`: a file whose
    only line is not a row is a MetricsDamaged, not one cut short: the report, which has no
    step to show of it, called a file of one line of junk empty. (Not for a resume, whose
    first row's write may have been cut short.)"""
    lines = [(n, line) for n, line in enumerate(Path(path).read_text().splitlines(), 1)
             if line.strip()]
    rows = [(n, _row(path, n, line)) for n, line in lines[:-1]]
    try:
        rows += [(lines[-1][0], _row(path, *lines[-1]))] if lines else []
    except MetricsDamaged:
        if lone_line_damaged and not rows:
            raise
    return rows


def _row(path, n: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise MetricsDamaged(f"{path} is damaged: line {n}: {e.msg} (column {e.colno})") from None
    step = row.get("step") if isinstance(row, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):  # (true is an int to Python)
        raise MetricsDamaged(f"{path} is damaged: line {n} is not a row (an object with its "
                             f"step): {line[:60]}")
    return row


class StepExtras:
    """What rank 0 adds to each step's row and to the run's summary beyond the loop's own
    metrics: MFU (training/mfu.py) and, with --tensorboard, the row as TensorBoard scalars
    (training/tensorboard_log.py). Made before the first step: on a CPU without a profile it measures
    the matmul peak (about 0.3 s), unless `measured_before` (the run's checkpoint kept the
    measurement: mfu.run_peak) is of this machine."""

    def __init__(self, cfg, run_dir: str | Path, world: int, device: torch.device,
                 resume_step: int | None = None, measured_before: dict | None = None):
        from ratrain.training import mfu

        profile = None
        if cfg.train.profile:
            from ratrain.sim.profile import load_profile

            profile = load_profile(cfg.train.profile)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        self.flops_per_token = mfu.flops_per_token(cfg.model, cfg.train.seq_len)
        self.threads = torch.get_num_threads()  # each local rank's, as they were set
        self.peak = mfu.run_peak(device.type, cfg.train.dtype, world, self.threads, profile,
                                 name, measured_before)
        self.tb = None
        if cfg.train.tensorboard:
            from ratrain.training.tensorboard_log import TensorBoardLog

            self.tb = TensorBoardLog(run_dir, resume_step)

    def mfu(self, tokens_per_s: float | None) -> float | None:
        from ratrain.training.mfu import mfu

        return mfu(self.flops_per_token, tokens_per_s, self.peak.flops)

    def step(self, row: dict) -> None:
        """Adds `mfu` to the row (where the peak is known) and writes it to TensorBoard."""
        value = self.mfu(row.get("tokens_per_s"))
        if value is not None:
            row["mfu"] = value
        if self.tb:
            self.tb.write(row)

    def finish(self, summary: dict) -> None:
        """Adds the MFU of the mean tokens/s, the FLOPs per token, the peak and the ranks'
        CPU threads (what the report's simulated step computes on) to the summary."""
        summary["mfu"] = self.mfu(summary.get("tokens_per_s"))
        summary["threads_per_rank"] = self.threads
        summary["flops_per_token"] = self.flops_per_token
        summary["peak_flops"] = self.peak.flops
        summary["peak_flops_source"] = self.peak.source
        if self.tb:
            self.tb.close()
