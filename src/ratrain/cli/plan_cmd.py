"""`ratrain plan`: show the programs of a layout, or search for the fastest plan that fits."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ratrain.byte_units import decimal_bytes
from ratrain.cli.format import other_work_line, range_line, table
from ratrain.cli.group import cli
from ratrain.cli.json_command import JsonCommand
from ratrain.cli.out_path import (plan_option_files, refuse_overwriting, refuse_unwritable,
                                  remove_stale_options)
from ratrain.cli.options import (build_config, config_options, refuse_idle_outer_flags,
                                 refuse_training_flags)
from ratrain.cli.plan_search import MARGIN, TIME_LIMIT_S, refuse_no_devices
from ratrain.counts import counted
from ratrain.errors import UserError


class _NoPlan(UserError):
    """The search's refusal (nothing fits, nothing can run, or its time limit), with what
    `--json` prints for it (json_command.refusal_object): the error and the plan that came
    closest (_no_plan)."""

    def __init__(self, message: str, json_object: dict):
        super().__init__(message)
        self.json_object = json_object


@cli.command(cls=JsonCommand)
@config_options
@click.option("--profile", "profile_spec", help="Search for the fastest plan on this hardware profile: a preset (mt3000, a100-40g-10gbe, h100-80g-ib, cpu-local) or a YAML file from `ratrain profile`.  [default: cpu-local with a device's memory this machine's available memory shared by the devices searched, and bfloat16 at float32's rate where this CPU has bf16 matrix instructions (amx_bf16, avx512_bf16)]")
@click.option("--devices", type=int, help="Search over at most this many devices (pp x dp).  [default: a profile's device groups; else 2 on a CPU profile, 8 otherwise]")
@click.option("--memory-budget", help="Bytes per device a plan may use: 20GB, 18GiB, 20e9.  [default: a device's memory]")
@click.option("--host-memory-budget", help="Bytes of host memory per device that host-homed state (and offloaded activations) may use: 100GB, 90GiB. A profile from `ratrain profile` records what its machine had available; this lowers it, or sets it where the profile has none.  [default: the profile's]")
@click.option("--memory-margin", type=float, default=MARGIN, show_default=True, help="Fraction of the budget kept free for allocator fragmentation and library buffers.")
@click.option("--top", type=int, default=3, show_default=True, help="How many of the fastest plans to list.")
@click.option("--time-limit", type=float, default=TIME_LIMIT_S, show_default=True, help="Seconds the search may take; past it, the best plan found so far is given and said to be unproven.")
@click.option("--out", type=click.Path(), help="Write the (best) plan here: its layout and memory policies, with the model, sequence length, batch and dtype it was made for, which `ratrain train --plan FILE` runs; the training's other settings (--steps, --lr, --data, ...) are train's flags.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (search: the candidates) as JSON on stdout.")
def plan(profile_spec, devices, memory_budget, host_memory_budget, memory_margin, top, time_limit,
         out, as_json, **opts) -> None:
    """Search for the fastest plan that fits a memory budget (--profile, --devices,
    --memory-budget), or show the per-stage programs of the layout the flags describe (step x
    stage table; every replica runs its stage's)."""
    _plan(profile_spec, devices, memory_budget, host_memory_budget, memory_margin, top,
          time_limit, out, as_json, opts)


def _plan(profile_spec, devices, memory_budget, host_memory_budget, memory_margin, top,
          time_limit, out, as_json, opts) -> None:
    refuse_no_devices(devices)
    cfg = build_config(opts)
    refuse_idle_outer_flags(cfg, opts)
    search = bool(profile_spec or devices is not None or memory_budget or host_memory_budget)
    # a search's --steps bounds the --sync diloco option's period (low_comm.price)
    refuse_training_flags(opts, "plan", "a plan file holds the layout, memory policies, model "
                          "and batch it was made for, not the training's other settings; give "
                          "{them} to `ratrain train --plan FILE`",
                          used=("steps",) if search else ())
    if out:  # refused before a search's seconds are spent (the options' files go beside it)
        refuse_unwritable(out, "the plan", "plan.json", make_parents=False)
        refuse_overwriting(out, profile_spec)
    if search:
        _search(cfg, opts, profile_spec, devices, memory_budget, host_memory_budget,
                memory_margin, top, time_limit, out, as_json)
    else:
        _show(cfg, out, as_json)


def _show(cfg, out, as_json) -> None:
    from ratrain.schedule import format_table
    from ratrain.training.prepare import plan_here

    from ratrain.planner.plan_file import made_from_preset, run_settings

    pipeline_plan = plan_here(cfg)
    if out:  # with the model and batch it is for, as a searched plan's file (`train --plan`)
        _write(out, {**pipeline_plan.to_dict(), "run": run_settings(pipeline_plan, cfg),
                     **made_from_preset(cfg)})
        removed = remove_stale_options(out, [])  # (no search: no option)
        if removed:
            click.echo(removed, err=as_json)
    if as_json:
        click.echo(json.dumps(pipeline_plan.to_dict(), indent=2))
        return
    units = ", ".join(f"stage {s}: " + (f"unit {r.start}" if len(r) == 1
                                         else f"units {r.start}-{r.stop - 1}")
                      for s, r in enumerate(pipeline_plan.stage_units))
    placed = (f" (weight gradients: {pipeline_plan.weight_grad})"
              if pipeline_plan.weight_grad else "")
    click.echo(f"{pipeline_plan.policy} {pipeline_plan.schedule}{placed}, pp={cfg.parallel.pp} dp={cfg.parallel.dp} "
               f"rank order {pipeline_plan.rank_order}, "
               + (f"--sync {pipeline_plan.sync} (the programs below: an inner step), "
                  if pipeline_plan.sync != "step" else "")
               + f"n_micro={cfg.n_micro}; {units}")
    views = ("none (the views are the masters)" if pipeline_plan.view_window is None
             else "all resident" if pipeline_plan.view_window == 0
             else f"window {pipeline_plan.view_window}")
    activation = "; ".join(f"stage {s}: " + ",".join(choices)
                           for s, choices in enumerate(pipeline_plan.activation))
    over = (f"within groups of {pipeline_plan.shard_group} of the {pipeline_plan.dp} replicas"
            if pipeline_plan.shard_group else f"over the {pipeline_plan.dp} replicas")
    sharded = (f", sharded {over}"
               + (f" (gradient lifetime {pipeline_plan.grad_lifetime})"
                  if pipeline_plan.grad_lifetime != "step" else "")
               if pipeline_plan.shard_state else "")
    summed = (", its gradients summed over the replicas on the device before they fold"
              if pipeline_plan.device_grad_sum else "")
    if pipeline_plan.host_grad_dtype != "float32":
        summed += f", its gradients held in {pipeline_plan.host_grad_dtype}"
    click.echo(f"activations per unit: {activation}; views: {views}; "
               f"state home: {pipeline_plan.state_home}{pipeline_plan.on_device_text}{sharded}"
               f"{summed}")
    click.echo(format_table(pipeline_plan.programs))


def _search(cfg, opts, profile_spec, devices, memory_budget, host_memory_budget, margin, top,
            time_limit, out, as_json) -> None:
    from ratrain.cli.plan_search import (best_plans, profile_file_of, search_request,
                                         unbounded_host_note, with_host_budget,
                                         with_this_machines_memory)
    from ratrain.cpu_features import bf16_matmul_flag
    from ratrain.planner import host_grad_option, low_comm, plan_file
    from ratrain.setup import Machine
    from ratrain.sim.profile_repeats import step_time_range, unstable_figures
    from ratrain.sim.simulator import simulate

    # no --profile: this machine's (its memory below; a CPU's bf16 rate by its instructions)
    hw = preset = Machine(cpu_bf16_flag=bf16_matmul_flag()).profile_or_preset(profile_spec,
                                                                              cfg.train.dtype)
    if profile_spec is None:
        hw = with_this_machines_memory(preset, devices)
    memory_here = hw is not preset
    hw = with_host_budget(hw, host_memory_budget)
    request = search_request(cfg, opts, hw, devices, memory_budget, margin, top, time_limit,
                             "--profile/--devices/--memory-budget")
    t = cfg.train
    try:
        found = best_plans(request)
    except UserError as e:
        if as_json:  # its object names the plan that came closest (simulated once more)
            raise _NoPlan(str(e), _no_plan(e, request)) from None
        raise
    best, made_on = found.best[0], profile_file_of(profile_spec)
    if out:
        _write(out, plan_file.to_dict(best, cfg, request, made_on))
    # what the profile's figures that did not repeat do to the best plan's prediction
    edges = step_time_range(hw, lambda profile: simulate(
        best.plan, cfg.model, profile, micro_batch_size=best.layout.micro_batch_size,
        seq_len=t.seq_len, dtype=t.dtype,
        threads_per_rank=request.threads_of(best.layout)).step_time)
    offer = low_comm.offer(found)  # a link too slow for per-step sync: what --sync diloco buys
    offered, bf16_path = plan_option_files(out) if out else (None, None)
    if offered and offer:
        _write(offered, low_comm.plan_file_of(offer, cfg, request, made_on))
    low_grad = host_grad_option.offer(found)  # a bounded host tier: what bf16 gradients buy
    low_grad_file = bf16_path if low_grad else None
    if low_grad_file:
        _write(low_grad_file, plan_file.to_dict(low_grad, cfg, request, made_on))
    removed = out and remove_stale_options(out, [offered if offer else None, low_grad_file])
    note = unbounded_host_note(request, [("plan 1", best)]
                               + ([("the option", offer.candidate)] if offer else []))
    if as_json:
        summary = plan_file.summary(found)
        if note:
            summary["note"] = note
        if edges:
            summary["plans"][0]["step_time_range_s"] = list(edges)
            summary["unstable_figures"] = unstable_figures(hw)
        if low_grad:
            summary["host_grad_option"] = {
                "tokens_per_s": low_grad.result.tokens_per_s, "step_time_s": low_grad.step_time,
                "stage_peak_bytes": low_grad.stage_bytes, "stage_host_peak_bytes":
                low_grad.host_bytes, **({"plan_file": str(low_grad_file)} if low_grad_file else {})}
        if offer:
            summary["low_communication"] = low_comm.to_dict(offer)
            if offered:
                summary["low_communication"]["plan_file"] = str(offered)
        summary["profile_other_work"] = other_work_line(hw)
        click.echo(json.dumps(summary, indent=2))
        if removed:  # (stdout is the object's)
            click.echo(removed, err=True)
        return
    click.echo(_heading(found))
    if other_work_line(hw):
        click.echo(other_work_line(hw))
    if memory_here or request.profile is not hw:  # not hw: a node's memory shared (simulate's)
        click.echo(f"a device's memory: {request.profile.notes['device.memory_bytes']}"
                   + (" (--profile plans for another machine)" if memory_here else ""))
    click.echo(table(_rows(found), ["#", "tokens/s", "step", "bubble", "schedule", "pp x dp",
                                    "micro-batches", "ranks", "state / views", "units per stage",
                                    f"peak / {decimal_bytes(request.budget_bytes)}", "activations"]))
    if edges:
        click.echo("plan 1: " + range_line(edges, unstable_figures(hw)))
    if low_grad:
        click.echo(host_grad_option.describe(low_grad, best))
    if offer:
        click.echo(low_comm.describe(offer))
    if note:
        click.echo(note)
    # the file holds no --steps: the command that runs it repeats the search's
    steps = f" --steps {opts['steps']}" if opts.get("steps") is not None else ""
    if out:
        click.echo(f"wrote {out}: run it with `ratrain train --plan {out}{steps}`")
    if out and offer:
        click.echo(f"wrote {offered}: the low-communication option (it changes the algorithm): "
                   f"`ratrain train --plan {offered}{steps}`")
    if low_grad_file:
        click.echo(f"wrote {low_grad_file}: the bf16-gradient option (it rounds the gradients): "
                   f"`ratrain train --plan {low_grad_file}{steps}`")
    if removed:
        click.echo(removed)


def _write(path, data: dict) -> None:
    """A plan file; a path that cannot take it is refused naming --out (it was the bare
    OSError's "error: .: Is a directory")."""
    try:
        Path(path).write_text(json.dumps(data, indent=2))
    except OSError as e:
        raise UserError(f"--out {path}: cannot write the plan there "
                        f"({e.strerror or type(e).__name__})") from None


def _no_plan(error: UserError, request) -> dict:
    """What `--json` prints where no plan is found: the error, and the plan that comes closest
    to the budget (None where no layout can run), as plain data."""
    from ratrain.planner import account
    from ratrain.planner.plan_file import candidate_summary

    found = account.closest(request)
    return {"error": str(error), "closest": None if found is None else {
        **candidate_summary(found[0], request), "estimated_excess_bytes": found[1]}}


def _heading(found) -> str:
    from ratrain.planner.wording import profile_said

    r = found.request
    used = found.best[0].layout.devices
    text = (f"{r.model.name} on {profile_said(r.profile)}: {r.global_batch} x {r.seq_len} tokens "
            "per step, "
            f"{r.dtype}, policy {r.policy}, budget {decimal_bytes(r.budget_bytes)} per device "
            f"(plans keep {r.margin:.0%} free)\n"
            f"searched {counted(found.layouts, 'layout')}, simulated "
            f"{counted(found.simulated, 'plan')} in {found.seconds:.1f} s")
    if found.cut:
        text += f" ({found.cut})"
    threads = r.threads_of(found.best[0].layout)
    if used < r.devices and used == 1 and threads > 1:  # a CPU's one process on its cores
        text += (f"\nthe best plan runs one process on {threads} threads: more processes do "
                 f"not make it faster")
    elif used < r.devices:
        text += f"\nthe best plan uses {used} of the {r.devices} devices: more do not make it faster"
    if r.profile.groups:
        names = [r.profile.groups[g].name for g in found.best[0].layout.groups]
        text += "\nthe best plan's stages on device groups: " + ", ".join(names)
    return text


def _rows(found) -> list[list]:
    rows = []
    n_units = found.request.model.n_layers + 2
    for i, c in enumerate(found.best, 1):
        L, threads = c.layout, found.request.threads_of(c.layout)
        choices = c.choices(n_units)
        summary = ",".join(choices) if len(choices) <= 4 else in_runs(choices)
        rows.append([i, f"{c.result.tokens_per_s:,.0f}", f"{c.step_time:.4g} s",
                     f"{c.result.bubble:.1%}", L.schedule_label,
                     f"{L.pp} x {L.dp}" + (f", {threads} threads" if threads > 1 else ""),
                     f"{L.n_micro} x {L.micro_batch_size}", L.rank_order,
                     L.lifecycle.label(len(c.device_units), c.plan.device_grad_sum),
                     in_runs([str(b - a) for a, b, _ in c.partition]),
                     decimal_bytes(max(c.stage_bytes)), summary])
    return rows


def in_runs(choices: list[str]) -> str:
    """Per-stage choices in runs: keep x2,recompute x30."""
    out, last, count = [], None, 0
    for c in [*choices, None]:
        if c == last:
            count += 1
            continue
        if last is not None:
            out.append(last if count == 1 else f"{last} x{count}")
        last, count = c, 1
    return ",".join(out)
