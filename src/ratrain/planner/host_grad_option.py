"""What `--host-grad-dtype bfloat16` would buy a search whose best plan holds its state in a
bounded host tier: the fastest plan with host-homed gradients in bf16 (2 bytes a parameter
instead of 4; runtime/host_grad.py), offered below the plans as --sync diloco's option is.
It rounds the gradients, so it is the user's to choose, never the search's: the search
returns fp32 plans, and this says what the other choice would be where it is faster.

llama2-7b at batch 16 on the H200 profile under 20 GB with 100 GB of host state: the best fp32
plan predicts 5,805 tokens/s, this option 6,633 (2026-11-29)."""

from __future__ import annotations

import dataclasses

from ratrain.planner.candidate import Candidate, evaluate
from ratrain.planner.device_units import keep_on_device
from ratrain.planner.layouts import PlanRequest
from ratrain.planner.search import SearchResult, UnitTables, expand, search
from ratrain.schedule.plan_rules import host_grad_refusal
from ratrain.schedule.unit_major import folds_a_step

FASTER = 1.02
"""How much faster the option must be predicted to be worth a line (the prediction's own
spread is a few percent)."""
TIME_LIMIT_S = 10.0
"""Seconds its search may take: a second search, where the first may have taken the user's
whole --time-limit."""
TRIES = 3
"""Plan 1's partitions with bf16 gradients simulated at most, where the search found none."""


def offer(found: SearchResult) -> Candidate | None:
    """The fastest bf16-gradient plan where the best plan found is host-homed behind a host
    tier with a memory bound, and the option is at least FASTER times as fast; else None."""
    r, best = found.request, found.best[0]
    host = r.profile.device
    if (r.host_grad_dtype != "float32" or best.plan.state_home != "host"
            or host.host_link is None or host.host_memory_bytes is None):
        return None
    request = dataclasses.replace(r, host_grad_dtype="bfloat16", top=1,
                                  time_limit_s=min(r.time_limit_s, TIME_LIMIT_S))
    found_low = search(request, first_plan_grace=1)
    option = found_low.best[0] if found_low.best else _same_layout(request, best)
    if option is None or option.step_time * FASTER > best.step_time:
        return None
    return option


def _same_layout(request: PlanRequest, best: Candidate) -> Candidate | None:
    """Plan 1's layout with bf16 gradients, where the option's own search found no plan in
    its time (llama2-70b on 64 GPUs: its first plan comes after half a minute of layouts that
    do not fit): its partitions that fit, by their bounds, the first that the simulator
    passes, with the device units the budget allows."""
    lifecycle = dataclasses.replace(best.layout.lifecycle, host_grad_dtype="bfloat16")
    if host_grad_refusal(lifecycle.host_grad_dtype, lifecycle.state_home, lifecycle.shard_state,
                         lifecycle.view_window):
        return None
    layout = dataclasses.replace(best.layout, lifecycle=lifecycle)
    for candidate in sorted(expand(request, UnitTables(request), layout, 0.0),
                            key=lambda c: c.bound)[:TRIES]:
        evaluate(request, candidate)
        if candidate.excess(request) <= 0:
            return keep_on_device(request, candidate)
    return None


def describe(option: Candidate, best: Candidate, than: str = "plan 1") -> str:
    """The option's line below the plans (`than`: what `best` is called there)."""
    from ratrain.planner.account import decimal_bytes

    layout, plan = option.layout, option.plan
    folds = max(folds_a_step(p, plan.summed_on_device) for p in plan.programs)
    return (f"with --host-grad-dtype bfloat16 (host-homed gradients in 2 bytes a parameter, "
            f"rounded to bfloat16 at each of {folds} fold{'' if folds == 1 else 's'} a step; "
            f"docs/correctness.md says what that cost): {option.result.tokens_per_s:,.0f} tokens/s "
            f"predicted ({best.step_time / option.step_time:.2f}x {than}), "
            f"{layout.n_micro} x {layout.micro_batch_size}, "
            f"{layout.lifecycle.label(len(option.device_units), option.plan.device_grad_sum)}, "
            f"{decimal_bytes(max(option.stage_bytes))}, "
            f"{decimal_bytes(max(option.host_bytes))} of host memory")
