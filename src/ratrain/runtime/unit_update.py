"""The step's end of a unit's training state: the squared norm of its gradient, the AdamW
update of its masters, and the zeroing of the accumulation for the next step (the N and U
lifecycle actions, and the host update thread's SU: runtime/carried_updates.py).

UnitState (runtime/unit_state.py) is this, with the view, the folds and the syncs that come
before; besides UnitBuffers' fields these read three of its own: `layout` (the state's layout
object), `_host_fold` (runtime/host_fold.HostFold) and `update_scratch`.
"""

from __future__ import annotations

import torch

from ratrain.runtime.host_grad import step_from_low
from ratrain.runtime.host_norm import host_sq_norm
from ratrain.runtime.unit_buffers import UnitBuffers


class UnitUpdate(UnitBuffers):
    """A unit's norm, update and zeroing (UnitState's; this module's docstring)."""

    @property
    def _host_homed_on_gpu(self) -> bool:
        """Computes on a GPU, with the state in (pinned) host memory."""
        return self.copies.stream is not None and self.home.type == "cpu"

    @property
    def _zeroes_lazily(self) -> bool:
        """The update leaves the accumulation as it is and marks it stale: the next step's
        first fold overwrites it (a host-homed GPU unit, synced in place, living for the step)."""
        return (self._host_homed_on_gpu and self.update_grad is self.grad
                and self.layout.grad_lifetime == "step")

    def sq_norm(self) -> torch.Tensor | None:
        """Squared L2 norm of the gradient this state updates with (fp32 scalar on the home;
        sharded: this replica's slice, zero where it is all padding); None without parameters.
        Per parameter the optimizer updates (sharded: per piece), as clip_grad_norm_ does: one
        fp32 norm over a block's ~10^6 elements was off by 8e-5 relative (tiny preset)."""
        if self.update_grad is None:
            return None
        self._host_fold.settle(self.grad)
        grads = [g for i, g in enumerate(self._master_grads())
                 if not (self.tied_copy and i == self.tied)]
        if not grads:
            return torch.zeros((), device=self.home)
        if self._host_homed_on_gpu:
            return host_sq_norm(grads)
        norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads])
        return (norms * norms).sum()

    def _master_grads(self) -> list[torch.Tensor]:
        """Each master's gradient: its `.grad`, or its slice of a bf16 accumulation."""
        if self.update_grad.dtype == torch.float32:
            return [m.grad for m in self.masters]
        return self.param_slices(self.update_grad)

    def update(self, grad_factor: torch.Tensor | float | None = None,
               found_inf: torch.Tensor | None = None) -> None:
        """Scale the synced gradient by `grad_factor` if given (clipping, loss-scale removal:
        a 0-d fp32 tensor or a float, on any device), take the AdamW step on the masters, zero
        the gradients. A view made before is stale. `found_inf`: a 0-d tensor, 1.0 where the
        step overflowed: the step is skipped, the gradients zeroed all the same; the fused
        AdamW reads it where it runs (as GradScaler sets it): the host never waits for it."""
        if self.update_grad is None:  # no parameters
            return
        self.step_masters(grad_factor, found_inf)
        self.record_optimizer()

    def step_masters(self, grad_factor: torch.Tensor | float | None = None,
                     found_inf: torch.Tensor | None = None) -> None:
        """update's arithmetic, which a host update thread may run (SU): only this unit's
        masters, gradients and AdamW state; the fold finished (finish_fold) on the walker.

        Where the host updates for a GPU its thread sets the step, so it makes one pass, not
        three: the fused AdamW divides by 1 / grad_factor as it reads (`grad_scale`) and the
        zeroing is lazy (_zeroes_lazily); 50M fp32 parameters on 2 cores: 30 ms, against 4-8
        ms more for the scaling and 6-8 for the zeroing (2026-11-27). The reciprocal can
        differ from clip_grad_norm_'s product in the last bit; no CPU-only run takes it."""
        if found_inf is not None:
            found_inf = _at(found_inf, self.home)
        self._host_fold.settle(self.grad)
        if self.optimizer is not None:
            scale, low = None, self.update_grad.dtype != torch.float32
            if grad_factor is not None and self._host_homed_on_gpu:
                scale = torch.as_tensor(_at(grad_factor, self.home), dtype=torch.float32).reciprocal()
                grad_factor = None
            elif grad_factor is not None and not low:
                self.update_grad.mul_(_at(grad_factor, self.home))
            self.optimizer.grad_scale, self.optimizer.found_inf = scale, found_inf
            try:
                if low:  # scaled in fp32, once cast (a bf16 product would round again)
                    step_from_low(self.optimizer, self.masters, self._master_grads(),
                                  self.update_scratch, _at(grad_factor, self.home))
                else:
                    self.optimizer.step()
            finally:
                self.optimizer.grad_scale = self.optimizer.found_inf = None
        self.layout.updated(self, found_inf)
        self.zero_grad()

    def record_optimizer(self) -> None:
        """The AdamW state (made by the first update) on the ledger, from the walker's thread."""
        if self.optimizer is not None:
            self.ledger.hold(("optimizer", self), "optimizer", [
                t for state in self.optimizer.state.values() for t in state.values()
                if torch.is_tensor(t)])

    def zero_grad(self) -> None:
        lazily = self._zeroes_lazily and self.grad is not None
        self._host_fold.zeroed(lazily)
        if self.grad is not None and not lazily:
            self.grad.zero_()
        if self.update_grad is not None and self.update_grad is not self.grad:
            self.update_grad.zero_()


def _at(t: torch.Tensor | float, home: torch.device) -> torch.Tensor | float:
    """A 0-d tensor as fp32 on the state's home (no copy where it is there already); to a GPU
    without blocking the host, to the host with it (the host reads it next). A float as is."""
    if not torch.is_tensor(t):
        return t
    return t.to(home, torch.float32, non_blocking=home.type != "cpu")
