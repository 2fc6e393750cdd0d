"""The training state of one unit: what the lifecycle actions (GS, WGS, N, U) act on.

A unit's state is its parameters (the fp32 masters; while the compute view has their dtype and
device, the view *is* the master), their gradients, its AdamW state, and the gradient sync it
has in flight. The gradients live in one flat fp32 buffer of which every parameter's `.grad` is a
view: backward accumulates into it in place over the micro-batches, the unit's sync is a single
all-reduce of it in place (no copy in or out), and the update consumes and zeroes it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class UnitState:
    def __init__(self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer | None):
        self.params = params
        self.optimizer = optimizer
        self.grad: torch.Tensor | None = None
        if params:
            self.grad = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32,
                                    device=params[0].device)
            offset = 0
            for p in params:
                p.grad = self.grad[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self._sync = None  # the all-reduce in flight

    @property
    def syncing(self) -> bool:
        return self._sync is not None

    def start_sync(self, group) -> dist.Work | None:
        """Start summing the gradients over the data-parallel group (the loss is already scaled
        by 1/dp, so the sum is the mean). Nothing may touch them until wait_sync."""
        if self.grad is not None:
            self._sync = dist.all_reduce(self.grad, group=group, async_op=True)
        return self._sync

    def wait_sync(self) -> None:
        if self._sync is not None:
            self._sync.wait()
            self._sync = None

    def sq_norm(self) -> torch.Tensor | None:
        """Squared L2 norm of the unit's gradient (fp32 scalar on its device); None without
        parameters.

        Per parameter, as clip_grad_norm_ does, not over the flat buffer: one fp32 norm over a
        whole block's ~10^6 elements is off by ~1e-5 relative (8e-5 seen on the tiny preset's
        real gradients), which moved the clipping coefficient away from the reference's."""
        if self.grad is None:
            return None
        norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in self.params])
        return (norms * norms).sum()

    def update(self, clip_coef: float | None = None) -> None:
        """Scale the gradients by `clip_coef` if given, take the AdamW step, zero them."""
        if self.optimizer is None:
            return
        if clip_coef is not None:
            self.grad.mul_(clip_coef)
        self.optimizer.step()
        self.zero_grad()

    def zero_grad(self) -> None:
        if self.grad is not None:
            self.grad.zero_()
