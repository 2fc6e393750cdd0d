"""Where a run's checkpoints are, the checkpoint a resumed run goes on from (the newest that
verifies), and, where there is none, why: moved, deleted, never saved. The run directory itself
(made, checked, its files kept for a failed resume) is run_dir.py's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ratrain import checkpoint
from ratrain.config import RunConfig, TrainConfig
from ratrain.errors import UserError
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.training.metrics import read_metrics
from ratrain.training.resume_settings import refuse_another_runs
from ratrain.training.run_lock import refuse_another_runs_checkpoints

def checkpoints_of(run_dir: Path, cfg: RunConfig) -> Path | checkpoint.Elsewhere:
    """Where the run's checkpoints are, as the checkpoint functions take it: the run directory
    (its checkpoints/), or train.checkpoint_dir."""
    return checkpoint.Elsewhere(Path(cfg.train.checkpoint_dir)) if cfg.train.checkpoint_dir else run_dir

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
    """Two save points passed, as checkpoints_lost asks: at one, a stop may have come before
    the save made the directory (as its state was taken), and until 2026-12-04 such a run
    could never be resumed, nor started over by --resume auto."""
    where = checkpoint.root(checkpoints_of(run_dir, RunConfig(train=saved)))
    if where.exists() or not saved.checkpoints:
        return None
    reached, saves = _save_points(run_dir, saved)
    if len(saves) < 2:
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
    reached, saves = _save_points(run_dir, saved)
    if len(saves) < 2 or checkpoint.complete_dirs(own):
        return None
    return (f"no checkpoint in {checkpoint.root(own)}, though {run_dir}/metrics.jsonl shows the "
            f"run reached step {reached}, past {len(saves)} of its save points (the last at step "
            f"{saves[-1]}): its checkpoints were moved or deleted, and starting over would "
            f"overwrite its metrics. Pass --checkpoint-dir DIR where they are now; to start the "
            f"run over, {start_over.format(run_dir=run_dir)}")


def _save_points(run_dir: Path, saved: TrainConfig) -> tuple[int, list[int]]:
    """The last step the run's metrics.jsonl records (0: none), and the save points up to it
    (its end's, where it got there)."""
    reached = _reached(run_dir)
    every = saved.checkpoint_every or saved.steps
    saves = [*range(every, min(reached, saved.steps) + 1, every)]
    if reached >= saved.steps and saved.steps not in saves:
        saves.append(saved.steps)
    return reached, saves


def _reached(run_dir: Path) -> int:
    """The last step the run's metrics.jsonl records (0: none)."""
    log = run_dir / "metrics.jsonl"
    return max((r["step"] for r in read_metrics(log)), default=0) if log.is_file() else 0


def _summed(run_dir: Path) -> int:
    """The step the run's summary.json records (0: none)."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("steps") or 0
    except (OSError, ValueError, AttributeError):
        return 0


def summed_up_at(run_dir: Path) -> int | None:
    """The step at which the run's last part reached its end: its summary.json's, written only
    there (and removed as a part starts), where its metrics.jsonl ends at that step too; None
    otherwise."""
    summed = _summed(run_dir)
    return summed if summed and _reached(run_dir) == summed else None


def finished_at(run_dir: Path, *checkpoints) -> int | None:
    """The step the run's last part trained to its end, saving no checkpoint there
    (--no-checkpoints; its newest may be --checkpoint-on-interrupt's): its summary.json's,
    written only at the end (and removed as a part starts), where its metrics.jsonl ends at
    that step too (removed: the run is to start over, START_OVER). None otherwise: where the
    part saved checkpoints (its end's missing or damaged is trained again from an older one,
    as a node's lost part is), and where `checkpoints` (where the run's are; None: nowhere)
    hold one of that step or later, verified or not (the checkpoints decide: resume_point).
    By the checkpoints alone --resume auto took such a finished run for one to go on, and
    trained it again (until 2026-12-04)."""
    summed, saved = summed_up_at(run_dir), _saved_train(run_dir)
    if summed is None or saved is None or saved.checkpoints:
        return None
    ends = [checkpoint.step_of(c) for where in checkpoints if where is not None
            for c in checkpoint.complete_dirs(where)]
    return None if any(step >= summed for step in ends) else summed


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
    """No checkpoint in `own`, and no metrics.jsonl says two save points were passed (its
    summary.json may say the run's end save was made: a metrics.jsonl removed). One passed is
    no save made: a stop may have dropped it (until 2026-12-04 said "had not reached one")."""
    every = saved.checkpoint_every
    when = ("every step and " if every == 1 else f"every {every} steps and " if every else "")
    summed = _summed(run_dir)
    first = min(every or saved.steps, saved.steps)
    if summed < first:
        reached, saves = _save_points(run_dir, saved)
        if not saves:
            return (f"no checkpoint in {own}: the run saves one {when}at its end, and had not "
                    "reached one")
        return (f"no checkpoint in {own}: the run saves one {when}at its end, and its first "
                f"save (step {saves[0]}) was not made before it stopped at step {reached}; "
                f"--resume auto --run-dir {run_dir} starts it over")
    return (f"no checkpoint in {own}, though {run_dir}/summary.json shows the run reached step "
            f"{summed} (it saves one {when}at its end): its checkpoints were moved or deleted. "
            f"Pass --checkpoint-dir DIR where they are now, or start a new run")


def resume_point(run_dir: Path, cfg: RunConfig, done_ok: bool = False,
                 way_out: str = RESUME_AGAIN, chosen: Path | None = None) -> Path:
    """The newest checkpoint of `run_dir` that verifies, saying on stderr which newer ones it
    skips and why; a UserError if there is none, if it is of another model or run, or (unless
    `done_ok`) RunFinished if the run already reached cfg.train.steps (its checkpoint's step,
    or its summary.json's: finished_at). A cfg.train.checkpoint_dir that holds none (a new one
    for the resumed run's checkpoints) is looked past, to where the run's config.yaml says its
    checkpoints are. `way_out`: how a moved directory is named.

    Under torchrun only rank 0 hashes the whole checkpoint (81 GB at llama2-7b: each of a
    node's 8 ranks read it all before); the others take the newest whose files are there at
    their sizes, and once the world is joined every rank resumes from rank 0's
    (agreed_plan.agreed_checkpoint), each hashing the files of its own units as it loads them.
    So rank 0 alone raises RunFinished, and its RunFinished stops the others as they join
    (process_groups.stop_together): the newest at its sizes may be a final checkpoint that does
    not verify, and a rank that ended on it left rank 0 waiting --comm-timeout (until
    2026-12-03) to resume from an older one.

    `chosen`: this answer, found by an earlier call in this process (--resume auto's, which
    asks before the run whether it is finished): taken, its checks made again, nothing hashed
    or said again (until 2026-12-03 the run hashed its checkpoints again: 81 GB at llama2-7b,
    minutes, each skip said twice)."""
    checkpoints = checkpoints_of(run_dir, cfg)
    where = checkpoint.root(checkpoints)
    own = own_checkpoints(run_dir)
    main = int(os.environ.get("RANK", 0)) == 0
    decides = not under_torchrun() or main
    done = finished_at(run_dir, checkpoints, own)  # (its newest checkpoint older, or none)
    if not done_ok and decides and done is not None and done >= cfg.train.steps:
        raise RunFinished(run_dir, done, cfg.train.steps)
    looked_past = None
    if own is not None and checkpoint.root(own) != where and not checkpoint.complete_dirs(
            checkpoints) and checkpoint.complete_dirs(own):
        looked_past = (f"--checkpoint-dir {where} holds no checkpoint: resuming from the run's "
                       f"own, in {checkpoint.root(own)}; the new ones go to {where}")
        checkpoints = own
    if checkpoint.root(checkpoints) != checkpoint.root(run_dir):
        refuse_another_runs_checkpoints(run_dir, checkpoint.root(checkpoints))
    for scans_left in reversed(range(3)):  # a few: each scan hashes the whole checkpoint
        ckpt, skipped = ((chosen, []) if chosen is not None else
                         checkpoint.scan(checkpoints, hashed=decides))
        try:
            meta = None if ckpt is None else checkpoint.load_meta(ckpt)
        except checkpoint.CheckpointDamaged:
            if chosen is not None:
                raise
        else:  # none found, for the newer ones skipped were removed while hashed: scan again
            if ckpt is not None or chosen is not None or all(p.exists() for p, _ in skipped):
                break
        # the scan verified it, so it changed since: a run training in this directory whose
        # keep-K removed it (an export beside the run blamed the save until 2026-12-03)
        if not scans_left:
            raise UserError(f"checkpoint {ckpt or skipped[0][0]} was removed while being read "
                            f"(a run training in {run_dir} rotates its checkpoints): try again, "
                            "or once the run has stopped") from None
    if main and chosen is None and looked_past:
        print(looked_past, file=sys.stderr)
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
    # settings: of a checkpoint elsewhere only (a --checkpoint-dir that holds another run's);
    # the run's own may resume with others through the Python API (lr 1e-30 in tests)
    elsewhere = own is not None and checkpoint.root(checkpoints) != checkpoint.root(own)
    refuse_another_runs(ckpt, meta, cfg, settings=elsewhere)
    # another node's part of node-local checkpoints (training/shared_dir.py) may be newer than
    # rank 0's, from which the run resumes: rank 0's part says whether the run is done
    others_part = 0 not in meta.get("ranks", [0])
    if not done_ok and decides and not others_part and meta["step"] >= cfg.train.steps:
        raise RunFinished(run_dir, meta["step"], cfg.train.steps)
    return ckpt


class RunFinished(UserError):
    """A resume of a run that has trained all its steps: nothing to train. (`ratrain train
    --resume auto` says it and exits 0, cli/train_resume.py: a preemptible job's restart loop
    reruns the command after the run finished.)"""

    def __init__(self, run_dir: Path, step: int, steps: int):
        at = (f"finished at step {step:,} of {steps:,}" if step == steps else
              f"is at step {step:,}, past --steps {steps:,}")
        super().__init__(f"{run_dir} {at}: nothing to train (pass --steps N with N > {step} "
                         "to train further)")
        self.step, self.steps = step, steps
