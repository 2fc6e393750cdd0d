"""A host-homed unit's gradient accumulated in bf16 (PipelinePlan.host_grad_dtype "bfloat16"):
2 bytes a parameter on the host instead of 4. With exact clipping every unit's gradient is
alive at the global norm, so at llama2-7b that is 13.5 GB of the host's 108 GB of state; the
folds' copies across the link halve too (each is cast on the device: CopyEngine.copy).

torch's fused AdamW takes gradients in its parameters' dtype only, so the update casts the
gradient into an fp32 scratch a chunk at a time (`CHUNK` elements) and runs the fused AdamW on
that chunk of the master and its moments at once (`step_from_low`, through torch's functional
`adamw`): the cast's fp32 is read back from cache, not from memory, and the scratch is a chunk,
not the largest parameter (0.52 GB at 7B). The update costs 1.23-1.25x the fp32 one, against
1.36-1.38x when each whole parameter was cast before its step (bench/host_grad_update.py, 2
cores, 2026-11-29: docs/benchmarks.md). The fused AdamW is elementwise, so a chunk's step
computes what the whole parameter's does, bit for bit (tests/unit/test_host_grad.py). A stage's
host units update on one thread (carried: the update thread; inline: the walker), so one
scratch serves them all.

What it costs in precision: each fold rounds the accumulation to bf16 (a run's fp32 sum or a
view's gradient once; a later fold's add again), so the update reads gradients good to bf16's
8 bits, as a bf16 reduce-scatter or all-reduce leaves them elsewhere. The norm reads them in
fp32 arithmetic. Over a run it shows: docs/correctness.md (300 steps of `tiny`).
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw

LOW = torch.bfloat16


CHUNK = 1 << 22
"""Elements cast and stepped at a time: 16 MB of fp32 scratch and 8 MB of bf16 gradient, which
stay in cache between the cast and the AdamW that reads them (1M and 8M were slower on the 2-core
VM). A multiple of the kernel's vector width: chunks cut elsewhere send some elements down the
kernel's scalar tail, whose rounding differs from its vector loop's (a 100-element chunk did)."""


def update_scratch(numels: list[int]) -> torch.Tensor | None:
    """The fp32 scratch for parameters of these sizes (the stage's bf16-gradient ones); None
    without any. Host memory the update alone touches: not pinned."""
    return torch.empty(min(max(numels), CHUNK), dtype=torch.float32) if numels else None


def step_from_low(optimizer: torch.optim.AdamW, masters: list[torch.Tensor],
                  grads: list[torch.Tensor], scratch: torch.Tensor,
                  factor: torch.Tensor | float | None = None) -> None:
    """optimizer.step() over `masters` (contiguous) with their gradients `grads` (bf16, one
    per master, in order) times `factor` where given, chunk by chunk through `scratch`. The
    optimizer's grad_scale and found_inf, where set, apply to every parameter's step; its
    state is made as its own first step makes it, so checkpoints read it as ever."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for m, g in zip(masters, grads):
        group, state = groups[id(m)], optimizer.state[m]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=m.device)
            state["exp_avg"] = torch.zeros_like(m, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(m, memory_format=torch.preserve_format)
        step, before = state["step"], state["step"].clone()
        flat = [t.view(-1) for t in (m, g, state["exp_avg"], state["exp_avg_sq"])]
        for a in range(0, m.numel(), scratch.numel()):
            b = min(a + scratch.numel(), m.numel())
            grad = scratch[:b - a].copy_(flat[1][a:b])
            if factor is not None:
                grad.mul_(factor)
            step.copy_(before)  # each chunk takes the one step from the same count
            adamw([flat[0][a:b]], [grad], [flat[2][a:b]], [flat[3][a:b]], [], [step],
                  fused=True, grad_scale=getattr(optimizer, "grad_scale", None),
                  found_inf=getattr(optimizer, "found_inf", None),
                  amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1],
                  lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                  maximize=group["maximize"])
