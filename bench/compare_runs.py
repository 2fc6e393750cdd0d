"""Compare two finished ratrain runs step by step: per-step training loss, validation loss, and the
final weights of every unit (from each run's last checkpoint). Prints the largest relative
differences and writes them as JSON; exits 1 when a difference exceeds `--tolerance`.

    python bench/compare_runs.py RUN_A RUN_B [--tolerance 1e-5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.training.metrics import read_metrics


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def compare(run_a: Path, run_b: Path) -> dict:
    rows_a, rows_b = read_metrics(run_a / "metrics.jsonl"), read_metrics(run_b / "metrics.jsonl")
    if [r["step"] for r in rows_a] != [r["step"] for r in rows_b]:
        raise SystemExit(f"error: {run_a} and {run_b} logged different steps")
    loss = [_rel(a["loss"], b["loss"]) for a, b in zip(rows_a, rows_b)]
    val = [_rel(a["val_loss"], b["val_loss"]) for a, b in zip(rows_a, rows_b) if "val_loss" in b]
    n_units = RunConfig.load(run_b / "config.yaml").model.n_units
    units_a, units_b = (checkpoint.load_units(checkpoint.latest(r), range(n_units), torch.device("cpu"))
                        for r in (run_a, run_b))
    weights = {
        f"{u}.{name}": float((units_a[u]["weights"][name] - w).norm() / w.norm().clamp_min(1e-30))
        for u in range(n_units) for name, w in units_b[u]["weights"].items()
    }
    worst = max(weights, key=weights.get)
    return {
        "runs": [str(run_a), str(run_b)], "steps": len(loss),
        "first_loss": [rows_a[0]["loss"], rows_b[0]["loss"]],
        "last_loss": [rows_a[-1]["loss"], rows_b[-1]["loss"]],
        "max_rel_loss_diff": max(loss), "steps_with_identical_loss": sum(d == 0 for d in loss),
        "max_rel_val_loss_diff": max(val, default=None),
        "max_rel_weight_diff": weights[worst], "worst_tensor": worst,
        "tokens_per_s": [json.loads((r / "summary.json").read_text())["tokens_per_s"]
                         for r in (run_a, run_b)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    result = compare(args.run_a, args.run_b)
    for key, value in result.items():
        print(f"{key:28} {value}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    worst = max(result["max_rel_loss_diff"], result["max_rel_val_loss_diff"] or 0.0,
                result["max_rel_weight_diff"])
    print(f"largest relative difference {worst:.3g} "
          f"{'within' if worst <= args.tolerance else 'ABOVE'} tolerance {args.tolerance:g}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
