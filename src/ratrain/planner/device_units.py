"""State partly on the device (ProTrain's idea, per unit): after the search, a host-homed plan
among the best keeps the first units of each stage whole on the compute device, as many as the
stage's headroom under the budget holds (PipelinePlan.device_units). Their views are made on
the device, their gradients fold there and their AdamW runs there, fast and inline, while the
host update thread starts at once on the units after them.

Why the first units: the next step's forward reads a stage's units in order, and with carried
updates each waits for its own update (WU), which the host thread runs in that order once the
global norm is known. A device unit's update is done by the time the walker gets there, so the
thread's work on the rest runs beside the device units' forwards.

A refinement of the search's result, not part of its bound: the bound prices a layout without
device units, so a layout the search pruned could, with some, have beaten the K-th plan. The
plans it returns are only ever faster than without it (a refinement that is not is dropped).
"""

from __future__ import annotations

import dataclasses

from ratrain.planner.candidate import Candidate, evaluate
from ratrain.planner.layouts import PlanRequest
from ratrain.sim import unit_costs as uc

STATE_BYTES_PER_PARAM = 16
"""fp32 master (4), gradient (4) and AdamW moments (8): what a device unit adds there."""
OUTER_BYTES_PER_PARAM = 12
"""Under an outer sync, also its outer parameters and momentum (8) and its fp32 delta while
it is summed (4)."""
TRIES = 3
"""Simulations a candidate gets: the estimate, then one unit fewer where a stage overflowed."""


def keep_on_device(request: PlanRequest, candidate: Candidate) -> Candidate:
    """The candidate with the first units of each stage on the device where the budget allows
    and the simulated step is faster; the candidate itself otherwise."""
    if (candidate.plan is None or candidate.plan.state_home != "host"
            or request.profile.device.host_link is None):
        return candidate
    stages = [range(a, b) for a, b, _ in candidate.partition]
    counts = [_fits(request, units, request.limit_of(g) - used)
              for units, used, g in zip(stages, candidate.stage_bytes, candidate.layout.groups)]
    best = candidate
    for _ in range(TRIES):
        if not any(counts):
            break
        trial = evaluate(request, dataclasses.replace(
            candidate, plan=None, result=None, stage_bytes=[], host_bytes=[],
            device_units=tuple(u for units, k in zip(stages, counts) for u in units[:k])))
        over = [b > request.limit_of(g) for b, g in zip(trial.stage_bytes, trial.layout.groups)]
        if not any(over):
            return trial if trial.step_time < best.step_time else best
        counts = [k - 1 if o and k else k for k, o in zip(counts, over)]
    return best


def _fits(request: PlanRequest, units: range, headroom: float) -> int:
    """How many of the stage's first units' state fit in `headroom` bytes of its device."""
    k, used = 0, 0
    per_param = STATE_BYTES_PER_PARAM + (OUTER_BYTES_PER_PARAM if request.outer_sync else 0)
    for u in units:
        used += per_param * uc.param_count(request.model, u)
        if used > headroom:
            break
        k += 1
    return k
