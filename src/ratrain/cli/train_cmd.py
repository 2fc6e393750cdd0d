"""`ratrain train`."""

from __future__ import annotations

from pathlib import Path

import click

from ratrain.cli.group import cli
from ratrain.cli.json_command import JsonCommand
from ratrain.cli.options import (blame_the_resumed_run, build_config, config_options,
                                 refuse_idle_outer_flags)
from ratrain.cli.plan_taken import take_plan
from ratrain.cli.plan_search import refuse_no_devices
from ratrain.cli.train_budget import over_budget, searched_plan
from ratrain.cli.train_resume import (absolute_paths, anchor_saved_paths, check_same_run,
                                      auto_resume, refuse_another_run_dir,
                                      refuse_idle_checkpoint_flags)
from ratrain.cli.train_said import say_summary, write_report_or_warn
from ratrain.config import RunConfig
from ratrain.errors import UserError


@cli.command(cls=JsonCommand)
@config_options
@click.option("--plan", "plan_file", type=click.Path(), help="Run this plan (JSON from `ratrain plan --out`) instead of building one.")
@click.option("--memory-budget", help="Search for the fastest plan that fits this many bytes per device (20GB, 18GiB: as `ratrain plan --memory-budget`) on --profile for --devices, and train it; the plan goes to RUN/plan.json. The planner chooses the layout: leave --dp, --activation, --state-home and the like out.")
@click.option("--devices", type=int, help="With --memory-budget: the devices the plan may use (pp x dp), at most.  [default: the GPUs here; on a CPU, the profile's]")
@click.option("--host-memory-budget", help="With --memory-budget: bytes of host memory per device the plan's host-homed state may use (as `ratrain plan --host-memory-budget`).  [default: the profile's]")
@click.option("--run-dir", type=click.Path(), help="Directory for this run.  [default: runs/<time>-<model>, linked from runs/latest]")
@click.option("--resume", "resume_dir", help="Continue the run in this directory from its newest checkpoint that verifies (newer ones that do not are named and skipped). 'auto', with --run-dir: continue the run there if it has a checkpoint, else start it (for torchrun --max-restarts).")
@click.option("--keep-checkpoints", type=int, help="Keep the newest K complete checkpoints.  [default: 2]")
@click.option("--checkpoints/--no-checkpoints", "checkpoints", default=None, help="--no-checkpoints: save none, neither every --checkpoint-every steps nor at the end (--checkpoint-on-interrupt still saves on Ctrl-C); the disk check is then skipped.  [default: on]")
@click.option("--checkpoint-dir", type=click.Path(), help="Write checkpoints into this directory (step_N/ in it) instead of RUN/checkpoints/, e.g. on a larger disk; a resumed run looks there. A new run refuses one that holds checkpoints already.  [default: RUN/checkpoints]")
@click.option("--checkpoint-async/--checkpoint-sync", "checkpoint_async", default=None, help="async: copy the state to host memory (12 bytes a parameter of a rank's units) and write the files on a background thread while training goes on; sync: write before the next step (no copy). Where host memory is short, async writes the units it cannot copy at once.  [default: async]")
@click.option("--comm-timeout", type=float, help="Seconds a rank waits for a peer before the run ends, naming the step, the action and the peer.  [default: 300]")
@click.option("--checkpoint-on-interrupt", is_flag=True, default=None, help="On Ctrl-C, finish the step and save a checkpoint before stopping (a second Ctrl-C stops at once).")
@click.option("--trace/--no-trace", default=True, show_default=True, help="Write trace.json (pipeline runs).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="The progress bar and the start's notes on the choices made (the schedule and why). Errors, warnings, notes of what the run does otherwise than asked, and the summary are said either way.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
@click.option("--report/--no-report", default=True, show_default=True, help="At the end, write RUN_DIR/report/: index.html with the run's table and pictures (`ratrain report`).")
@click.option("--tensorboard", is_flag=True, default=None, help="Also write each step's metrics as TensorBoard scalars under RUN_DIR/tensorboard/ (pip install 'ratrain[tensorboard]').")
@click.option("--profile", "profile_spec", help="Hardware profile (a preset such as cpu-local, or a YAML file from `ratrain profile`): the device peak for MFU on a CPU, the simulated step the report sets beside the measured one, and what --memory-budget searches on.  [default: MFU against a matmul peak measured at the start (CPU) or the GPU's datasheet; the report simulates on the profile a --plan was made with]")
def train(plan_file, memory_budget, devices, host_memory_budget, run_dir, resume_dir,
          keep_checkpoints, checkpoints, checkpoint_dir, checkpoint_async, comm_timeout,
          checkpoint_on_interrupt, trace, progress, as_json, report, tensorboard, profile_spec,
          **opts) -> None:
    """Train a model. With no arguments: the embedded default run.

    Checkpoints are verified by a manifest (sizes, sha256) before any is loaded; a hung peer
    ends the run after --comm-timeout; Ctrl-C stops every rank. See docs/reliability.md."""
    from ratrain.runtime.torchrun_env import under_torchrun

    refuse_no_devices(devices)
    if memory_budget is None and devices is not None:
        raise UserError("--devices goes with --memory-budget (the devices a search may use); "
                        "without it, --pp x --dp are the run's")
    if memory_budget is None and host_memory_budget is not None:
        raise UserError("--host-memory-budget goes with --memory-budget (it bounds the plan a "
                        "search finds)")
    if memory_budget is not None and (plan_file or resume_dir):
        raise UserError("--memory-budget searches for a new run's plan; "
                        + ("--plan is one already" if plan_file else
                           "a resumed run keeps the plan it ran (RUN/plan.json)")
                        + ": leave one of them out")
    # --resume RUN takes the settings no flag gives from RUN's config.yaml (--resume auto, or
    # a --config given again: from the file and flags), so a refusal may name one the user
    # never typed
    inherited = resume_dir not in (None, "auto") and not opts["config_file"]
    if resume_dir not in (None, "auto"):
        refuse_another_run_dir(resume_dir, run_dir)
    started_by_auto = resume_dir == "auto"  # (where the run had no checkpoint: it starts)
    resume_from = None  # the checkpoint --resume auto chose, where it hashed them to choose
    if resume_dir == "auto" and not run_dir:
        raise UserError("--resume auto needs --run-dir: the directory a restarted job continues")
    if resume_dir and not inherited:  # the run's settings as a new run's, checked against it
        target = Path(run_dir if resume_dir == "auto" else resume_dir)
        cfg = build_config(opts)
        absolute_paths(cfg)
        _use_checkpoint_flags(cfg, checkpoints, checkpoint_dir, checkpoint_async)
        saved = target / "config.yaml"
        if checkpoint_dir is None and saved.is_file():  # a restarted job's flags may not name it
            cfg.train.checkpoint_dir = RunConfig.load(saved).train.checkpoint_dir
        if resume_dir == "auto":
            if comm_timeout is not None:  # a finished run's ranks may join to end together
                cfg.take_flag("--comm-timeout", "parallel", "comm_timeout_s", comm_timeout)
            goes_on, resume_from = auto_resume(target, cfg)
            resume_dir = run_dir if goes_on else None
        if resume_dir:
            check_same_run(cfg, target, None if started_by_auto else opts["config_file"])
    elif resume_dir:
        cfg = build_config(opts, resume_dir)
        anchor_saved_paths(cfg, Path(resume_dir), opts)
    else:
        cfg = build_config(opts)
        absolute_paths(cfg)
    plan_data = take_plan(cfg, plan_file, opts, note=progress,
                          run="resumed" if resume_dir else "new") if plan_file else None
    if plan_data and plan_data.get("clip") is False and cfg.train.grad_clip > 0:
        # (its programs take no global norm: the run trained unclipped, its config saying not)
        raise UserError(f"{plan_file} was made without clipping (--grad-clip 0), and this run "
                        f"clips at {cfg.train.grad_clip:g} (--grad-clip): give --grad-clip 0, or "
                        "make a plan that clips")
    if resume_dir and not plan_file and cfg.parallel.plan_file:
        plan_data = _runs_own_plan(Path(resume_dir))
    if memory_budget is not None:
        plan_data = searched_plan(cfg, opts, profile_spec, devices, memory_budget,
                                   host_memory_budget)
    _use_checkpoint_flags(cfg, checkpoints, checkpoint_dir, checkpoint_async)
    for flag, value, section, key in (
            ("--keep-checkpoints", keep_checkpoints, "train", "keep_checkpoints"),
            ("--checkpoint-on-interrupt", checkpoint_on_interrupt, "train",
             "checkpoint_on_interrupt"),
            ("--comm-timeout", comm_timeout, "parallel", "comm_timeout_s")):
        if value is not None:  # (a refusal of the value names the flag)
            cfg.take_flag(flag, section, key, value)
    _use_output_flags(cfg, tensorboard, profile_spec)
    if resume_dir:
        run_dir = Path(resume_dir)
    elif run_dir:
        run_dir = Path(run_dir)
    elif under_torchrun():
        raise UserError("under torchrun, pass --run-dir: the directory every node writes into "
                        "(one all nodes share, or each node's own disk: each then keeps its "
                        "ranks' part of every checkpoint)")
    from ratrain.training.run_checkpoints import RunFinished
    from ratrain.training.run_lock import release_run_dirs

    try:
        cfg.validate()  # a value out of range gets its line before torch loads (2.7 s)
        refuse_idle_outer_flags(cfg, opts)
        refuse_idle_checkpoint_flags(cfg, {**opts, "keep_checkpoints": keep_checkpoints,
                                           "checkpoint_dir": checkpoint_dir,
                                           "checkpoint_async": checkpoint_async,
                                           "checkpoints": checkpoints})
        from ratrain.training.run import train as run_training
        from ratrain.training.run_dir import refuse_a_taken_run_dir

        if run_dir and not resume_dir and not started_by_auto:
            refuse_a_taken_run_dir(run_dir)
        summary = run_training(cfg, run_dir, resume=bool(resume_dir), progress=progress,
                               trace=trace, plan_data=plan_data, resume_from=resume_from)
    except RunFinished as done:  # nothing to train is no failure: a restart loop reruns it
        if under_torchrun():  # rank 0 alone finds it: the others wait for it to say so, exit 2
            raise
        click.echo(str(done), err=True)
        return
    except UserError as e:
        if inherited:
            blame_the_resumed_run(e, run_dir, opts)
        raise
    finally:
        release_run_dirs()
    if not summary:  # a torchrun rank other than 0
        return
    say_summary(summary, as_json)
    over = memory_budget is not None and over_budget(summary, memory_budget, plan_data,
                                                     profiled=profile_spec is not None)
    if over:
        click.echo(f"warning: {over}", err=True)
    if report:
        write_report_or_warn(Path(summary["run_dir"]), quiet=as_json)


def _runs_own_plan(run_dir: Path) -> dict | None:
    """The plan a planned run ran, as it wrote it at its start (RUN/plan.json): its resume
    runs that, not what its --plan file holds now (moved, deleted or planned anew; until
    2026-11-27 a moved file ended the resume). None where an older run has no copy: the
    recorded path is read then."""
    from ratrain.setup import read_plan_file

    own = run_dir / "plan.json"
    return read_plan_file(own) if own.is_file() else None


def _use_output_flags(cfg: RunConfig, tensorboard: bool | None, profile_spec: str | None) -> None:
    """--tensorboard and --profile into the config, checked before the run starts."""
    if tensorboard is not None:
        cfg.train.tensorboard = tensorboard
    if cfg.train.tensorboard:
        from ratrain.training.tensorboard_log import check_available

        check_available()
    if profile_spec:
        cfg.train.profile = str(Path(profile_spec).resolve()) if Path(profile_spec).is_file() else profile_spec
    if cfg.train.profile:
        from ratrain.sim.profile import load_profile

        load_profile(cfg.train.profile)  # an unknown preset or a bad file: a UserError now


def _use_checkpoint_flags(cfg: RunConfig, checkpoints: bool | None, checkpoint_dir: str | None,
                          checkpoint_async: bool | None) -> None:
    """--checkpoints, --checkpoint-dir (made absolute: a resumed run may start elsewhere) and
    --checkpoint-async into the config."""
    if checkpoints is not None:
        cfg.train.checkpoints = checkpoints
    if checkpoint_dir is not None:
        cfg.train.checkpoint_dir = str(Path(checkpoint_dir).absolute()) if checkpoint_dir.strip() else ""
    if checkpoint_async is not None:
        cfg.train.checkpoint_async = checkpoint_async


