"""`ratrain train --memory-budget`: the search for the run's plan before it starts, and after
it the check of the peak it reached against the budget."""

from __future__ import annotations

import click

from ratrain.byte_units import decimal_bytes
from ratrain.config import RunConfig
from ratrain.counts import counted
from ratrain.errors import UserError


def searched_plan(cfg: RunConfig, opts: dict, profile_spec: str | None, devices: int | None,
                  memory_budget: str, host_memory_budget: str | None) -> dict:
    """The fastest plan that fits `memory_budget` per device (`ratrain plan`'s search) on
    --profile or this machine's preset, for at most --devices (default: the GPUs here, or on
    a CPU the profile's), said on stderr and taken into cfg as a plan file's would be."""
    from ratrain.cli.plan_taken import use_plan
    from ratrain.cli.plan_search import (MARGIN, TIME_LIMIT_S, best_plans, profile_file_of,
                                         search_request, with_host_budget,
                                         with_this_machines_host, with_this_machines_memory)
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
    data = plan_file.to_dict(best, cfg, request, profile_file_of(profile_spec))
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
