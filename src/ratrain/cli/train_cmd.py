"""`ratrain train`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ratrain.byte_units import decimal_bytes
from ratrain.cli.group import cli
from ratrain.cli.options import (blame_the_resumed_run, build_config, config_options,
                                 refuse_idle_outer_flags)
from ratrain.cli.plan_taken import take_plan
from ratrain.cli.plan_search import refuse_no_devices
from ratrain.cli.train_resume import (absolute_paths, anchor_saved_paths, check_same_run,
                                      has_checkpoint, refuse_another_run_dir,
                                      refuse_idle_checkpoint_flags)
from ratrain.config import RunConfig
from ratrain.counts import counted
from ratrain.errors import UserError


@cli.command()
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
            resume_dir = run_dir if has_checkpoint(target, cfg) else None
        if resume_dir:
            check_same_run(cfg, target, None if started_by_auto else opts["config_file"])
    elif resume_dir:
        cfg = build_config(opts, resume_dir)
        anchor_saved_paths(cfg, Path(resume_dir), opts)
    else:
        cfg = build_config(opts)
        absolute_paths(cfg)
    plan_data = take_plan(cfg, plan_file, opts, note=progress) if plan_file else None
    if resume_dir and not plan_file and cfg.parallel.plan_file:
        plan_data = _runs_own_plan(Path(resume_dir))
    if memory_budget is not None:
        plan_data = _searched_plan(cfg, opts, profile_spec, devices, memory_budget,
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
                               trace=trace, plan_data=plan_data)
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
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        from ratrain.training.mfu import mfu_in_words

        val = summary.get("val_loss")
        val = ("  val loss: not finite" if summary.get("val_loss_not_finite")
               else f"  val loss: {val:.4f}" if val is not None else "")
        skipped = summary.get("skipped_steps")
        click.echo(f"run: {summary.get('run_dir')}  steps: {summary.get('steps')}  "
                   f"loss: {summary.get('final_loss'):.4f}" + val
                   + f"  tokens/s: {summary.get('tokens_per_s'):.0f}"
                   + (f"  MFU: {mfu_in_words(summary)}" if summary.get("mfu") is not None else "")
                   + (f"  skipped (float16 overflow): {counted(len(skipped), 'step')}, loss scale "
                      f"{summary.get('loss_scale')}" if skipped else ""))
        click.echo(_memory_line(summary))
    over = memory_budget is not None and over_budget(summary, memory_budget, plan_data,
                                                     profiled=profile_spec is not None)
    if over:
        click.echo(f"warning: {over}", err=True)
    if report:
        _write_report(Path(summary["run_dir"]), quiet=as_json)


def _searched_plan(cfg: RunConfig, opts: dict, profile_spec: str | None, devices: int | None,
                   memory_budget: str, host_memory_budget: str | None) -> dict:
    """The fastest plan that fits `memory_budget` per device (`ratrain plan`'s search) on
    --profile or this machine's preset, for at most --devices (default: the GPUs here, or on
    a CPU the profile's), said on stderr and taken into cfg as a plan file's would be."""
    from ratrain.cli.options import use_plan
    from ratrain.cli.plan_search import (MARGIN, TIME_LIMIT_S, best_plans, search_request,
                                         with_host_budget, with_this_machines_host,
                                         with_this_machines_memory)
    from ratrain.planner import host_grad_option, plan_file
    from ratrain.cpu_features import bf16_matmul_flag
    from ratrain.runtime.process_groups import pick_backend
    from ratrain.runtime.process_memory import resident_bytes
    from ratrain.runtime.torchrun_env import under_torchrun
    from ratrain.setup import Machine
    from ratrain.setup.plan_file import SEARCHED_PLAN

    if under_torchrun():  # every rank would search, and a time limit could part them
        raise UserError("under torchrun, search first: `ratrain plan --memory-budget ... --out "
                        "plan.json`, then `ratrain train --plan plan.json`")
    gpus, gpu_name = 0, None
    if pick_backend(cfg.parallel.backend) == "nccl":
        import torch

        gpus, gpu_name = torch.cuda.device_count(), torch.cuda.get_device_name()
    hw = Machine(host_is_separate=gpus > 0, device_name=gpu_name,
                 cpu_bf16_flag=None if gpus else bf16_matmul_flag()
                 ).profile_or_preset(profile_spec, cfg.train.dtype)
    if profile_spec is None:  # this machine's memory, which the run is checked against
        hw = (with_this_machines_host(hw, devices or gpus) if gpus
              else with_this_machines_memory(hw, devices))
    hw = with_host_budget(hw, host_memory_budget)
    base = None if gpus else resident_bytes()  # a GPU's memory is not the process's
    request = search_request(cfg, opts, hw, devices or gpus or None, memory_budget, MARGIN, 1,
                             TIME_LIMIT_S, "--memory-budget")
    if base and base >= request.budget_bytes:
        click.echo(f"warning: the process's own memory, {decimal_bytes(base)} (Python, torch), "
                   f"is at or over --memory-budget {decimal_bytes(request.budget_bytes)} by "
                   "itself: no plan can hold a rank's process to the budget", err=True)
    found = best_plans(request)
    best = found.best[0]
    data = plan_file.to_dict(best, cfg, request)
    use_plan(cfg, data, "the searched plan", opts)
    cfg.parallel.plan_file = SEARCHED_PLAN
    L = best.layout
    searched = ("the only layout" if found.layouts == 1
                else f"the fastest of {found.layouts} layouts")
    click.echo(f"--memory-budget {decimal_bytes(request.budget_bytes)} on {hw.name}: "
               f"{searched} ({found.simulated} simulated in {found.seconds:.1f} s"
               + (f"; {found.cut}" if found.cut else "") + f") is pp {L.pp} x dp {L.dp}, "
               f"{L.schedule_label}, {counted(L.n_micro, 'micro-batch', 'micro-batches')} of "
               f"{L.micro_batch_size}, state / views: "
               f"{L.lifecycle.label(len(best.device_units), best.plan.device_grad_sum)}; predicted "
               f"{best.result.tokens_per_s:,.0f} tokens/s, peak "
               f"{decimal_bytes(max(best.stage_bytes))}" + (
                   f" a device, beside its process's own {decimal_bytes(base)} (Python, torch: "
                   "outside the budget)" if base else " a device"), err=True)
    low_grad = host_grad_option.offer(found)  # a bounded host tier: what bf16 gradients buy
    if low_grad:
        click.echo("not taken, since it rounds the gradients (add the flag to take it): "
                   + host_grad_option.describe(low_grad, best, "the plan above"), err=True)
    return data


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


def _write_report(run_dir: Path, quiet: bool) -> None:
    """The run's report; the run has succeeded whatever happens here, so a failure is a warning."""
    from ratrain.report import write_report

    try:
        written = write_report(run_dir)
    except Exception as e:  # noqa: BLE001
        click.echo(f"warning: the report was not written ({type(e).__name__}: {e}); "
                   f"try `ratrain report {run_dir}`", err=True)
        return
    if not quiet:
        click.echo(f"report: {written.page}")


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


def _memory_line(summary: dict) -> str:
    """Peak memory per pipeline stage: what the executor held (ledger), what the process grew."""
    ledger = summary.get("ledger_peak_bytes_per_stage")
    if not ledger:
        return f"peak memory: {decimal_bytes(summary.get('peak_memory_bytes') or 0)}"
    rss = summary.get("rss_growth_bytes_per_stage") or [None] * len(ledger)
    parts = [f"stage {s}: {decimal_bytes(held)}"
             + (f" (RSS +{decimal_bytes(grown)})" if grown is not None else "")
             for s, (held, grown) in enumerate(zip(ledger, rss))]
    return "peak memory held (ledger): " + ", ".join(parts)


def over_budget(summary: dict, memory_budget: str, plan_data: dict | None = None,
                profiled: bool = False) -> str | None:
    """Where the largest rank's peak memory in a run's `summary` passed its --memory-budget,
    a line that says so and what to do; else None. The search is plan's for the same request:
    it holds the plan's bytes to the budget, and on a CPU the process's own (Python, torch:
    about 290 MB, said at the start) come on top (until 2026-12-02 a 200 MB budget peaked at
    524 MB, unsaid). `plan_data`: the searched plan, whose predicted peak the line sets apart
    from the rest; `profiled`: --profile given (no profiling to suggest). A smaller budget is
    not suggested: in a test it searched the same plan, to the same peak."""
    from ratrain.planner.budget import parse_bytes

    peak, budget = summary.get("peak_memory_bytes"), parse_bytes(memory_budget)
    if not peak or peak <= budget:
        return None
    predicted = max(((plan_data or {}).get("prediction") or {}).get("stage_peak_bytes") or [0])
    outside = (f"; {decimal_bytes(peak - predicted)} of the peak is outside the plan's "
               f"predicted {decimal_bytes(predicted)}" if 0 < predicted < peak else "")
    return (f"the largest rank's peak memory, {decimal_bytes(peak)}, passed --memory-budget "
            f"{decimal_bytes(budget)}: the plan holds its state, activations and buffers to the "
            "budget, and the process's own memory (Python, torch: said at the start) and what "
            "no profile measures (the allocator's slack, autograd's temporaries) come on top"
            + outside + ("" if profiled else "; the search ran on a preset, not on this machine's "
                         "measured profile (`ratrain profile`, then --profile)"))
