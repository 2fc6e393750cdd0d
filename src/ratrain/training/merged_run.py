"""A merged run's files besides its checkpoint (`ratrain merge-parts`): rank 0's node's run
files, which only rank 0 writes. Here, not in checkpoint/merge.py, because whether the merged
step is the run's end is the training's to say (run_checkpoints.summed_up_at)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ratrain.training.run_checkpoints import summed_up_at
from ratrain.training.run_tokenizer import BESIDE, COPY


def copy_run_files(main: Path, out: Path, step: int) -> str | None:
    """Into the merged run `out`, from rank 0's node's run directory `main` (only rank 0 writes
    them): plan.json, metrics.jsonl and the run's tokenizer copy (which export and a resume
    take where the original moved), with its tokenizer_config.json and chat template where
    kept; where `step` is the run's end, summary.json (its run_dir made `out`'s) and
    trace.json (both of every rank: rank 0 gathers them). Until 2026-12-04 only plan.json and
    metrics.jsonl came along: the merged run's export and resume failed once the original
    tokenizer moved, and `ratrain report` said a finished run did not reach its end. Returns
    why summary.json and trace.json were left out, where they were."""
    for name in ("plan.json", "metrics.jsonl", COPY, *BESIDE):
        if (main / name).is_file():
            shutil.copy2(main / name, out / name)
    end = summed_up_at(main)
    if end != step:  # (None: the run did not reach its end, and wrote neither)
        return None if end is None else (
            f"step_{step:06d} is not the run's end (step {end}, which not every part holds): "
            f"summary.json and trace.json, of the end, are left out of {out}")
    summary = json.loads((main / "summary.json").read_text())
    summary["run_dir"] = str(out.absolute())
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if (main / "trace.json").is_file():  # (--no-trace, or a plain engine's: none)
        shutil.copy2(main / "trace.json", out / "trace.json")
    return None
