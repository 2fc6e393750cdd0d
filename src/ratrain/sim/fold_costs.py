"""Folding a view's gradient into the state's fp32 accumulation, priced on a StageCosts
(sim/stage_costs.py): where each fold's add runs (the walker, the device, the host update
thread's SN) under the plan's runs of backwards (schedule/unit_major.fold_roles), and what it
sends across a host link."""

from __future__ import annotations

from ratrain.schedule.unit_major import FIRST, HOLD, LATER, SYNC


def fold_s(c, u: int, mb: int | None) -> float:
    """Folding a view's gradient into fp32 after a backward: read both, write one. Into
    host-homed state on a GPU, the step's first fold costs the compute timeline nothing:
    the gradient is cast on the device and copied into the zero accumulation on a stream
    of its own (UnitState.fold_grads); and a backward with more of its unit's to come in
    its run (unit_major.HOLD) adds its gradient to the run's fp32 sum on the device
    instead, which the run's last folds (runtime/run_grads.py). mb None: the step's mean,
    over groups of `micro_batch_group` (m / g folds a unit, the first a copy). Summed on the
    device before its fold (unit_major.SYNC), every backward adds to the run's sum: the
    fold is the sync wait's copy into the zero accumulation, off the compute timeline."""
    if u not in c.s.view_units:
        return 0.0
    if u in c.device_summed:
        return (8 + c.s.shape.elt) * c.s.params(u) / c.bandwidth
    add = fold_add_bytes(c, u) * c.s.params(u) / c.state_bandwidth(u)
    if u in c.s.host_norms and last_fold_added(c, u, mb):
        # the step's last fold's add is done by SN on the host update thread (the
        # runtime's fold adds lazily, when something next reads the accumulation)
        return _fold_without_last_add(c, u, mb, add)
    if not c.runs_on_device(u):
        return add
    on_device = (8 + c.s.shape.elt) * c.s.params(u) / c.bandwidth
    if mb is None:
        m, g = c.s.n_micro, c.s.micro_batch_group
        return (add * (m // g - 1) + (on_device * m if g > 1 else 0.0)) / m
    roles = c.s.fold_roles
    role = roles.get((u, mb)) if roles else (FIRST if mb == 0 else LATER)
    if role == HOLD:
        return on_device
    return ({FIRST: 0.0}.get(role, add)
            + (on_device if (u, mb) in c.summed else 0.0))


def fold_copy_bytes(c, u: int, mb: int) -> int:
    """Bytes the fold after unit u's backward on micro-batch `mb` sends across the host link,
    on the copy engine's gradient stream (runtime/host_fold.py): into the step's zero
    accumulation, the gradient cast on the device to the accumulation's dtype (4 a parameter
    for fp32, 2 for a bf16 host gradient: StageSetup.grad_bytes); a later fold, the
    gradient as it is (a run's fp32 sum, else the view's dtype), added on the host; none
    while a run holds it on the device (HOLD) or its sum waits for the sync (SYNC)."""
    if u not in c.s.view_units or not c.across_link(u) or u in c.device_summed:
        return 0
    roles = c.s.fold_roles
    role = roles.get((u, mb)) if roles else (FIRST if mb == 0 else LATER)
    if role not in (FIRST, LATER):
        return 0
    if role == FIRST and c.s.grad_lifetime == "step":
        return c.s.grad_bytes(u) * c.s.params(u)
    return (4 if (u, mb) in c.summed else c.s.shape.elt) * c.s.params(u)


def last_fold_added(c, u: int, mb: int | None) -> bool:
    """Whether the step's last fold of unit u is an add on the host (not the copy into the
    zero accumulation), and `mb` is that fold (mb None: the step's mean has one). Only
    across a host link is a fold's add left for later (UnitState.fold_grads)."""
    if not c.runs_on_device(u):
        return False
    if c.s.fold_roles:
        last_mb, role = c.last_folds[u]
        return role == LATER and (mb is None or mb == last_mb)
    runs = c.s.n_micro // c.s.micro_batch_group
    return runs > 1 and (mb is None or mb == c.s.n_micro - 1)


def _fold_without_last_add(c, u: int, mb: int | None, add: float) -> float:
    on_device = (8 + c.s.shape.elt) * c.s.params(u) / c.bandwidth
    if mb is not None:
        return on_device if (u, mb) in c.summed else 0.0
    m, g = c.s.n_micro, c.s.micro_batch_group
    return (add * (m // g - 2) + (on_device * m if g > 1 else 0.0)) / m


def unit_norm_s(c, u: int) -> float:
    """SN u: the add of the unit's last fold where it is one, then its squared norm."""
    add = (fold_add_bytes(c, u) * c.s.params(u) / c.state_bandwidth(u)
           if last_fold_added(c, u, None) else 0.0)
    return add + c.s.grad_bytes(u) * c.update_params(u) / c.state_bandwidth(u)


def fold_add_bytes(c, u: int) -> int:
    """Bytes a parameter of a fold's add into the accumulation: read both, write one (12 in
    fp32; a bf16 accumulation reads and writes 2, the addend 4 or fewer: 8)."""
    return 12 if c.s.grad_bytes(u) == 4 else 8


def summed_runs(roles: dict[tuple[int, int], str]) -> set[tuple[int, int]]:
    """The folds that end a run in which earlier backwards of the unit held (`roles` in
    program order, as fold_roles gives them)."""
    out, last = set(), {}
    for key, role in roles.items():
        if role != HOLD and last.get(key[0]) == HOLD:
            out.add(key)
        last[key[0]] = role
    return out


def last_folds(roles: dict[tuple[int, int], str]) -> dict[int, tuple[int, str]]:
    """Each unit's last fold of the step, (micro-batch, role), where `roles` (in program
    order, as fold_roles gives them) has one: asked for at every backward, so made once (a
    scan of the roles for each was a tenth of a 64-stage plan's simulation)."""
    return {u: (mb, role) for (u, mb), role in roles.items() if role != HOLD}


def summed_on_device(roles: dict[tuple[int, int], str]) -> set[int]:
    """The units whose run's sum waits for their sync on the device (unit_major.SYNC:
    PipelinePlan.device_grad_sum)."""
    return {u for (u, _), role in roles.items() if role == SYNC}
