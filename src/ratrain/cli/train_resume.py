"""What `ratrain train` checks of a run directory before a run goes on in it or starts there:
that --resume auto continues the run, that a --config given again is the run's, that a new run
does not take another's directory, that the paths a run reads name the same files
wherever it is resumed from; and checkpoint flags that would do nothing."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.run_config import run_config


def auto_resume(run_dir: Path, cfg: RunConfig) -> tuple[bool, Path | None]:
    """Whether --resume auto continues the run, and from which checkpoint where choosing it
    hashed them already: the run takes that one rather than hashing them again (81 GB at
    llama2-7b: until 2026-12-03 twice); None where the run chooses. It continues where cfg's
    checkpoint directory, or the one the run's config.yaml names, holds a checkpoint (a new
    --checkpoint-dir holds none yet: until 2026-11-30 the run started over, rewriting its
    metrics). Where its checkpoints are gone (moved, or their directory emptied), a UserError
    rather than a new run over its files; a start from step 0 is said (until 2026-12-02 it was
    silent). A --checkpoint-dir of another run's checkpoints is refused. A run that has
    trained all its steps ends the command, with exit 0 (_end_if_finished, _end_if_summed_up:
    by its summary.json, where its newest checkpoint is older or it has none)."""
    from ratrain import checkpoint
    from ratrain.training.run_checkpoints import (START_OVER_AUTO, checkpoints_gone,
                                                  checkpoints_lost, checkpoints_of,
                                                  own_checkpoints)
    from ratrain.training.run_lock import RESUME_WAY_OUT, lock_run_dir

    # a run under way there is refused before a start from step 0 is said (until 2026-12-02
    # the line came first, then the refusal)
    lock_run_dir(run_dir, RESUME_WAY_OUT)
    own, here = own_checkpoints(run_dir), checkpoints_of(run_dir, cfg)
    if checkpoint.complete_dirs(here):
        if isinstance(here, checkpoint.Elsewhere):
            _refuse_anothers(run_dir, here.path, own is None)
        return True, _end_if_finished(run_dir, cfg, here)
    if own is not None and checkpoint.complete_dirs(own):
        return True, _end_if_finished(run_dir, cfg, own)
    _end_if_summed_up(run_dir, cfg)  # (--no-checkpoints)
    gone = checkpoints_gone(run_dir) or checkpoints_lost(run_dir, START_OVER_AUTO)
    if gone:
        raise UserError(f"--resume auto: {gone}")
    if int(os.environ.get("RANK", 0)) == 0:
        looked = {checkpoint.root(here), *([checkpoint.root(own)] if own is not None else [])}
        print(f"--resume auto: no checkpoint in {' or '.join(map(str, sorted(looked)))}: "
              "starting the run from step 0", file=sys.stderr, flush=True)
    return False, None


def _end_if_finished(run_dir: Path, cfg: RunConfig, checkpoints) -> Path | None:
    """A run that has trained all its steps: said on one line, and the command ends with exit
    0, training nothing. A preemptible job reruns its command in a loop, the last time after
    the run finished: until 2026-12-03 that rerun failed (exit 2). Its settings are checked
    first (another command's are refused, finished or not); the resume's own choice of
    checkpoint (resume_point: hashed on rank 0, the damaged skipped) decides, and only where
    the newest whole one (at its sizes, unread) is at cfg.train.steps or past. A run that goes
    on (its newest did not verify) is handed the checkpoint chosen here (None where none was
    chosen: the run chooses as it opens its directory).

    Under torchrun rank 0 decides for every rank: only it hashes the checkpoint, and a final
    one that does not verify (at its sizes, its bytes altered) is skipped there alone; a rank
    that ended on it left rank 0 waiting --comm-timeout (until 2026-12-03). So every rank joins
    the world here and takes rank 0's step (agreed_plan.rank_0s), and they end, or go on to
    train, together. Not from a node's part of node-local checkpoints (training/shared_dir.py):
    another node's may be newer than rank 0's, which the run would resume from, and a node
    that ended alone would leave the others waiting for it; there rank 0 says it once the nodes
    meet, as an error (exit 2)."""
    from ratrain import checkpoint
    from ratrain.runtime.torchrun_env import under_torchrun
    from ratrain.training.run_checkpoints import resume_point

    newest = checkpoint.scan(checkpoints, hashed=False)[0]
    meta = checkpoint.load_meta(newest) if newest is not None else None
    if meta is None or meta["step"] < cfg.train.steps or "ranks" in meta:
        _end_if_summed_up(run_dir, cfg)
        return None
    check_same_run(cfg, run_dir)
    chosen = resume_point(run_dir, cfg, done_ok=True)
    step = checkpoint.load_meta(chosen)["step"]
    if under_torchrun():
        from ratrain.training.agreed_plan import rank_0s

        cfg.validate()  # the join takes --comm-timeout: a value out of range is refused first
        step = rank_0s(step, cfg)
    if step < cfg.train.steps:  # its newest checkpoint did not verify: it trains from an older
        return chosen
    _say_finished(run_dir, cfg, step)


def _end_if_summed_up(run_dir: Path, cfg: RunConfig) -> None:
    """A run whose summary.json says it trained all its steps (finished_at), its newest
    checkpoint older or none (--no-checkpoints, --checkpoint-on-interrupt's at a stop): the
    command ends as _end_if_finished ends it; until 2026-12-04 the run trained again, from that
    checkpoint or from step 0. Under torchrun rank 0 alone reads it (a node's own run
    directory holds none): its RunFinished, an error (exit 2), stops the others as they join,
    as a --resume RUN's does there."""
    from ratrain.runtime.torchrun_env import under_torchrun
    from ratrain.training.run_checkpoints import (RunFinished, checkpoints_of, finished_at,
                                                  own_checkpoints)

    done = finished_at(run_dir, checkpoints_of(run_dir, cfg), own_checkpoints(run_dir))
    if done is None or done < cfg.train.steps:
        return
    if under_torchrun() and int(os.environ.get("RANK", 0)) != 0:
        return
    check_same_run(cfg, run_dir)
    if under_torchrun():
        raise RunFinished(run_dir, done, cfg.train.steps)
    _say_finished(run_dir, cfg, done)


def _say_finished(run_dir: Path, cfg: RunConfig, step: int) -> None:
    """Say that the run finished at `step` (rank 0) and end the command, exit 0."""
    from ratrain.training.run_checkpoints import RunFinished
    from ratrain.training.run_lock import release_run_dirs

    if int(os.environ.get("RANK", 0)) == 0:
        print(f"--resume auto: {RunFinished(run_dir, step, cfg.train.steps)}", file=sys.stderr,
              flush=True)
    release_run_dirs()
    raise click.exceptions.Exit(0)


def _refuse_anothers(run_dir: Path, where: Path, no_run_here: bool) -> None:
    """--checkpoint-dir `where` holds checkpoints: refused where its record names another run,
    or where `run_dir` holds no run (`no_run_here`) they could be the checkpoints of."""
    from ratrain import checkpoint
    from ratrain.training.run_lock import refuse_another_runs_checkpoints

    refuse_another_runs_checkpoints(run_dir, where)
    if no_run_here:
        newest = checkpoint.complete_dirs(checkpoint.Elsewhere(where))[-1].name
        raise UserError(f"--resume auto: --checkpoint-dir {where} holds checkpoints ({newest}) "
                        f"and {run_dir} holds no run they could be of (no config.yaml): they are "
                        "another run's; continue that one with --resume RUN, or give this run "
                        "its own --checkpoint-dir")


def check_same_run(cfg: RunConfig, run_dir: Path, config_file: str | None = None) -> None:
    """A run continues only with the math and data it was started with: --resume auto's
    flags, or a --config given again with --resume RUN (`config_file`), must give the run's
    own settings but for those a resume may change (training/resume_settings.py)."""
    from ratrain.training.resume_settings import changed_settings
    from ratrain.training.run_tokenizer import kept_tokenizer

    saved = run_config(run_dir, None if config_file is None else f"--resume {run_dir}")
    changed = changed_settings(saved.to_dict(), cfg.to_dict(), kept_tokenizer(run_dir))
    if not changed:
        return
    if config_file is None:
        raise UserError(_other_settings(run_dir, saved, cfg, changed))
    names = ", ".join(f"{section}.{key} ({was!r} -> {value!r})"
                      for section, key, was, value in changed)
    raise UserError(f"cannot change {names} when resuming: --config {config_file} (with the "
                    f"flags given) sets {'it' if len(changed) == 1 else 'them'}; start a new run "
                    "instead")


def _other_settings(run_dir: Path, saved: RunConfig, cfg: RunConfig, changed: list) -> str:
    """--resume auto's refusal of a command of other settings than the run's: every one, as
    the flag that gives the run's (until 2026-12-04 only the first, as a config field and a
    Python repr, "data.path = '/x', this run has None": one retry a difference)."""
    from ratrain.cli.options import flag_of

    of_model = [c for c in changed if c[0] == "model" or c[:2] == ("train", "init_from")]
    said = [_model_differs(run_dir, saved, cfg)] if of_model else []
    for section, key, was, now in changed:
        if (section, key, was, now) in of_model:
            continue
        flag = flag_of(section, key)
        if flag is None:
            said.append(f"{section}.{key} {_value(was)} (a --config's; this command: "
                        f"{_value(now)})")
        elif flag == "--data" and was is None:
            said.append(f"no --data: the standard library (this command: {_value(now)})")
        else:
            said.append(f"{flag} {_value(was)} (this command: {_value(now, flag)})")
    way = (f"pass the run's own settings again (--config {run_dir}/config.yaml holds them "
           "all), or choose another --run-dir")
    if len(said) <= 2:  # (more: a line each, each flag found at a glance)
        return (f"--resume auto: {run_dir} was started with other settings: {'; '.join(said)}. "
                f"{way[0].upper()}{way[1:]}")
    return (f"--resume auto: {run_dir} was started with other settings; {way}:\n"
            + "\n".join(f"  {s}" for s in said))


def _model_differs(run_dir: Path, saved: RunConfig, cfg: RunConfig) -> str:
    """The run's model as the --model that gives it (its Hugging Face directory, or its
    preset); one of a --config's own is its config.yaml's."""
    from ratrain.models.presets import PRESETS

    here = cfg.train.init_from or cfg.model.name
    if saved.train.init_from or PRESETS.get(saved.model.name) == saved.model:
        return f"--model {_value(saved.train.init_from or saved.model.name)} (this command: {here})"
    return (f"the model of {run_dir}/config.yaml, {saved.model.name} of {saved.model.n_layers} "
            f"layers, dim {saved.model.dim} (a --config's; this command: {here})")


def _value(value, flag: str | None = None) -> str:
    """A setting's value as a flag takes it (a path quoted where the shell needs it)."""
    if value is None:
        return "none, the standard library" if flag == "--data" else "none"
    if isinstance(value, float):
        return f"{value:g}"
    return shlex.quote(value) if isinstance(value, str) else str(value)


def refuse_another_run_dir(resume_dir: str, run_dir: str | None) -> None:
    """--resume RUN goes on in RUN: a --run-dir naming another directory was ignored. (The
    first check of every --resume RUN: RUN itself is checked next, run_config.)"""
    if run_dir and Path(run_dir).resolve() != Path(resume_dir).resolve():
        raise UserError(f"--resume {resume_dir} continues the run in {resume_dir}, and --run-dir "
                        f"names another directory ({run_dir}); leave --run-dir out, or give the "
                        "same directory")
    run_config(resume_dir, f"--resume {resume_dir}")


# The config fields that name a file a run reads, by the flag that sets them.
_PATHS = (("data", "path", "--data"), ("data", "tokenizer", "--tokenizer"))


def absolute_paths(cfg: RunConfig, only: str | None = None) -> None:
    """A new run's data and tokenizer paths (`only`: that one), made absolute where they
    exist, as config.yaml records them: a resume from another directory read another file of
    the same name there, or none. (One that does not exist stays as given, for the loader's
    refusal to name.)"""
    for section, key, _ in _PATHS:
        value = getattr(getattr(cfg, section), key)
        if only in (None, key) and _names_a_file(key, value) and Path(value).expanduser().exists():
            setattr(getattr(cfg, section), key, str(Path(value).expanduser().absolute()))


def anchor_saved_paths(cfg: RunConfig, run_dir: Path, opts: dict) -> None:
    """A resumed run whose config.yaml holds a relative data or tokenizer path (an older
    ratrain's): read from this directory, as before, and said (a file of the same name here
    may not be the run's); a UserError naming the absolute path looked for where none is. (A
    flag repeating it names a file from here: made absolute, as a new run's.) A tokenizer file
    gone from where it names is the run's copy (run_tokenizer.resume_on_copy)."""
    from ratrain.training.run_tokenizer import resume_on_copy

    if opts.get("tokenizer") is None:  # a --tokenizer typed is loaded, or refused, as given
        resume_on_copy(cfg, run_dir)
    for section, key, flag in _PATHS:
        value = getattr(getattr(cfg, section), key)
        if not _names_a_file(key, value) or Path(value).expanduser().is_absolute():
            continue
        if opts.get(flag.removeprefix("--")) is not None:
            absolute_paths(cfg, key)
            continue
        here = Path(value).expanduser().absolute()
        said = (f"{run_dir}/config.yaml holds the {flag.removeprefix('--')} path {value} "
                f"relative to the directory the run was started in")
        if not here.exists():
            raise UserError(f"{flag.removeprefix('--')} path not found: {value} ({said}; looked "
                            f"for {here}): resume from that directory")
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"note: {said}; reading {here}", file=sys.stderr)
        setattr(getattr(cfg, section), key, str(here))


def _names_a_file(key: str, value) -> bool:
    return isinstance(value, str) and bool(value) and not (key == "tokenizer" and value == "byte")


def refuse_idle_checkpoint_flags(cfg: RunConfig, typed: dict) -> None:
    """--checkpoint-every, --checkpoint-async/--checkpoint-sync, and (unless
    --checkpoint-on-interrupt saves one) --checkpoint-dir and --keep-checkpoints, typed for a
    run that saves no checkpoint (--no-checkpoints, or train.checkpoints false in the config
    it takes), would do nothing. Only typed flags, as refuse_idle_outer_flags."""
    if cfg.train.checkpoints:
        return
    idle = ["checkpoint_every", "checkpoint_async"]
    if not cfg.train.checkpoint_on_interrupt:
        idle += ["checkpoint_dir", "keep_checkpoints"]
    for key in idle:
        value = typed.get(key)
        if value is None:
            continue
        flag = ({True: "--checkpoint-async", False: "--checkpoint-sync"}[value]
                if key == "checkpoint_async" else f"--{key.replace('_', '-')} {value}")
        why = ("--no-checkpoints" if typed.get("checkpoints") is False else
               "train.checkpoints: false in its config; --checkpoints turns them on")
        raise UserError(f"{flag} is for the run's checkpoints, and this run saves none ({why}"
                        + ("" if cfg.train.checkpoint_on_interrupt or key not in (
                            "checkpoint_dir", "keep_checkpoints") else
                           "; --checkpoint-on-interrupt saves one on Ctrl-C")
                        + "): leave the flag out")
