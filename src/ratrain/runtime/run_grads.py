"""A unit's gradient over a run of its backwards, held on the compute device in fp32 until the
run's last backward folds it into the state's accumulation (schedule/unit_major.fold_roles).

Where the accumulation lives across a host link, every fold crosses the link and is added on
the host; in the unit-major order a unit's backwards of a group run back to back, so their
gradients are summed on the device first and the run folds once. The sum is fp32, as the
accumulation is: a bf16 or fp16 view's gradients are added in the precision the host would
add them in, in the same order, so a run of the whole step folds the same bits as one fold per
backward, and shorter runs differ only in how the sums associate. It costs 4 bytes per
parameter of the unit on the device from its run's first backward to its last (the `grad_run`
storage of the registry's B and BW effects, counted as a buffer).
"""

from __future__ import annotations

import torch

from ratrain.schedule.unit_major import HOLD, SYNC


def gradients_to_fold(state, role: str | None) -> list[torch.Tensor | None] | None:
    """Take the view's gradients off its parameters; None where the run goes on (`role` HOLD:
    they were added to the run's sum) or its sum waits for the unit's sync (SYNC: summed on
    the device first, UnitState.start_sync), else the gradients to fold now: the run's sum
    where one was held, else the view's own (role None: no run, as under 1F1B)."""
    grads = []
    for p in state.params:
        grads.append(p.grad)
        p.grad = None
    run = state.run_grad
    if role not in (HOLD, SYNC) and run is None:
        return grads
    first = run is None
    if first:
        run = state.run_grad = torch.empty(state.numel, dtype=torch.float32, device=state.device)
    for part, g in zip(state.param_slices(run), grads):
        if g is None:
            if first:
                part.zero_()
        elif first:
            part.copy_(g)  # exact: fp32 holds every bf16/fp16 value
        else:
            part.add_(g)
    if role in (HOLD, SYNC):
        return None
    state.run_grad = None
    return state.param_slices(run)
