"""A host-homed unit's gradient accumulated in bf16 (PipelinePlan.host_grad_dtype "bfloat16"):
2 bytes a parameter on the host instead of 4. With exact clipping every unit's gradient is
alive at the global norm, so at llama2-7b that is 13.5 GB of the host's 108 GB of state; the
folds' copies across the link halve too (each is cast on the device: CopyEngine.copy).

torch's fused AdamW takes gradients in its parameters' dtype only, so the update casts each
parameter's gradient into one fp32 scratch, sized for the stage's largest such parameter, just
before that parameter's own AdamW step (`step_from_low`): a cast pass more of host work (read
2, write 4 bytes a parameter), the scratch one parameter's, not a unit's. A stage's host units
update on one thread (carried: the update thread; inline: the walker), so one scratch serves
them all. Stepping parameter by parameter computes what one step over all of them does: the
fused AdamW is one kernel per tensor (runtime/optim.py).

What it costs in precision: each fold rounds the accumulation to bf16 (a run's fp32 sum or a
view's gradient once; a later fold's add again), so the update reads gradients good to bf16's
8 bits, as a bf16 reduce-scatter or all-reduce leaves them elsewhere. The norm reads them in
fp32 arithmetic.
"""

from __future__ import annotations

import torch

LOW = torch.bfloat16


def update_scratch(numels: list[int]) -> torch.Tensor | None:
    """The fp32 scratch for parameters of these sizes (the stage's bf16-gradient ones); None
    without any. Host memory the update alone touches: not pinned."""
    return torch.empty(max(numels), dtype=torch.float32) if numels else None


def step_from_low(optimizer: torch.optim.Optimizer, masters: list[torch.Tensor],
                  grads: list[torch.Tensor], scratch: torch.Tensor,
                  factor: torch.Tensor | float | None = None) -> None:
    """optimizer.step() over `masters` with their gradients `grads` (bf16, one per master, in
    order) times `factor` where given, one parameter at a time through `scratch`. The
    optimizer's grad_scale and found_inf, where set, apply to every parameter's step."""
    for m, g in zip(masters, grads):
        m.grad = scratch[:g.numel()].view(g.shape).copy_(g)
        if factor is not None:
            m.grad.mul_(factor)
        try:
            optimizer.step()
        finally:
            m.grad = None
