"""Checkpoints by unit, verified by a manifest.

`RUN/checkpoints/step_000010/` (or `DIR/step_000010/` with --checkpoint-dir DIR: `Elsewhere`)
holds, per unit, `unit_0003.safetensors` (weights) and `unit_0003.optim.pt` (AdamW state), and
`manifest.json` (store.py, manifest.py). Files are named by unit, not by rank, so a run saved
with one pipeline layout resumes with any other. Every process writes its units into
`step_N.partial/`; the main process then writes the manifest, last, and renames the directory
(saving.py: in the background, while training goes on). Loading verifies the manifest first,
and the newest checkpoint that verifies is the one a run resumes from.

Where a function takes `run_dir`, it is a run directory (its checkpoints in `checkpoints/`) or an
`Elsewhere` (the checkpoints in that directory itself).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ratrain.checkpoint import manifest
from ratrain.checkpoint.store import optim_file, outer_file, read_unit, weights_file, write_unit
from ratrain.errors import RunFailure, UserError

__all__ = ["CheckpointDamaged", "CheckpointWriteError", "Elsewhere", "checkpoint_dir", "complete_dirs",
           "finalize", "latest", "load_meta", "load_units", "missing_units", "remove_partials", "root",
           "save_units", "scan", "units_problem"]


@dataclass(frozen=True)
class Elsewhere:
    """Checkpoints kept in `path` itself (--checkpoint-dir), not in a run directory's
    checkpoints/."""

    path: Path


def root(run_dir: Path | Elsewhere) -> Path:
    """The directory that holds the step_N/ directories."""
    return Path(run_dir.path) if isinstance(run_dir, Elsewhere) else Path(run_dir) / "checkpoints"


class CheckpointDamaged(UserError):
    """A checkpoint that does not verify was asked for by name (exit code 2)."""


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (a full disk); the earlier ones are untouched.
    `failed_at`: when the write failed, before the partial directory was removed. The launcher
    reports the earliest failure, and removing the directory fails the other ranks' writes
    (no such file): their reports must not come first."""

    def __init__(self, message: str, failed_at: float):
        super().__init__(message)
        self.failed_at = failed_at


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return root(run_dir) / f"step_{step:06d}"


def _partial(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir, step).with_suffix(".partial")


def step_of(ckpt: Path) -> int:
    """The step of a checkpoint directory `step_N`."""
    return int(ckpt.name[5:])


def complete_dirs(run_dir: Path) -> list[Path]:
    """The checkpoint directories that finished saving (verified or not), oldest first."""
    found = [p for p in root(run_dir).glob("step_*")
             if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=step_of)


def save_units(run_dir: Path, step: int, states: Mapping[int, dict] | Iterable[tuple[int, dict]],
               replica: int = 0, outer: bool = True) -> dict[str, dict]:
    """Write this process's units (a mapping, or (unit, state) pairs made as they are read)
    into the partial directory of `step`, with their --sync diloco outer states where `outer`;
    returns their files' manifest entries. On failure (a full disk) the partial directory is
    removed."""
    partial = _partial(run_dir, step)
    try:
        partial.mkdir(parents=True, exist_ok=True)
        files = {}
        for unit, state in (states.items() if isinstance(states, Mapping) else states):
            files.update(write_unit(partial, unit, state, replica, outer))
        return files
    except OSError as e:
        raise _write_failed(run_dir, step, e) from None


def finalize(run_dir: Path, step: int, meta: dict, files: dict[str, dict], keep: int) -> Path:
    """Called once, after every process has saved its units: write the manifest (`meta` plus
    `files`), mark the checkpoint complete, keep it and the newest `keep` - 1 others that are
    whole (manifest.problem unhashed: a damaged one neither counts nor stays: kept, it could
    leave a run whose newest checkpoint was damaged with no other to fall back to)."""
    final = checkpoint_dir(run_dir, step)
    partial = _partial(run_dir, step)
    try:
        manifest.write(partial, {**meta, "step": step, "files": files})
        if final.exists():  # saved again after a resume from an earlier step: the old one lost
            shutil.rmtree(final)
        partial.rename(final)
        manifest.sync_dir(final.parent)
    except OSError as e:
        raise _write_failed(run_dir, step, e) from None
    others = [c for c in complete_dirs(run_dir) if c != final]
    whole = [c for c in others if manifest.problem(c, hashed=False) is None]
    # (a negative start would slice from the end: keep 4 with two others kept one)
    kept = set(whole[max(0, len(whole) - keep + 1):]) if keep > 1 else set()
    for old in others:
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)
    remove_partials(run_dir, before=step)  # a later save may be under way on another rank
    return final


def what_is_kept(checkpoints, run_dir: Path | None = None) -> str:
    """What a run that ends early can go on from, in the words its error ends with: the newest
    complete checkpoint in `checkpoints` (and how to go on, where `run_dir` names the run), or
    that there is none. One wording for a failed save, a failed write of the run directory and
    a Ctrl-C or SIGTERM (until 2026-12-03 three: "the earlier ones are intact", "the
    checkpoints are intact (the newest: ...)", "the newest checkpoint it completed is ...")."""
    done = complete_dirs(checkpoints)
    if not done:
        return "there is no checkpoint to resume from"
    return (f"the newest complete checkpoint is {done[-1].name}"
            + (f" (continue with --resume {run_dir})" if run_dir is not None else ""))


def _write_failed(run_dir: Path, step: int, e: OSError) -> CheckpointWriteError:
    failed_at = time.time()
    shutil.rmtree(_partial(run_dir, step), ignore_errors=True)
    return CheckpointWriteError(
        f"could not write checkpoint step_{step:06d} in {root(run_dir)}: "
        f"{e.strerror or e}; the partial checkpoint was removed, {what_is_kept(run_dir)}",
        failed_at)


def remove_partials(run_dir: Path, before: int | None = None) -> None:
    """Remove what saves that never finished left behind (no run reads them); with `before`,
    only those of earlier steps."""
    for partial in root(run_dir).glob("step_*.partial"):
        step = partial.name[5:].removesuffix(".partial")
        if before is None or (step.isdigit() and int(step) < before):
            shutil.rmtree(partial, ignore_errors=True)


def scan(run_dir: Path, hashed: bool = True) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies (None if none does), and each newer one that does
    not, with what is wrong with it. `hashed` False: each file there at its size, none read."""
    skipped = []
    for ckpt in reversed(complete_dirs(run_dir)):
        wrong = manifest.problem(ckpt, hashed)
        if wrong is None:
            return ckpt, skipped
        skipped.append((ckpt, wrong))
    return None, skipped


def latest(run_dir: Path) -> Path | None:
    """The newest checkpoint that verifies."""
    return scan(run_dir)[0]


def load_meta(ckpt: Path) -> dict:
    """The checkpoint's manifest: step, config, plan, loader and generator states, files."""
    meta, wrong = manifest.read(ckpt)
    if wrong:
        raise CheckpointDamaged(f"checkpoint {ckpt}: {wrong}")
    return meta


def load_units(ckpt: Path, units, device: torch.device | str, replica: int = 0,
               optimizer: bool = True, verified: bool = False) -> "UnitStates":
    """The states of `units` (of a --sync diloco checkpoint, `replica`'s, whose files it saved
    under its index; a synchronous one holds replica 0's only), every file to be read checked
    against the manifest before any is read; each unit's read onto `device` when it is asked
    for (UnitStates). `optimizer`: False
    leaves the AdamW states unread (None) and unchecked. `verified`: the caller has checked
    the whole checkpoint already (scan, as run_checkpoints.resume_point does), so its files are checked
    at their sizes, not hashed again (81 GB at llama2-7b: about 80 s a pass at 1 GB/s)."""
    meta = load_meta(ckpt)
    wrong = units_problem(ckpt, units, replica, optimizer, hashed=not verified, meta=meta)
    if wrong:
        raise CheckpointDamaged(wrong)
    files = meta["files"]
    owner = _owner(meta, replica)
    own = {u: owner for u in units}
    if not optimizer:
        unread = {optim_file(u, r) for u, r in own.items()}
        files = {name: entry for name, entry in files.items() if name not in unread}
    return UnitStates(Path(ckpt), files, own, torch.device(device))


def units_problem(ckpt: Path, units, replica: int = 0, optimizer: bool = True,
                  hashed: bool = True, meta: dict | None = None) -> str | None:
    """What keeps `units` from loading as load_units reads them (a unit the checkpoint does not
    hold, a file of theirs missing, cut short or altered; `hashed` False: their sizes only),
    or None (`meta`: the manifest, where read already)."""
    meta = meta or load_meta(ckpt)
    missing = missing_units(ckpt, units, replica, meta)
    if missing:
        return _missing_text(ckpt, meta, missing)
    files, r = meta["files"], _owner(meta, replica)
    for u in units:
        for name in (weights_file(u, r), *([optim_file(u, r)] if optimizer else []), outer_file(u)):
            wrong = name in files and manifest.file_problem(ckpt, name, files[name], hashed)
            if wrong:
                return f"checkpoint {ckpt}: {wrong}"
    return None


def missing_units(ckpt: Path, units, replica: int = 0, meta: dict | None = None) -> list[int]:
    """The units of `units` whose weights the checkpoint does not hold, `replica`'s (of a
    synchronous checkpoint, replica 0's) (`meta`: its manifest, where read already)."""
    meta = meta or load_meta(ckpt)
    owner = _owner(meta, replica)
    return [u for u in units if weights_file(u, owner) not in meta["files"]]


def _owner(meta: dict, replica: int) -> int:
    """Whose files a replica's units are: under --sync diloco each replica (island) saved its
    own; a synchronous run saved replica 0's only. One node's part of a DiLoCo checkpoint lacks
    the other nodes' replicas: no falling back to replica 0's, whose weights differ."""
    sync = meta.get("config", {}).get("parallel", {}).get("sync", "step")
    return replica if sync != "step" else 0


def _missing_text(ckpt: Path, meta: dict, missing: list[int]) -> str:
    units = f"unit{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
    if "ranks" not in meta:
        return f"checkpoint {ckpt} has no {units}: was it saved from another model?"
    saved = meta["config"]["parallel"]
    return (f"checkpoint {ckpt} is one node's part (ranks {', '.join(map(str, meta['ranks']))}: "
            f"the nodes did not share the checkpoint directory) and has no {units}: node-local "
            f"checkpoints resume with the layout they were saved with (--pp {saved['pp']} --dp "
            f"{saved['dp']}, rank order {saved['rank_order']}) and the same ranks on each node; "
            f"`ratrain merge-parts` makes the nodes' parts one checkpoint, which any layout "
            f"resumes and `export` reads")


class UnitStates(Mapping):
    """Verified units' states by unit, each read from its files when asked for and not kept:
    a caller that takes one unit at a time holds one unit's state. (A resume read every
    unit's onto the stage's device at once: 81 GB at llama2-7b, however small the run's GPU
    budget; an export read the AdamW states it does not write.)"""

    def __init__(self, ckpt: Path, files: dict, own: dict[int, int], device: torch.device):
        self.ckpt, self.files, self.own, self.device = ckpt, files, own, device

    def __getitem__(self, u: int) -> dict:
        if u not in self.own:
            raise KeyError(u)
        return read_unit(self.ckpt, u, self.files, self.device, self.own[u])

    def __iter__(self):
        return iter(self.own)

    def __len__(self) -> int:
        return len(self.own)
