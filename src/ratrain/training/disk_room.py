"""Whether the checkpoint directory's filesystem has room for the checkpoints a run keeps there
at once. A run on one machine is checked before any process starts (run_dir.check_run_dir).
Under torchrun the ranks are checked together once they know which of them share a directory
(shared_dir.py): each directory is asked for what it will hold (a node-local part: its ranks'
units, not the whole checkpoint: a node of a two-site --sync diloco run at dp 2 holds 20 bytes
a parameter, not 32), and a disk without room stops every rank at once, not one node while the
others wait out --comm-timeout to join it."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.models.params import count_params, unit_param_counts
from ratrain.byte_units import decimal_bytes
from ratrain.runtime import timed_comm
from ratrain.schedule.grid import RankGrid


def checkpoint_bytes(cfg: RunConfig) -> int:
    """About what one checkpoint takes on disk: fp32 weights and AdamW's two fp32 moments;
    under --sync diloco every island's (replica's: their local weights differ), and the outer
    parameters and momentum once."""
    n = count_params(cfg.model)
    if not cfg.parallel.diloco:
        return 12 * n
    return 12 * n * (cfg.parallel.dp // cfg.parallel.island_size) + 8 * n


def part_bytes(cfg: RunConfig, grid: RankGrid, stage_units: list[range], ranks) -> int:
    """About what `ranks`' part of a checkpoint takes: each of their stages' units once (under
    --sync diloco once per island among them, and the outer state once)."""
    counts = unit_param_counts(cfg.model)
    total = 0
    for stage in {grid.coords(r)[0] for r in ranks}:
        n = sum(counts[u] for u in stage_units[stage])
        islands = len({cfg.parallel.files_of(replica) for s, replica in map(grid.coords, ranks)
                       if s == stage})
        total += (12 * islands + 8) * n if cfg.parallel.diloco else 12 * n
    return total


def checkpoints_at_once(cfg: RunConfig, start: int = 0, existing: int = 0) -> int:
    """How many checkpoints' room the run needs beyond what its directory holds: while one is
    written the newest --keep-checkpoints stay, so up to keep + 1 are on disk at once, or as
    many as there will be (`existing` already there, this run's saves from step `start`)."""
    t = cfg.train
    if not t.checkpoints:
        return 1  # (only Ctrl-C's, --checkpoint-on-interrupt)
    every = t.checkpoint_every
    saves = (t.steps // every - start // every + (t.steps % every != 0)) if every else 1
    return max(1, min(t.keep_checkpoints + 1, existing + saves) - existing)


def room_problem(cfg: RunConfig, checkpoints: Path | checkpoint.Elsewhere, on: Path, name,
                 resume: bool, size: int, part: str = "") -> str | None:
    """Why the filesystem of `on` (the checkpoint directory, or its nearest existing parent)
    lacks room for the checkpoints the run keeps at once, `size` bytes each (`part`: whose part
    of one that is), counting those `checkpoints` holds already where it resumes; None if it
    has room. `name`: the directory as the user gave it."""
    there = checkpoint.complete_dirs(checkpoints) if resume else []
    start = checkpoint.step_of(there[-1]) if there else 0
    count = checkpoints_at_once(cfg, start, len(there))
    free = shutil.disk_usage(on).free
    if free >= count * size:
        return None
    what = f"a checkpoint of {cfg.model.name}{part}" + (
        (" (every island's weights and AdamW state, and the outer state)"
         if cfg.parallel.island_size > 1 else
         " (every replica's weights and AdamW state, and the outer state)")
        if cfg.parallel.diloco and not part else "")
    many = "" if count == 1 else (
        f" and this run needs room for {count} at once (the newest "
        f"{cfg.train.keep_checkpoints} kept while the next is written): "
        f"{decimal_bytes(count * size)}")
    fewer = count > 1 and cfg.train.keep_checkpoints > 1
    hints = (["--keep-checkpoints 1 keeps fewer"] if fewer else []) + [
        "--checkpoint-dir DIR saves elsewhere", "--no-checkpoints saves none"]
    # (in decimal units, as the planner's sizes and a disk's are written)
    return (f"not enough disk space for {name}: {decimal_bytes(free)} free, {what} takes about "
            f"{decimal_bytes(size)}{many} ({', '.join(hints)})")


def check_room_together(cfg: RunConfig, checkpoints: Path | checkpoint.Elsewhere, name,
                        share, grid: RankGrid, stage_units: list[range], rank: int,
                        resume: bool, device: torch.device) -> None:
    """Under torchrun, once the ranks know who shares the checkpoint directory (`share`, a
    shared_dir.DirectoryShare): each directory's publisher checks its room for what the
    directory will hold; a UserError on every rank where one lacks it. Collective."""
    problem = None
    if rank == share.publisher:  # (a shared directory's ranks are all: the whole checkpoint)
        part = (f" (the part of ranks {', '.join(map(str, share.ranks))}, whose directory it is)"
                if share.node_local else "")
        problem = room_problem(cfg, checkpoints, checkpoint.root(checkpoints), name, resume,
                               part_bytes(cfg, grid, stage_units, share.ranks), part)
    problems = timed_comm.all_gather_object(problem, cfg.parallel.comm_timeout_s,
                                            "start of training", "the disk check", device)
    said = next((p for p in problems if p), None)
    if said:
        raise UserError(said)
