"""How a unit's training state is laid out over its data-parallel replicas (the layouts a
runtime/unit_state.UnitState holds), and the replicated layout: every replica holds the whole unit.

A layout decides what differs between ways of keeping a unit's state, so that one unit-state class
serves them all:
    build         where the fp32 masters live and how they are cut into the parameters the
                  optimizer updates (`state.masters`), the gradient buffers (`state.grad`, the
                  full accumulation every backward folds into; `state.update_grad`, what the
                  update reads once synced), and their entries in the memory ledger
    make_view     how the compute view is made from the masters (P), wait_view its wait (WP)
    accumulation  the full-size buffer a backward folds into (made anew where it was freed)
    start_sync    how the gradient is synced over the replicas (GS), synced what follows it
    start_reduce  how one micro-batch's gradient is reduced (RS), reduced what follows it
    start_cross_sync  how a shard's gradient is summed across shard groups (GX)
    updated       what it must count of the updates it takes (checkpoints)
    full_masters, load_masters, optimizer_state, load_optimizer_state
                  how checkpoints read and write the state: always whole units, in the format an
                  unsharded AdamW over the unit's parameters has, so a checkpoint resumes under
                  any layout
The unit state keeps what is the same for all: the view's lifetime, folding each backward's
gradients into `state.grad`, the norm over `state.masters`' gradients, the update, the zeroing.
A layout object belongs to one unit (it may hold that unit's geometry and its own buffers). Its
methods are handed the unit state as runtime/unit_buffers.UnitBuffers, the fields it fills and
reads, not as the UnitState that holds the layout.

Replicated: the masters are one fp32 tensor per parameter in the home tier (the module's own
parameters where there is no view); the gradient accumulation is one flat fp32 buffer of which
every master's `.grad` is a view (or a bf16 one, which no `.grad` can be: runtime/host_grad.py),
so the sync is a single all-reduce of it in place (no copy in or out) and the update reads it
where it is. On the host, masters and gradient are carved from one block of the unit's exact
size (runtime/host_arena.py). The view is one compute-dtype tensor per parameter, copied from
its master by the copy engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch import nn

from ratrain.runtime.host_arena import carved_nbytes

if TYPE_CHECKING:
    from ratrain.runtime.unit_buffers import UnitBuffers

NewOptimizer = Callable[..., "torch.optim.Optimizer | None"]
"""new_optimizer(params, decay=None): the AdamW over `params` (None without any); `decay` says
per parameter whether weight decay applies where the tensors are not the model's own."""


class StateLayout:
    """The contract between a unit state and its layout (see the module docstring)."""

    home: torch.device | None = None
    """Where the masters, gradients and optimizer state live; None: the compute device."""

    grad_lifetime: str = "step"
    """How long `state.grad`, the full-size accumulation, lives (schedule/plan_rules.GRAD_LIFETIMES):
    "step", from build on; otherwise the layout frees it once it is reduced and the next
    backward makes it anew (`accumulation`)."""

    def accumulation(self, state: UnitBuffers) -> torch.Tensor:
        """The full-size fp32 buffer a backward's gradients fold into."""
        return state.grad

    def synced(self, state: UnitBuffers) -> None:
        """After the sync started by start_sync has completed."""

    def start_reduce(self, state: UnitBuffers) -> dist.Work:
        """Reduce one micro-batch's gradient (gradient lifetime "micro-batch")."""
        raise NotImplementedError(f"{type(self).__name__} reduces a gradient once per step")

    def reduced(self, state: UnitBuffers) -> None:
        """After the reduction started by start_reduce has completed."""
        raise NotImplementedError

    def start_cross_sync(self, state: UnitBuffers) -> dist.Work:
        """Sum the shard's gradient across shard groups (hybrid sharding, GX)."""
        raise NotImplementedError(f"{type(self).__name__} is not sharded within groups")

    def build(self, state: UnitBuffers, new_optimizer: NewOptimizer) -> None:
        raise NotImplementedError

    def make_view(self, state: UnitBuffers) -> dist.Work | None:
        """Start making the view into `state.params`; returns a collective to wait for, if any."""
        raise NotImplementedError

    def wait_view(self, state: UnitBuffers) -> None:
        raise NotImplementedError

    def start_sync(self, state: UnitBuffers, group) -> dist.Work | None:
        raise NotImplementedError

    def updated(self, state: UnitBuffers, found_inf: torch.Tensor | None) -> None:
        """After each update (found_inf: the step was skipped where it is 1; on the home)."""

    def full_masters(self, state: UnitBuffers) -> list[torch.Tensor]:
        raise NotImplementedError

    def load_masters(self, state: UnitBuffers, tensors: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def optimizer_state(self, state: UnitBuffers) -> dict | None:
        raise NotImplementedError

    def load_optimizer_state(self, state: UnitBuffers, sd: dict) -> None:
        raise NotImplementedError


class Replicated(StateLayout):
    """Every replica holds the whole unit; `home` "cpu" puts the state on the host."""

    def __init__(self, home: torch.device | None = None, grad_dtype: torch.dtype = torch.float32):
        """`grad_dtype`: the accumulation's (bf16 for a host-homed viewed unit under
        PipelinePlan.host_grad_dtype: runtime/host_grad.py; its masters then have no `.grad`)."""
        self.home = home
        self.grad_dtype = grad_dtype
        self._ready = None  # the view copy's event (None on a CPU-only run)

    def build(self, state: UnitBuffers, new_optimizer: NewOptimizer) -> None:
        params = state.params
        viewed = state.view_dtype is not None and bool(params)
        new = self._home_tensors(state, viewed) if params else None
        if viewed:
            state.masters = [nn.Parameter(new(p.shape).copy_(p.detach())) for p in params]
            state.empty_view()
        else:
            state.masters = params
        state.optimizer = new_optimizer(state.masters)
        if params:
            state.grad = new([state.numel], self.grad_dtype).zero_()
            if self.grad_dtype == torch.float32:
                for m, g in zip(state.masters, state.param_slices(state.grad)):
                    m.grad = g
        state.update_grad = state.grad  # all-reduced in place
        state.ledger.hold(("masters", state), "masters", state.masters)
        state.ledger.hold(("gradients", state), "gradients", [state.grad])

    def _home_tensors(self, state: UnitBuffers, viewed: bool) -> Callable[..., torch.Tensor]:
        """What makes the unit's fp32 tensors in its home, in order: each master (where there
        is a view), then the flat gradient. On the host they live for the run with sizes known
        now: one block of their exact size (runtime/host_arena.py; pinned per tensor, each
        would be rounded up to a power of two)."""
        if state.home.type != "cpu":
            return lambda shape, dtype=torch.float32: torch.empty(shape, dtype=dtype,
                                                                  device=state.home)
        sizes = [4 * n for n in state.sizes] if viewed else []
        grad = self.grad_dtype.itemsize * state.numel
        arena = state.copies.host_arena(carved_nbytes([*sizes, grad]))
        return lambda shape, dtype=torch.float32: arena.take(shape, dtype)

    # -- the view: a copy of each master (into the buffer a resident view keeps) --------------

    def make_view(self, state: UnitBuffers) -> None:
        for p, m in zip(state.params, state.masters):
            if p.numel() != m.numel():
                p.data = torch.empty(m.shape, dtype=state.view_dtype, device=state.device)
            self._ready = state.copies.copy(p.data, m.detach())
        return None

    def wait_view(self, state: UnitBuffers) -> None:
        state.copies.wait(self._ready)
        self._ready = None

    # -- sync ---------------------------------------------------------------------------------

    def start_sync(self, state: UnitBuffers, group) -> dist.Work | None:
        """The sum over the group, in place (the loss is already scaled by 1/dp: the mean)."""
        if state.grad is None:
            return None
        return dist.all_reduce(state.grad, group=group, async_op=True)

    # -- checkpoints: the state is whole already ----------------------------------------------

    def full_masters(self, state: UnitBuffers) -> list[torch.Tensor]:
        return [m.detach() for m in state.masters]

    @torch.no_grad()
    def load_masters(self, state: UnitBuffers, tensors: list[torch.Tensor]) -> None:
        for m, t in zip(state.masters, tensors):
            m.copy_(t)

    def optimizer_state(self, state: UnitBuffers) -> dict | None:
        return state.optimizer.state_dict() if state.optimizer is not None else None

    def load_optimizer_state(self, state: UnitBuffers, sd: dict) -> None:
        state.optimizer.load_state_dict(sd)
