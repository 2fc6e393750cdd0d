"""The training state of one unit: what the lifecycle actions (P, WP, X, GS, WGS, N, U) act on.

A unit's state is its fp32 master weights and AdamW state in their home tier (the compute device,
or the host), the fp32 gradients accumulated there, the gradient sync it has in flight, and its
compute view: the weights in the compute dtype on the compute device, which the unit's module
computes with. With a view (the program prefetches one: `P u`), the module's parameters hold the
view and are emptied when the program releases it (`X u`); each backward's gradient comes out on
the view in the compute dtype and is folded into the fp32 accumulation at once. Without one, the
view *is* the master: the module's parameters are the masters and backward accumulates straight
into their gradients.

The gradients accumulate in one flat fp32 buffer (`grad`, the parameters in order; bf16 for
host-homed state under --host-grad-dtype bfloat16: runtime/host_grad.py); the update reads
`update_grad` (the same buffer where the sync reduces it in place), scales it, takes the AdamW
step and zeroes both. Where the host updates for a GPU, the scaling is the fused AdamW's own
and the zeroing is left to the next step's first fold, which overwrites it (step_masters).

One class serves every way of keeping the state over the data-parallel replicas; what differs
between them is the state's layout object (runtime/state_layout.py: the replicated one, and the
contract; runtime/sharded_layout.py: ZeRO-style slices): where the masters and the optimizer live
and how they are cut, how the gradient is synced, how the view is made, how checkpoints read the
state. A new way (a gradient buffer that lives only until its reduce-scatter, say) is a new
layout, not a new unit state. What stays here is what is the same for all of them: the view's
lifetime, folding the view's gradients into the accumulation, the syncs; and, in its base
runtime/unit_update.UnitUpdate, the norm, the update, the zeroing. The fields themselves, which
the layout fills, are runtime/unit_buffers.UnitBuffers'.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.host_fold import HostFold
from ratrain.runtime.memory_ledger import MemoryLedger
from ratrain.runtime.run_grads import gradients_to_fold
from ratrain.runtime.state_layout import NewOptimizer, Replicated, StateLayout
from ratrain.runtime.unit_update import UnitUpdate


class UnitState(UnitUpdate):
    """`params`: the unit's parameters (its module's own); `new_optimizer` makes the AdamW over
    what the layout gives it to update (`masters`); `view_dtype`: compute with a view in that
    dtype (None: with the masters themselves, which only the replicated layout allows);
    `layout`: replicated (on the compute device) unless given; `device`: where it computes
    (default: where its parameters are; a viewed unit's may still be on the host);
    `sums_on_device`: its gradient of the step is summed over the replicas on the compute
    device before it folds into the host's accumulation (PipelinePlan.device_grad_sum)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        new_optimizer: NewOptimizer,
        layout: StateLayout | None = None,
        *,
        view_dtype: torch.dtype | None = None,
        copies: CopyEngine | None = None,
        ledger: MemoryLedger | None = None,
        device: torch.device | None = None,
        sums_on_device: bool = False,
    ):
        self.layout = layout or Replicated()
        super().__init__(params, self.layout.home, view_dtype=view_dtype, copies=copies,
                         ledger=ledger, device=device)
        self.layout.build(self, new_optimizer)
        self._sync = None  # the gradient sync in flight (GS, GX, or one micro-batch's RS)
        self._host_fold = HostFold(self.copies)  # used where the state is across a host link
        self.run_grad: torch.Tensor | None = None  # a run's gradient sum (run_grads.py)
        self.sums_on_device = sums_on_device
        # where the accumulation is bf16: the stage's fp32 scratch its update casts into
        self.update_scratch: torch.Tensor | None = None

    @property
    def has_view(self) -> bool:
        return self.view_dtype is not None and bool(self.params)

    # -- the compute view ---------------------------------------------------------------------

    def prefetch(self) -> dist.Work | None:
        """Start making the view from the masters; returns the collective that makes it, if
        any (sharded: the all-gather), for the caller to wait on."""
        if not self.has_view:
            return None
        work = self.layout.make_view(self)
        self.ledger.hold(("views", self), "views", self.params)
        return work

    def view_tensors(self) -> list[torch.Tensor]:
        """The view's tensors once made (the `view` storage of the registry's P effect)."""
        return list(self.params) if self.has_view else []

    def wait_view(self) -> None:
        if self.has_view:
            self.layout.wait_view(self)

    def release_view(self) -> None:
        """Drop the view's memory; the masters stay in their home tier."""
        if self.has_view:
            self.empty_view()
            self.ledger.release(("views", self))

    def _accumulation_slices(self) -> list[torch.Tensor]:
        """Each parameter's region of the accumulation, shaped like it (what fold_grads adds
        to); the layout makes the accumulation anew where its gradient lifetime freed it, so
        nothing here keeps a reference to it."""
        return self.param_slices(self.layout.accumulation(self))

    def full_grad_storage(self) -> list[torch.Tensor]:
        """The accumulation where it lives shorter than the step (the `grad_full` storage of
        the registry's B and BW effects); where it lives for the step, the unit's state holds
        it already: nothing."""
        return [self.grad] if self.layout.grad_lifetime != "step" and self.grad is not None else []

    def fold_grads(self, role: str | None = None) -> None:
        """After a backward: add the view's gradients, in fp32, to the accumulation. `role`
        (unit_major.fold_roles): across a host link, a backward with more of its unit's to
        come in its run (HOLD) adds to the run's fp32 sum on the device, which the run's last
        folds (run_grads.py); the gradients cross as host_fold.py says. A unit that
        `sums_on_device` does so on any device; its run's sum (SYNC) waits for start_sync."""
        if not self.has_view:
            return
        if not (self._host_homed_on_gpu or self.sums_on_device):
            for p, acc in zip(self.params, self._accumulation_slices()):
                if p.grad is not None:
                    # a bf16 view's gradient into a bf16 accumulation as it is: the fp32 add's
                    # bits, where a mixed-dtype add_ ran 19x slower (20M elements, 2 cores)
                    same = p.grad.dtype == acc.dtype
                    acc.add_(p.grad.to(self.home, acc.dtype if same else torch.float32))
                    p.grad = None
            return
        grads = gradients_to_fold(self, role)
        if grads is not None:
            self._host_fold.fold(grads, self._accumulation_slices(),
                                 overwrite=self.layout.grad_lifetime == "step")

    def run_grad_storage(self) -> list[torch.Tensor]:
        """The run's fp32 gradient sum while a run holds one (the `grad_run` storage)."""
        return [] if self.run_grad is None else [self.run_grad]

    def finish_fold(self) -> None:
        """Wait for the last fold's copies and add them (a carried update's start does it in
        the walker's thread, before the update thread reads the gradient)."""
        self._host_fold.finish()

    # -- the gradient sync (the norm and the update: unit_update.py) --------------------------

    @property
    def syncing(self) -> bool:
        return self._sync is not None

    def start_sync(self, group=None) -> dist.Work | None:
        """Start summing the gradients over the data-parallel replicas (`group`; a sharded
        layout uses its own). Nothing may touch them until wait_sync. A run's sum waiting on the
        device (`sums_on_device`) is summed there and wait_sync folds it to the host."""
        if self.sums_on_device and self.run_grad is not None:
            self._sync = dist.all_reduce(self.run_grad, group=group, async_op=True)
            return self._sync
        self._host_fold.settle(self.grad)
        self._sync = self.layout.start_sync(self, group)
        return self._sync

    def wait_sync(self) -> None:
        summed = self.sums_on_device and self.run_grad is not None
        self._wait(UnitState._fold_summed if summed else self.layout.synced)

    def _fold_summed(self) -> None:
        """The summed run into the step's zero accumulation (a first fold's copy)."""
        run, self.run_grad = self.run_grad, None
        self._host_fold.fold(self.param_slices(run), self._accumulation_slices(), overwrite=True)

    def start_reduce(self) -> dist.Work:
        """Start reducing the micro-batch's gradient just accumulated over the replicas
        (gradient lifetime "micro-batch"); nothing may touch it until wait_reduce."""
        self._sync = self.layout.start_reduce(self)
        return self._sync

    def wait_reduce(self) -> None:
        """Add the reduced slice to the shard's gradient; the full-size one is freed."""
        self._wait(self.layout.reduced)

    def start_cross_sync(self) -> dist.Work:
        """Hybrid sharding: start summing the shard's gradient across the shard groups."""
        self._sync = self.layout.start_cross_sync(self)
        return self._sync

    def wait_cross_sync(self) -> None:
        self._wait()

    def tied_grad(self) -> torch.Tensor:
        """The tied parameter's region of the accumulation, for TS to sum in place."""
        self._host_fold.settle(self.grad)
        return self.param_slices(self.grad)[self.tied]

    def _wait(self, then: Callable[[UnitState], None] | None = None) -> None:
        """The wait of whichever sync is in flight (GS, RS or GX: one at a time), then what
        the layout does once it has completed (`then`)."""
        if self._sync is not None:
            self._sync.wait()
            self._sync = None
            if then is not None:
                then(self)

    # -- checkpoints: whole units, in the unsharded format ------------------------------------

    def full_masters(self) -> list[torch.Tensor]:
        """The fp32 masters, one per parameter in order (the whole unit; sharded: gathered,
        a collective every replica joins)."""
        return self.layout.full_masters(self)

    def load_masters(self, tensors: list[torch.Tensor]) -> None:
        """Whole fp32 masters, one per parameter in order (sharded: this replica keeps its slice)."""
        self.layout.load_masters(self, tensors)

    def optimizer_state(self) -> dict | None:
        """The AdamW state as an unsharded AdamW over the unit's parameters holds it."""
        return self.layout.optimizer_state(self)

    def load_optimizer_state(self, state: dict) -> None:
        self.layout.load_optimizer_state(self, state)
