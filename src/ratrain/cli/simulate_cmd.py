"""`ratrain simulate`."""

from __future__ import annotations

import json

import click

from ratrain.byte_units import decimal_bytes
from ratrain.cli.format import other_work_line, range_line, table
from ratrain.cli.group import cli
from ratrain.cli.json_command import JsonCommand
from ratrain.cli.options import (build_config, config_options, refuse_idle_outer_flags,
                                 refuse_training_flags)
from ratrain.cli.plan_taken import take_plan, take_runs_settings
from ratrain.errors import UserError


@cli.command(cls=JsonCommand)
@config_options
@click.option("--plan", "plan_file", type=click.Path(), help="Simulate this plan (JSON from `ratrain plan --out`) instead of the one the flags describe.")
@click.option("--profile", "profile_spec", help="Hardware profile: a preset (mt3000, a100-40g-10gbe, h100-80g-ib, cpu-local) or a YAML file from `ratrain profile`.  [default: with --plan, the profile the plan was made on; else cpu-local]")
@click.option("--trace", "trace_file", type=click.Path(), help="Write the simulated timeline here (Chrome trace JSON, as trace.json; open in ui.perfetto.dev).")
@click.option("--json", "as_json", is_flag=True, help="Print the prediction as JSON on stdout.")
def simulate(plan_file, profile_spec, trace_file, as_json, **opts) -> None:
    """Predict one training step on a hardware profile: step time, tokens/s, bubble, exposed
    communication and peak memory per stage, by simulating the very programs the executor runs."""
    from ratrain.setup import Machine, run_plan
    from ratrain.sim.profile import load_profile
    from ratrain.sim.profile_repeats import step_time_range, unstable_figures
    from ratrain.sim.simulator import simulate as run_simulation
    from ratrain.runtime.trace import write_chrome_trace

    cfg = build_config(opts)
    refuse_training_flags(opts, "simulate", "it predicts one step from the model, batch "
                          "and layout alone; leave {them} out")
    plan_data = take_plan(cfg, plan_file, opts) if plan_file else None
    ran_on = plan_data is not None and take_runs_settings(cfg, plan_data, plan_file, opts)
    refuse_idle_outer_flags(cfg, opts)
    from ratrain.cli.plan_search import with_node_memory

    loaded = load_profile(profile_spec or ran_on or _plans_profile(plan_data, plan_file,
                                                                   as_json))
    # a CPU node's memory is its ranks' to share, as the search shared it
    hw = with_node_memory(loaded, cfg.parallel.pp * cfg.parallel.dp)
    if hw is not loaded and not as_json:
        click.echo(f"a device's memory: {hw.notes['device.memory_bytes']}")
    hw.rate(cfg.train.dtype)  # a dtype the profile cannot compute is the user's to fix
    busy = other_work_line(hw)
    if busy and not as_json:
        click.echo(busy)
    # what could not run on the profile's devices is not predicted (setup/rule.py); --schedule
    # auto is chosen on this profile
    machine = Machine.of_profile(hw, cfg)
    said: list[str] = []
    plan = run_plan(cfg, machine, plan_data=plan_data, profile=hw,
                    say=said.append if as_json else click.echo)
    t = cfg.train
    shape = {"micro_batch_size": t.micro_batch_size, "seq_len": t.seq_len, "dtype": t.dtype,
             "threads_per_rank": machine.threads_per_rank}

    def predict(profile):
        return run_simulation(plan, cfg.model, profile, **shape)

    result = predict(hw)
    # what the figures that did not repeat over the profile's repeats do to this prediction
    edges = step_time_range(hw, lambda profile: predict(profile).step_time)
    if trace_file:
        actions, spans = result.trace_events()
        write_chrome_trace(trace_file, actions,
                           {s: f"stage {s} (simulated, {hw.name})" for s in actions}, spans)
    budget, limit, limit_said = _device_limit(plan_data, hw)
    summary = {"model": cfg.model.name, "profile": hw.name, "pp": plan.pp, "dp": plan.dp,
               "n_micro": plan.n_micro, "global_batch": t.global_batch, "seq_len": t.seq_len,
               "micro_batch_size": t.micro_batch_size, "dtype": t.dtype, "policy": plan.policy,
               "state_home": plan.state_home, "view_window": plan.view_window,
               "shard_state": plan.shard_state, "schedule": plan.schedule,
               "weight_grad": plan.weight_grad, "grad_lifetime": plan.grad_lifetime,
               "shard_group": plan.shard_group, "host_grad_dtype": plan.host_grad_dtype,
               "threads_per_rank": machine.threads_per_rank,
               "memory_budget_bytes": budget, "device_limit_bytes": limit,
               # the line the text starts with where --schedule auto had candidates to weigh
               "schedule_choice": next((line for line in said if line.startswith("schedule ")),
                                       None),
               "profile_other_work": busy, **result.summary()}
    host = hw.device.host_memory_bytes if hw.device.host_link else None
    for stage, r in zip(summary["stages"], result.ranks):
        # each tier's verdict, as the table says it (fits_host None: the profile has no host tier)
        stage["peak_with_process_bytes"] = r.peak_with_process(hw.device)
        stage["fits_device"] = stage["peak_with_process_bytes"] <= limit
        stage["fits_host"] = None if host is None else r.host_peak <= host
    if edges:
        summary["step_time_range_s"] = list(edges)
        summary["unstable_figures"] = unstable_figures(hw)
    period = _outer_period(plan, cfg, hw, result, shape)
    if period:
        summary["outer_period"] = period
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    over = (f"groups of {plan.shard_group} replicas, replicated across the groups"
            if plan.shard_group else "the replicas")
    sharded = (f", state sharded over {over} (gradient lifetime {plan.grad_lifetime})"
               if plan.shard_state else "")
    placed = f" (weight gradients: {plan.weight_grad})" if plan.weight_grad else ""
    click.echo(f"{cfg.model.name} on {hw.name}: pp={plan.pp} dp={plan.dp} {plan.policy} "
               f"{plan.schedule}{placed}{sharded}, "
               f"{plan.n_micro} micro-batch{'es' if plan.n_micro > 1 else ''} of "
               f"{t.micro_batch_size} x {t.seq_len} tokens per "
               f"replica, global batch {t.global_batch} sequences, {t.dtype}"
               + (f", {machine.threads_per_rank} threads a rank"
                  if machine.threads_per_rank > 1 else ""))
    click.echo(f"step {result.step_time:.4g} s, {result.tokens_per_s:,.0f} tokens/s, "
               f"bubble {result.bubble:.1%}")
    if edges:
        click.echo("  " + range_line(edges, unstable_figures(hw)))
    if period:
        added = ", ".join(f"{x:.3g} s" for x in period["exposed_sync_s"])
        click.echo(f"--sync {plan.sync}: over a period of {period['every']} steps "
                   f"{period['mean_step_time_s']:.4g} s a step, {period['tokens_per_s']:,.0f} "
                   f"tokens/s; the outer sync adds {added} to its step"
                   f"{'s' if len(period['exposed_sync_s']) > 1 else ''} (the step above is an "
                   f"inner one); device peak in a synced step "
                   f"{decimal_bytes(period['peak_bytes'])}")
    rows = []
    for r, stage in zip(result.ranks, summary["stages"]):
        fits = ("NO" if not stage["fits_device"] else
                "NO: host" if stage["fits_host"] is False else "yes")
        kinds = ", ".join(f"{k} {decimal_bytes(v)}" for k, v in r.at_device_peak.items() if v)
        rows.append([r.stage, f"{r.bubble:.1%}", f"{r.exposed:.3g} s", decimal_bytes(r.device_peak),
                     decimal_bytes(stage["peak_with_process_bytes"]), fits,
                     decimal_bytes(r.host_peak) if hw.device.host_link else "-", kinds])
    click.echo(table(rows, ["stage", "bubble", "exposed comm", "device peak", "with the process",
                             f"fits {limit_said}"
                             + (f" (host {decimal_bytes(host)})" if host is not None else ""),
                             "host tier peak",
                             "on the device at its peak, by kind"]))
    if trace_file:
        click.echo(f"wrote {trace_file}")


def _plans_profile(plan_data: dict | None, plan_file: str | None, as_json: bool) -> str:
    """The profile to simulate on where --profile is not given: the one a `ratrain plan` file
    records it was made on (as `report` does), so that its prediction is reproduced rather than
    this machine's preset's; cpu-local without one."""
    from ratrain.report.run import plans_profile
    from ratrain.sim.profile import presets

    spec, name = plans_profile(plan_data)
    if spec is None:
        return "cpu-local"
    # by name alone (its YAML file moved, or a plan made before 2026-11-29): a preset's loads
    if spec == name and name not in presets():
        raise UserError(f"{plan_file} was made on profile {name!r}, which is not a preset: "
                        "give its YAML file as --profile (or another profile to simulate on)")
    if not as_json:
        click.echo(f"profile {spec}: the one {plan_file} was made on (--profile to change it)")
    return spec


def _device_limit(plan_data: dict | None, hw) -> tuple[float, float, str]:
    """The device memory a stage is held to, what its device peak with the process's own
    overhead may reach, and the latter's words: a plan file's budget and that after its
    margin, as `ratrain plan` held it (simulate once judged a plan made for 20 GB against the
    profile's 140 GB); the profile's whole device memory where that is less (as without a
    plan: once labelled "the plan's budget less 10%", the profile's 8 GB less it), else too."""
    memory = hw.device.memory_bytes
    made = (plan_data or {}).get("prediction") or {}
    budget, margin = made.get("budget_bytes"), made.get("margin")
    if isinstance(budget, (int, float)) and isinstance(margin, (int, float)):
        limit = budget * (1.0 - margin)
        if limit <= memory:
            return budget, limit, f"{decimal_bytes(limit)} (the plan's budget less {margin:.0%})"
        return memory, memory, (f"{decimal_bytes(memory)} (the profile's device memory; the "
                                f"plan's budget is {decimal_bytes(budget)})")
    return memory, memory, decimal_bytes(memory)


def _outer_period(plan, cfg, hw, inner, shape) -> dict | None:
    """A --sync diloco plan's period of H steps (sim/outer_period.py): its mean step, what each
    fragment's outer sync adds, and the largest device peak of a synced step; None otherwise."""
    from ratrain.sim.outer_period import outer_period

    if not cfg.parallel.diloco:
        return None
    p = outer_period(plan, cfg.model, hw, **shape)
    mean = p.mean_step_time
    return {"every": p.every, "mean_step_time_s": mean,
            "tokens_per_s": inner.tokens_per_s * inner.step_time / mean,
            "exposed_sync_s": p.exposed_sync_s,
            "peak_bytes": max(r.device_peak for res in p.synced for r in res.ranks)}
