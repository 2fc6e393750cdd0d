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

The search gives a stage the fewest recomputed blocks that fit, which can leave no headroom:
where the host's update sets the step (llama2-7b, one sequence a step on an H200: 80% of it),
device units gain more than keeping activations does. So a plan whose stages keep some
blocks' activations is also tried recomputing half and all of the rest, each with the device
units its new headroom holds (llama2-7b at batch 1: 4 units and every block recomputed, 1,780
tokens/s predicted, against 1,612 keeping 18 blocks and no device unit).
"""

from __future__ import annotations

import dataclasses
import math

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
    """The fastest of the candidate and its variants with the first units of each stage on
    the device where the budget allows (more blocks recomputed to make room, too); the
    candidate itself where none is faster."""
    if (candidate.plan is None or candidate.plan.state_home != "host"
            or request.profile.device.host_link is None):
        return candidate
    best = _with_device_units(request, candidate)
    for partition in _recomputing_more(request, candidate):
        trial = evaluate(request, _unbuilt(candidate, partition=partition))
        if trial.excess(request) <= 0:
            trial = _with_device_units(request, trial)
            if trial.step_time < best.step_time:
                best = trial
    return best


def _unbuilt(candidate: Candidate, **changes) -> Candidate:
    return dataclasses.replace(candidate, plan=None, result=None, stage_bytes=[], host_bytes=[],
                               **changes)


def _recomputing_more(request: PlanRequest, candidate: Candidate) -> list:
    """The candidate's partition with half, then all, of each stage's kept blocks
    recomputed (a stage that offloads left as it is); none where nothing is kept."""
    if candidate.layout.activation != "mixed":
        return []  # a uniform choice: the plan's per-unit one is not read
    n_units = request.model.n_layers + 2
    variants = []
    for share in (0.5, 1.0):
        partition = []
        for a, b, est in candidate.partition:
            blocks = sum(1 for u in range(a, b) if 0 < u < n_units - 1)
            k = est.choice.recompute
            if not est.choice.offload:
                k = max(k, math.ceil(k + share * (blocks - k)))
            partition.append((a, b, est if k == est.choice.recompute else dataclasses.replace(
                est, choice=dataclasses.replace(est.choice, recompute=k))))
        if partition != candidate.partition and partition not in variants:
            variants.append(partition)
    return variants


def _with_device_units(request: PlanRequest, candidate: Candidate) -> Candidate:
    """The candidate with the first units of each stage on the device where its headroom
    allows and the simulated step is faster; the candidate itself otherwise."""
    stages = [range(a, b) for a, b, _ in candidate.partition]
    # those its stages' choices keep there for the host tier's sake, and more
    least = [est.choice.on_device for _, _, est in candidate.partition]
    counts = [k + _fits(request, units[k:], request.limit_of(g) - used) for units, k, used, g
              in zip(stages, least, candidate.stage_bytes, candidate.layout.groups)]
    best = candidate
    for _ in range(TRIES):
        if counts == least:
            break
        trial = evaluate(request, _unbuilt(
            candidate, device_units=tuple(u for units, k in zip(stages, counts)
                                          for u in units[:k])))
        over = [b > request.limit_of(g) for b, g in zip(trial.stage_bytes, trial.layout.groups)]
        if not any(over):
            return trial if trial.step_time < best.step_time else best
        counts = [k - 1 if o and k > low else k for k, low, o in zip(counts, least, over)]
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
