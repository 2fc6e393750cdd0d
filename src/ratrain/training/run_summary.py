"""summary.json: what rank 0 says of a run that reached its last step, over every part of it
(training/whole_run.py: a resumed run's earlier parts are counted from their rows)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.schedule.grid import RankGrid
from ratrain.training.metrics import finite, read_metrics, write_failed
from ratrain.training.whole_run import RunPeaks, Throughput


def write_summary(run_dir: Path, cfg: RunConfig, grid: RankGrid, last: dict,
                  throughput: Throughput, peaks: RunPeaks, ledgers: list[tuple],
                  saves: list[dict], extras, checkpoints=None) -> None:
    """`last`: the run's last row; `ledgers`: each rank's (ledger at its peak, by kind; bytes
    held before training); `saves`: this process's checkpoint saves (Saver.times); `extras`:
    the StepExtras that add MFU; `checkpoints`: the run's checkpoint directory, which a failed
    write's error names the newest of."""
    counted = throughput.tokens_per_s() is not None  # else each part took one step
    summary = {"run_dir": str(run_dir.absolute()), "steps": last.get("step"),
               "final_loss": last.get("loss"), "val_loss": last.get("val_loss"),
               "tokens_per_s": throughput.tokens_per_s() if counted else last.get("tokens_per_s"),
               # which steps: each part's first (a resume's too) pays for warm-up
               "tokens_per_s_of_steps": throughput.of_steps() if counted else str(last.get("step")),
               "peak_memory_bytes": last.get("peak_memory_bytes"),
               "schedule": cfg.parallel.schedule, "weight_grad": cfg.parallel.weight_grad,
               "grad_lifetime": cfg.parallel.grad_lifetime}
    if "loss_per_island" in last:  # islands=K: final_loss's of each, how far they drifted apart
        summary["loss_per_island"] = last["loss_per_island"]
    if peaks.from_step is not None:  # a resume gave the ranks other jobs: peaks since then
        summary["memory_peaks_from_step"] = peaks.from_step
    per_stage = grid.largest_per_stage
    if "ledger_peak_bytes_per_rank" in last:
        summary["ledger_peak_bytes_per_stage"] = per_stage(last["ledger_peak_bytes_per_rank"])
        summary["ledger_at_peak_by_kind_per_rank"] = [at_peak for at_peak, _ in ledgers]
        summary["ledger_before_training_bytes_per_rank"] = [held for _, held in ledgers]
    if "rss_growth_bytes_per_rank" in last:
        summary["rss_growth_bytes_per_stage"] = per_stage(last["rss_growth_bytes_per_rank"])
    if saves:  # the main rank's saves: training thread's and writer's seconds
        summary["checkpoint_saves"] = saves
    if cfg.train.dtype == "float16":
        rows = read_metrics(run_dir / "metrics.jsonl")
        # --sync diloco: the steps any replica skipped, and each replica's (each has its scale)
        summary["skipped_steps"] = [r["step"] for r in rows if r.get("skipped")]
        summary["loss_scale"] = last.get("loss_scale")
        if "loss_scale_per_replica" in last:
            summary["skipped_steps_per_replica"] = [
                [r["step"] for r in rows if _skipped_by(r, i)]
                for i in range(len(last["loss_scale_per_replica"]))]
            summary["loss_scale_per_replica"] = last["loss_scale_per_replica"]
    val = summary["val_loss"]
    if isinstance(val, float) and not math.isfinite(val):  # said, not dropped: JSON has no NaN
        summary["val_loss_not_finite"] = True
    extras.finish(summary)
    path = run_dir / "summary.json"
    text = json.dumps(finite(summary), indent=2, allow_nan=False)
    try:
        path.write_text(text)
    except OSError as e:
        path.unlink(missing_ok=True)  # half a summary would pass for the whole one
        raise write_failed(path, e, checkpoints) from None


def _skipped_by(row: dict, replica: int) -> bool:
    """Whether `replica` skipped the row's step (a resume onto another dp has other replicas)."""
    each = row.get("skipped_per_replica") or []
    return replica < len(each) and bool(each[replica])
