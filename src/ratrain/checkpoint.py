"""Checkpoints by unit: one file per schedulable unit (its weights and AdamW state).

Files are named by unit, not by rank, so a run saved with one pipeline layout resumes with any
other. A checkpoint is written into `step_N.partial/` and renamed when complete, so a crash while
saving never leaves a checkpoint that looks whole.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ratrain.errors import UserError


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_units(run_dir: Path, step: int, states: dict[int, dict]) -> None:
    """Write this process's units into the partial directory of `step`."""
    partial = checkpoint_dir(run_dir, step).with_suffix(".partial")
    partial.mkdir(parents=True, exist_ok=True)
    for unit, state in states.items():
        torch.save(state, partial / f"unit_{unit:04d}.pt")


def finalize(run_dir: Path, step: int, meta: dict, keep: int = 2) -> Path:
    """Called once, after every process has saved its units: mark the checkpoint complete."""
    final = checkpoint_dir(run_dir, step)
    partial = final.with_suffix(".partial")
    (partial / "meta.json").write_text(json.dumps(meta, indent=2))
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    for old in sorted(final.parent.glob("step_*[0-9]"))[:-keep]:
        shutil.rmtree(old)
    return final


def latest(run_dir: Path) -> Path | None:
    done = sorted((Path(run_dir) / "checkpoints").glob("step_*[0-9]"))
    return done[-1] if done else None


def load_meta(ckpt: Path) -> dict:
    return json.loads((ckpt / "meta.json").read_text())


def load_units(ckpt: Path, units, device: torch.device) -> dict[int, dict]:
    states = {}
    for u in units:
        f = ckpt / f"unit_{u:04d}.pt"
        if not f.exists():
            raise UserError(f"checkpoint {ckpt} has no unit {u}: was it saved from another model?")
        states[u] = torch.load(f, map_location=device, weights_only=True)
    return states
