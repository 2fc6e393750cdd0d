"""One checkpoint from the nodes' parts of a run whose nodes kept their own (node-local
checkpoints, training/shared_dir.py), once the parts are on one filesystem: a checkpoint of the
whole run again, which any layout resumes and `ratrain export` reads. Files are hard-linked
where they can be (a part of a 7B DiLoCo run is ~135 GB), else copied."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ratrain.checkpoint import _partial, complete_dirs, finalize, manifest, step_of
from ratrain.errors import UserError


def newest_common_step(roots: list) -> tuple[int, list[str]]:
    """The newest step every part's checkpoint directory (`roots`, as complete_dirs takes them)
    holds and that verifies (each part hashed) in every one of them, and for each newer step
    they all hold, why it was skipped: as resume and export skip a damaged checkpoint for the
    newest that verifies (a damaged part refused the merge though an older step verified in
    every part, and a truncated one was passed over without a word)."""
    held = [{step_of(c): c for c in complete_dirs(r)} for r in roots]
    common = set.intersection(*(set(h) for h in held)) if held else set()
    skipped = []
    for step in sorted(common, reverse=True):
        # sizes first in every part: a cut-short part costs no other part's hashing
        wrong = next(((h[step], w) for hashed in (False, True) for h in held
                      if (w := manifest.problem(h[step], hashed))), None)
        if wrong is None:
            return step, skipped
        skipped.append(f"step_{step:06d}: {wrong[0]}: {wrong[1]}")
    raise UserError("the parts hold no step in common that verifies in every part: "
                    + "; ".join(skipped or [f"{r}: {sorted(h) or 'none'}"
                                            for r, h in zip(roots, held)]))


def merge_parts(parts: list[Path], out, step: int, verified: bool = False) -> Path:
    """Write `out`'s checkpoint of `step` (`out` as finalize takes it) from `parts`, the step's
    checkpoint directories of every node; each part is hashed first, unless `verified` (by
    newest_common_step). Returns it."""
    metas = []
    for part in parts:
        wrong = manifest.problem(part, hashed=not verified)
        if wrong:
            raise UserError(f"{part}: {wrong}")
        metas.append(manifest.read(part)[0])
    _check_parts(parts, metas)
    partial = _partial(out, step)
    partial.mkdir(parents=True)
    files: dict[str, dict] = {}
    for part, meta in zip(parts, metas):
        for name, entry in meta["files"].items():
            if name in files:
                continue  # the same bytes (_check_parts): a synchronous run's copies
            try:
                os.link(part / name, partial / name)
            except OSError:
                shutil.copy2(part / name, partial / name)
            files[name] = entry
    first = next(m for m in metas if 0 in m["ranks"])
    meta = {k: v for k, v in first.items() if k not in ("files", "ranks", "format", "step")}
    meta["rng"] = {r: g for m in metas for r, g in m["rng"].items()}
    scales = {r: s for m in metas for r, s in m.get("loss_scale_per_rank", {}).items()}
    if scales:
        meta["loss_scale_per_rank"] = scales
    return finalize(out, step, meta, files, keep=1)


def _check_parts(parts: list[Path], metas: list[dict]) -> None:
    """The parts are every node's of one run's step: node-local, of one configuration, their
    ranks every rank once, a file in two of them the same bytes."""
    for part, meta in zip(parts, metas):
        if "ranks" not in meta:
            raise UserError(f"{part} is a whole checkpoint, not a node's part")
    saved = [{k: m["config"][k] for k in ("model", "parallel", "train")} for m in metas]
    if any(s != saved[0] for s in saved):
        raise UserError("the parts are of different runs (their configurations differ)")
    world = saved[0]["parallel"]["pp"] * saved[0]["parallel"]["dp"]
    ranks = sorted(r for m in metas for r in m["ranks"])
    if ranks != list(range(world)):
        raise UserError(f"the parts hold ranks {ranks}, the run had {world}: "
                        + ("a node's part is missing" if len(set(ranks)) == len(ranks) < world
                           else "a node's part was given twice"))
    seen: dict[str, tuple[Path, str]] = {}
    for part, meta in zip(parts, metas):
        for name, entry in meta["files"].items():
            if name in seen and seen[name][1] != entry["sha256"]:
                raise UserError(f"{name} differs between {seen[name][0]} and {part}")
            seen.setdefault(name, (part, entry["sha256"]))
