"""The run directory: made fresh or opened for a resume, checked before a run starts, and the
files a resumed run that fails before its first step puts back. Where its checkpoints are and
which one a resume goes on from is run_checkpoints.py's (checkpoints_of and resume_point are
importable from here too: cli/tools_cmd.py, run.py and loop.py import them from here)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.training.disk_room import checkpoint_bytes, room_problem
from ratrain.training.metrics import read_metrics
from ratrain.training.run_checkpoints import checkpoints_of, resume_point
from ratrain.training.run_lock import (NEW_RUN_WAY_OUT, RESUME_WAY_OUT, checkpoint_dir_owner,
                                       claim_checkpoint_dir, lock_checkpoint_dir, lock_run_dir)

__all__ = ["KeptFiles", "RunDirectory", "check_run_dir", "checkpoints_of", "kept_files",
           "new_run_dir", "open_run_dir", "refuse_a_taken_run_dir", "resume_point",
           "saves_checkpoints"]


@dataclass(frozen=True)
class RunDirectory:
    """A checked run directory: where the run writes, where its checkpoints go, and the
    checkpoint it resumes from (None for a new run)."""

    path: Path
    checkpoints: Path | checkpoint.Elsewhere
    resume_from: Path | None


def open_run_dir(run_dir: str | Path | None, cfg: RunConfig, resume: bool = False,
                 chosen: Path | None = None) -> RunDirectory:
    """The run directory `run_dir` (a fresh one under runs/ when None), once it and the
    checkpoint directory are checked (check_run_dir) and, with `resume`, the checkpoint to go on
    from is found (resume_point; `chosen`: where the caller has found it already). Nothing is
    made until every check has passed."""
    if run_dir:  # before the checks read what another run may be writing (if it is there)
        lock_run_dir(Path(run_dir), RESUME_WAY_OUT if resume else NEW_RUN_WAY_OUT)
    _take_checkpoint_dir(Path(run_dir or "runs"), cfg, made=False)
    check_run_dir(Path(run_dir) if run_dir else Path("runs"), cfg, resume)
    ckpt = resume_point(Path(run_dir), cfg, chosen=chosen) if resume else None
    path = Path(run_dir) if run_dir else new_run_dir("runs", cfg.model.name)
    path.mkdir(parents=True, exist_ok=True)
    lock_run_dir(path)
    _take_checkpoint_dir(path, cfg, made=True)
    return RunDirectory(path, checkpoints_of(path, cfg), ckpt)


def _take_checkpoint_dir(run_dir: Path, cfg: RunConfig, made: bool) -> None:
    """Hold the run's --checkpoint-dir as its run directory is held: two runs of other run
    directories wrote their checkpoints into one among each other's. Before the checks where it
    exists already (`made` False: nothing is made until they pass); then made, held, and
    recorded as this run's."""
    if not cfg.train.checkpoint_dir or not saves_checkpoints(cfg):
        return
    directory = Path(cfg.train.checkpoint_dir)
    if made:
        directory.mkdir(parents=True, exist_ok=True)
    lock_checkpoint_dir(directory, run_dir)
    if made:
        claim_checkpoint_dir(directory, run_dir)


def refuse_a_taken_run_dir(run_dir: Path) -> None:
    """A new run does not go into a directory that holds a run: it would rewrite its
    config.yaml and metrics.jsonl, its keep-K would remove the run's checkpoints, and a later
    resume would mix the two. (Not for --resume auto's start: a job that died before its
    first checkpoint starts over there.)"""
    lock_run_dir(run_dir)  # a run under way there is said to be one
    held = checkpoint.complete_dirs(run_dir)
    log = run_dir / "metrics.jsonl"
    steps = [r["step"] for r in read_metrics(log)] if log.is_file() else []
    if not held and not steps:
        return
    what = (f"its checkpoints ({held[-1].name})" if held else
            f"the metrics of a run that reached step {max(steps)}")
    raise UserError(f"run directory {run_dir} holds a run already ({what}); continue it with "
                    f"--resume {run_dir} (or --resume auto --run-dir {run_dir}), or choose "
                    "another --run-dir")


def new_run_dir(base: str | Path, model_name: str) -> Path:
    """A fresh run directory under `base`, with `base/latest` pointing at it."""
    base = Path(base)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = base / f"{stamp}-{model_name}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = base / f"{stamp}-{model_name}-{suffix}"
    run_dir.mkdir(parents=True)
    link = base / "latest"
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(run_dir.name)
    return run_dir


def saves_checkpoints(cfg: RunConfig) -> bool:
    """Whether the run may write a checkpoint: on a schedule, or on Ctrl-C."""
    return cfg.train.checkpoints or cfg.train.checkpoint_on_interrupt


def check_run_dir(run_dir: Path, cfg: RunConfig, resume: bool = False) -> None:
    """The run directory can be made and written; where the run saves checkpoints, their
    directory too, and its filesystem has room for one. A new run does not take a
    --checkpoint-dir that holds checkpoints already (keeping the newest K would remove them)."""
    existing = _writable(run_dir, "run directory")
    if not saves_checkpoints(cfg):
        return
    where, name = run_dir, run_dir
    if cfg.train.checkpoint_dir:
        where, name = _writable(cfg.train.checkpoint_dir, "checkpoint directory"), cfg.train.checkpoint_dir
        found = checkpoint.complete_dirs(checkpoint.Elsewhere(Path(name)))
        if found and not resume:
            owner = checkpoint_dir_owner(Path(name)) or "RUN"
            raise UserError(f"checkpoint directory {name} holds checkpoints already ({found[-1].name}); "
                            f"continue that run with --resume {owner}, or choose another directory")
    else:
        where = existing
    if under_torchrun():  # once the ranks know who shares a directory (disk_room.py)
        return
    problem = room_problem(cfg, checkpoints_of(run_dir, cfg), where, name, resume,
                           checkpoint_bytes(cfg))
    if problem:
        raise UserError(problem)


def _writable(directory: str | Path, what: str) -> Path:
    """The nearest existing directory at or above `directory`, which must be writable."""
    existing = Path(directory).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"cannot make {what} {directory}: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise UserError(f"{what} {directory} is not writable: {e.strerror or e}") from None
    return existing


@dataclass
class KeptFiles:
    """The files a resumed run rewrites or removes at its start (its config, plan and the
    earlier part's summary and trace), kept to be put back where it fails before training a
    step: its settings were never used, and the next attempt would take them up from
    config.yaml."""

    run_dir: Path
    contents: dict[str, bytes]

    def restore_unless_stepped(self, resumed_at: int) -> None:
        log = self.run_dir / "metrics.jsonl"
        if log.exists() and any(r["step"] > resumed_at for r in read_metrics(log)):
            return
        for name in RESTARTED:
            (self.run_dir / name).unlink(missing_ok=True)
        for name, data in self.contents.items():
            (self.run_dir / name).write_bytes(data)


RESTARTED = ("config.yaml", "plan.json", "summary.json", "trace.json")


def kept_files(run_dir: Path) -> KeptFiles:
    return KeptFiles(run_dir, {n: (run_dir / n).read_bytes() for n in RESTARTED
                               if (run_dir / n).exists()})
