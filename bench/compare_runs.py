"""Compare two finished ratrain runs step by step: per-step training loss, validation loss (at
the steps both runs validated), and the final weights of every unit (from each run's checkpoint
of its last logged step). Prints the largest relative differences and the checkpoints compared,
and writes them as JSON; exits 1 when a difference exceeds `--tolerance`, 2 (one line) when the
runs cannot be compared.

    python bench/compare_runs.py RUN_A RUN_B [--tolerance 1e-5] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.metrics import read_metrics


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def _rows(run: Path) -> list[dict]:
    for name in ("metrics.jsonl", "config.yaml"):
        if not (run / name).is_file():
            raise UserError(f"{run / name} does not exist: is {run} a ratrain run directory?")
    rows = read_metrics(run / "metrics.jsonl")
    if not rows:
        raise UserError(f"{run / 'metrics.jsonl'} holds no step")
    return rows


def _final_checkpoint(run: Path, last_step: int) -> Path:
    """The run's checkpoint of `last_step`: the newest that verifies (checkpoint.latest) may be
    an earlier step's where a later one is damaged, and weights of different steps differ."""
    ckpt, damaged = checkpoint.scan(run)
    skipped = "".join(f"; {c.name} skipped: {why}" for c, why in damaged)
    if ckpt is None:
        raise UserError(f"{run} has no checkpoint that verifies (trained with "
                         f"--no-checkpoints?){skipped}")
    step = checkpoint.load_meta(ckpt)["step"]
    if step != last_step:
        raise UserError(f"{run}'s newest checkpoint that verifies, {ckpt}, is of step "
                         f"{step}, not of its last logged step {last_step}{skipped}")
    return ckpt


def _model(run: Path):
    return RunConfig.load(run / "config.yaml").model


def compare(run_a: Path, run_b: Path) -> dict:
    rows_a, rows_b = _rows(run_a), _rows(run_b)
    if [r["step"] for r in rows_a] != [r["step"] for r in rows_b]:
        raise UserError(f"{run_a} and {run_b} logged different steps")
    model_a, model_b = _model(run_a), _model(run_b)
    differ = [f"{k} {v} vs {getattr(model_b, k)}" for k, v in dataclasses.asdict(model_a).items()
              if v != getattr(model_b, k)]
    if differ:
        raise UserError(f"{run_a} and {run_b} trained different models: {', '.join(differ)}")
    loss = [_rel(a["loss"], b["loss"]) for a, b in zip(rows_a, rows_b)]
    val = [_rel(a["val_loss"], b["val_loss"]) for a, b in zip(rows_a, rows_b)
           if "val_loss" in a and "val_loss" in b]
    ckpts = [_final_checkpoint(r, rows_a[-1]["step"]) for r in (run_a, run_b)]
    units = range(model_b.n_units)
    units_a, units_b = (checkpoint.load_units(c, units, torch.device("cpu"), optimizer=False)
                        for c in ckpts)
    weights = {
        f"{u}.{name}": float((units_a[u]["weights"][name] - w).norm() / w.norm().clamp_min(1e-30))
        for u in units for name, w in units_b[u]["weights"].items()
    }
    worst = max(weights, key=weights.get)
    return {
        "runs": [str(run_a), str(run_b)], "checkpoints": [str(c) for c in ckpts],
        "steps": len(loss), "first_loss": [rows_a[0]["loss"], rows_b[0]["loss"]],
        "last_loss": [rows_a[-1]["loss"], rows_b[-1]["loss"]],
        "max_rel_loss_diff": max(loss), "steps_with_identical_loss": sum(d == 0 for d in loss),
        "max_rel_val_loss_diff": max(val, default=None), "validations_compared": len(val),
        "max_rel_weight_diff": weights[worst], "worst_tensor": worst,
        "tokens_per_s": [_tokens_per_s(r) for r in (run_a, run_b)],
    }


def _tokens_per_s(run: Path) -> float | None:
    summary = run / "summary.json"
    return json.loads(summary.read_text()).get("tokens_per_s") if summary.is_file() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    try:
        result = compare(args.run_a, args.run_b)
    except UserError as e:  # exit 2, as ratrain's own refusals: 1 is a difference above tolerance
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key, value in result.items():
        print(f"{key:28} {value}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    worst = max(result["max_rel_loss_diff"], result["max_rel_val_loss_diff"] or 0.0,
                result["max_rel_weight_diff"])
    print(f"largest relative difference {worst:.3g} "
          f"{'within' if worst <= args.tolerance else 'ABOVE'} tolerance {args.tolerance:g}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
