"""The run directory: made fresh, checked before a run starts, and where a resumed run goes on
from."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ratrain import checkpoint
from ratrain.config import RunConfig, TrainConfig
from ratrain.errors import UserError
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.training.disk_room import checkpoint_bytes, room_problem
from ratrain.training.metrics import read_metrics
from ratrain.training.resume_settings import refuse_another_runs
from ratrain.training.run_lock import (NEW_RUN_WAY_OUT, RESUME_WAY_OUT, checkpoint_dir_owner,
                                       claim_checkpoint_dir, lock_checkpoint_dir, lock_run_dir,
                                       refuse_another_runs_checkpoints)


@dataclass(frozen=True)
class RunDirectory:
    """A checked run directory: where the run writes, where its checkpoints go, and the
    checkpoint it resumes from (None for a new run)."""

    path: Path
    checkpoints: Path | checkpoint.Elsewhere
    resume_from: Path | None


def open_run_dir(run_dir: str | Path | None, cfg: RunConfig, resume: bool = False) -> RunDirectory:
    """The run directory `run_dir` (a fresh one under runs/ when None), once it and the
    checkpoint directory are checked (check_run_dir) and, with `resume`, the checkpoint to go on
    from is found (resume_point). Nothing is made until every check has passed."""
    if run_dir:  # before the checks read what another run may be writing (if it is there)
        lock_run_dir(Path(run_dir), RESUME_WAY_OUT if resume else NEW_RUN_WAY_OUT)
    _take_checkpoint_dir(Path(run_dir or "runs"), cfg, made=False)
    check_run_dir(Path(run_dir) if run_dir else Path("runs"), cfg, resume)
    ckpt = resume_point(Path(run_dir), cfg) if resume else None
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


def checkpoints_of(run_dir: Path, cfg: RunConfig) -> Path | checkpoint.Elsewhere:
    """Where the run's checkpoints are, as the checkpoint functions take it: the run directory
    (its checkpoints/), or train.checkpoint_dir."""
    return checkpoint.Elsewhere(Path(cfg.train.checkpoint_dir)) if cfg.train.checkpoint_dir else run_dir


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


RESUME_AGAIN = "resume with --checkpoint-dir DIR"


def checkpoints_gone(run_dir: Path, way_out: str = RESUME_AGAIN) -> str | None:
    """Where the run's checkpoint directory, as its config.yaml names it, does not exist though
    its metrics.jsonl shows it reached a save: the line that says it was moved or deleted
    (`way_out`: how to say where it is now). None for a run yet to save there."""
    saved = _saved_train(run_dir)
    return None if saved is None else _gone(run_dir, saved, way_out)


def own_checkpoints(run_dir: Path) -> Path | checkpoint.Elsewhere | None:
    """Where the run's config.yaml says its checkpoints are (None: no config.yaml)."""
    saved = _saved_train(run_dir)
    return None if saved is None else checkpoints_of(run_dir, RunConfig(train=saved))


def _saved_train(run_dir: Path) -> TrainConfig | None:
    try:
        return RunConfig.load(run_dir / "config.yaml").train
    except (UserError, OSError):
        return None


def _gone(run_dir: Path, saved: TrainConfig, way_out: str) -> str | None:
    where = checkpoint.root(checkpoints_of(run_dir, RunConfig(train=saved)))
    if where.exists() or not saved.checkpoints:
        return None
    reached = _reached(run_dir)
    if reached < min(saved.checkpoint_every or saved.steps, saved.steps):
        return None
    named = " (config.yaml's train.checkpoint_dir)" if saved.checkpoint_dir else ""
    return (f"the run's checkpoint directory {where}{named} does not exist (moved or deleted?), "
            f"though the run reached step {reached}; {way_out} to say where it is now")


# --resume auto starts from step 0 where no metrics.jsonl records steps; --resume RUN never does
START_OVER_AUTO = "remove {run_dir}/metrics.jsonl first (or choose another --run-dir)"
START_OVER = ("remove {run_dir}/metrics.jsonl and train with --resume auto --run-dir {run_dir} "
              "(or start a new run in another --run-dir)")


def checkpoints_lost(run_dir: Path, start_over: str = START_OVER) -> str | None:
    """Where the run's checkpoint directory, as its config.yaml names it, is there but holds
    no checkpoint, though its metrics.jsonl shows it passed two save points or more (at one, the
    save may have died being written): the line that says so, and `start_over`. None otherwise."""
    saved = _saved_train(run_dir)
    if saved is None or not saved.checkpoints:
        return None
    own = checkpoints_of(run_dir, RunConfig(train=saved))
    reached = _reached(run_dir)
    every = saved.checkpoint_every or saved.steps
    saves = [*range(every, min(reached, saved.steps) + 1, every)]
    if reached >= saved.steps and saved.steps not in saves:
        saves.append(saved.steps)
    if len(saves) < 2 or checkpoint.complete_dirs(own):
        return None
    return (f"no checkpoint in {checkpoint.root(own)}, though {run_dir}/metrics.jsonl shows the "
            f"run reached step {reached}, past {len(saves)} of its save points (the last at step "
            f"{saves[-1]}): its checkpoints were moved or deleted, and starting over would "
            f"overwrite its metrics. Pass --checkpoint-dir DIR where they are now; to start the "
            f"run over, {start_over.format(run_dir=run_dir)}")


def _reached(run_dir: Path) -> int:
    """The last step the run's metrics.jsonl records (0: none)."""
    log = run_dir / "metrics.jsonl"
    return max((r["step"] for r in read_metrics(log)), default=0) if log.is_file() else 0


def _why_none(run_dir: Path, where: Path, way_out: str) -> str:
    """Why a run has no checkpoint to resume from, neither in `where` (cfg's checkpoint
    directory) nor in the one its config.yaml names, as far as its files say."""
    saved = _saved_train(run_dir)
    if saved is None:
        return f"no checkpoint in {where}"
    if not saved.checkpoints:
        return f"no checkpoint in {where}: the run was started with --no-checkpoints and saved none"
    own = checkpoint.root(checkpoints_of(run_dir, RunConfig(train=saved)))
    why = _gone(run_dir, saved, way_out) or checkpoints_lost(run_dir) or _none_saved(
        run_dir, saved, own)
    if own == where:
        return why
    return (f"--checkpoint-dir {where} does not exist" if not where.exists() else
            f"no checkpoint in --checkpoint-dir {where}") + f", and {why}"


def _none_saved(run_dir: Path, saved: TrainConfig, own: Path) -> str:
    """No checkpoint in `own`, and no metrics.jsonl says a save point was reached (its
    summary.json may: a metrics.jsonl removed)."""
    every = saved.checkpoint_every
    when = ("every step and " if every == 1 else f"every {every} steps and " if every else "")
    try:
        summed = json.loads((run_dir / "summary.json").read_text()).get("steps") or 0
    except (OSError, ValueError, AttributeError):
        summed = 0
    if summed < min(every or saved.steps, saved.steps):
        return (f"no checkpoint in {own}: the run saves one {when}at its end, and had not "
                "reached one")
    return (f"no checkpoint in {own}, though {run_dir}/summary.json shows the run reached step "
            f"{summed} (it saves one {when}at its end): its checkpoints were moved or deleted. "
            f"Pass --checkpoint-dir DIR where they are now, or start a new run")


def resume_point(run_dir: Path, cfg: RunConfig, done_ok: bool = False,
                 way_out: str = RESUME_AGAIN) -> Path:
    """The newest checkpoint of `run_dir` that verifies, saying on stderr which newer ones it
    skips and why; a UserError if there is none, if it is of another model or run, or (unless
    `done_ok`) if the run already reached cfg.train.steps. A cfg.train.checkpoint_dir that
    holds none (a new one for the resumed run's checkpoints) is looked past, to where the
    run's config.yaml says its checkpoints are. `way_out`: how a moved directory is named.

    Under torchrun only rank 0 hashes the whole checkpoint (81 GB at llama2-7b: each of a
    node's 8 ranks read it all before); the others take the newest whose files are there at
    their sizes, and once the world is joined every rank resumes from rank 0's
    (agreed_plan.agreed_checkpoint), each hashing the files of its own units as it loads them."""
    checkpoints = checkpoints_of(run_dir, cfg)
    where = checkpoint.root(checkpoints)
    own = own_checkpoints(run_dir)
    main = int(os.environ.get("RANK", 0)) == 0
    if own is not None and checkpoint.root(own) != where and not checkpoint.complete_dirs(
            checkpoints) and checkpoint.complete_dirs(own):
        if main:
            print(f"--checkpoint-dir {where} holds no checkpoint: resuming from the run's own, "
                  f"in {checkpoint.root(own)}; the new ones go to {where}", file=sys.stderr)
        checkpoints = own
    if checkpoint.root(checkpoints) != checkpoint.root(run_dir):
        refuse_another_runs_checkpoints(run_dir, checkpoint.root(checkpoints))
    hashed = not under_torchrun() or main
    ckpt, skipped = checkpoint.scan(checkpoints, hashed)
    if ckpt is None:
        if skipped:
            raise checkpoint.CheckpointDamaged(
                f"no checkpoint in {checkpoint.root(checkpoints)} verifies: " + "; ".join(
                    f"{path.name}: {why}" for path, why in skipped))
        raise UserError(_why_none(run_dir, where, way_out))
    if main:
        for path, why in skipped:
            print(f"skipping checkpoint {path.name}: {why}; the newest that verifies is {ckpt.name}",
                  file=sys.stderr)
    meta = checkpoint.load_meta(ckpt)
    # settings: of a checkpoint elsewhere only (a --checkpoint-dir that holds another run's);
    # the run's own may resume with others through the Python API (lr 1e-30 in tests)
    elsewhere = own is not None and checkpoint.root(checkpoints) != checkpoint.root(own)
    refuse_another_runs(ckpt, meta, cfg, settings=elsewhere)
    # another node's part of node-local checkpoints (training/shared_dir.py) may be newer than
    # rank 0's, from which the run resumes: rank 0 says whether the run is done
    others_part = 0 not in meta.get("ranks", [0])
    if not done_ok and not others_part and meta["step"] >= cfg.train.steps:
        raise UserError(f"{run_dir} already reached step {meta['step']}; "
                        f"pass --steps N with N > {meta['step']} to train further")
    return ckpt


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
