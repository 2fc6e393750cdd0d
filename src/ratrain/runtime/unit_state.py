"""The training state of one unit: what the lifecycle actions (P, WP, X, GS, WGS, N, U) act on.

A unit's state is its fp32 master weights and AdamW state in their home tier (the compute device,
or the host), the fp32 gradients accumulated there, the gradient sync it has in flight, and its
compute view: the weights in the compute dtype on the compute device, which the unit's module
computes with. With a view (the program prefetches one: `P u`), the module's parameters hold the
view and are emptied when the program releases it (`X u`); each backward's gradient comes out on
the view in the compute dtype and is folded into the fp32 accumulation at once. Without one, the
view *is* the master: the module's parameters are the masters and backward accumulates straight
into their gradients.

The gradients live in one flat fp32 buffer of which every master's `.grad` is a view: the unit's
sync is a single all-reduce of it in place (no copy in or out), and the update consumes and
zeroes it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.memory_ledger import MemoryLedger


class UnitState:
    def __init__(
        self,
        params: list[nn.Parameter],
        new_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer | None],
        *,
        view_dtype: torch.dtype | None = None,
        home: torch.device | None = None,
        copies: CopyEngine | None = None,
        ledger: MemoryLedger | None = None,
    ):
        self.params = params
        self.device = params[0].device if params else None
        self.home = home or self.device
        self.view_dtype = view_dtype
        self.copies = copies or CopyEngine(self.device or torch.device("cpu"))
        self.ledger = ledger or MemoryLedger()
        if view_dtype is not None and params:
            self.masters = [nn.Parameter(self._home_copy(p)) for p in params]
            self._empty_view()
        else:
            self.masters = params
        self.optimizer = new_optimizer(self.masters)
        self.grad: torch.Tensor | None = None
        if params:
            self.grad = torch.zeros(sum(m.numel() for m in self.masters), dtype=torch.float32,
                                    device=self.home, pin_memory=self._pinned)
            offset = 0
            for m in self.masters:
                m.grad = self.grad[offset:offset + m.numel()].view_as(m)
                offset += m.numel()
        self.ledger.hold(("masters", self), "masters", self.masters)
        self.ledger.hold(("gradients", self), "gradients", [self.grad])
        self._sync = None  # the all-reduce in flight
        self._view_ready = None  # the prefetch copy's event
        self._folding = None  # (event, [(master, pinned copy of its view's gradient)]) in flight

    @property
    def has_view(self) -> bool:
        return self.view_dtype is not None and bool(self.params)

    @property
    def _pinned(self) -> bool:
        return self.home.type == "cpu" and self.copies.stream is not None

    def _home_copy(self, p: nn.Parameter) -> torch.Tensor:
        master = (self.copies.host_empty(p, torch.float32) if self.home.type == "cpu"
                  else torch.empty(p.shape, dtype=torch.float32, device=self.home))
        master.copy_(p.detach())
        return master

    def _empty_view(self) -> None:
        for p in self.params:
            p.data = torch.empty(0, dtype=self.view_dtype, device=self.device)

    # -- the compute view ---------------------------------------------------------------------

    def prefetch(self) -> None:
        """Start making the view from the masters (into the buffer a resident view keeps)."""
        if not self.has_view:
            return
        for p, m in zip(self.params, self.masters):
            if p.numel() != m.numel():
                p.data = torch.empty(m.shape, dtype=self.view_dtype, device=self.device)
            self._view_ready = self.copies.copy(p.data, m.detach())
        self.ledger.hold(("views", self), "views", self.params)

    def wait_view(self) -> None:
        self.copies.wait(self._view_ready)
        self._view_ready = None

    def release_view(self) -> None:
        """Drop the view's memory; the masters stay in their home tier."""
        if self.has_view:
            self._empty_view()
            self.ledger.release(("views", self))

    def fold_grads(self) -> None:
        """After a backward: add the view's gradients, in fp32, to the masters' accumulation.

        From a GPU view to host masters the gradients leave on the copy stream into pinned
        buffers, and are added on the host only when something next reads the accumulation
        (the next fold of this unit, the sync, the norm, the update): by then the copy is long
        done, so the compute stream never waits for it."""
        if not self.has_view:
            return
        if self.copies.stream is None or self.home == self.device:
            for p, m in zip(self.params, self.masters):
                if p.grad is not None:
                    m.grad.add_(p.grad.to(self.home, torch.float32))
                    p.grad = None
            return
        self._finish_fold()
        staged, done = [], None
        for p, m in zip(self.params, self.masters):
            if p.grad is not None:
                host = self.copies.host_empty(p.grad)
                done = self.copies.copy(host, p.grad)
                staged.append((m, host))
                p.grad = None
        self._folding = (done, staged)

    def _finish_fold(self) -> None:
        if self._folding is None:
            return
        done, staged = self._folding
        self._folding = None
        if done is not None:
            done.synchronize()
        for m, host in staged:
            m.grad.add_(host.float())

    # -- sync, norm, update -------------------------------------------------------------------

    @property
    def syncing(self) -> bool:
        return self._sync is not None

    def start_sync(self, group) -> dist.Work | None:
        """Start summing the gradients over the data-parallel group (the loss is already scaled
        by 1/dp, so the sum is the mean). Nothing may touch them until wait_sync."""
        self._finish_fold()
        if self.grad is not None:
            self._sync = dist.all_reduce(self.grad, group=group, async_op=True)
        return self._sync

    def wait_sync(self) -> None:
        if self._sync is not None:
            self._sync.wait()
            self._sync = None

    def sq_norm(self) -> torch.Tensor | None:
        """Squared L2 norm of the unit's gradient (fp32 scalar where the state lives); None
        without parameters.

        Per parameter, as clip_grad_norm_ does, not over the flat buffer: one fp32 norm over a
        whole block's ~10^6 elements is off by ~1e-5 relative (8e-5 seen on the tiny preset's
        real gradients), which moved the clipping coefficient away from the reference's."""
        if self.grad is None:
            return None
        self._finish_fold()
        norms = torch.stack([torch.linalg.vector_norm(m.grad) for m in self.masters])
        return (norms * norms).sum()

    def update(self, grad_factor: float | None = None) -> None:
        """Scale the gradients by `grad_factor` if given (clipping, loss-scale removal), take the
        AdamW step on the masters, zero the gradients. A view made before is now stale."""
        if self.optimizer is None:
            return
        self._finish_fold()
        if grad_factor is not None:
            self.grad.mul_(grad_factor)
        self.optimizer.step()
        self.zero_grad()
        self.ledger.hold(("optimizer", self), "optimizer", [
            t for state in self.optimizer.state.values() for t in state.values() if torch.is_tensor(t)])

    def zero_grad(self) -> None:
        self._finish_fold()
        if self.grad is not None:
            self.grad.zero_()

    # -- checkpoints --------------------------------------------------------------------------

    def full_masters(self) -> list[torch.Tensor]:
        """The fp32 masters, one per parameter in order (the whole unit)."""
        return [m.detach() for m in self.masters]

    @torch.no_grad()
    def load_masters(self, tensors: list[torch.Tensor]) -> None:
        for m, t in zip(self.masters, tensors):
            m.copy_(t)

    def optimizer_state(self) -> dict | None:
        return self.optimizer.state_dict() if self.optimizer is not None else None

    def load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
