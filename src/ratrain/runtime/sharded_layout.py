"""The sharded layout of a unit's training state over its data-parallel replicas (ZeRO-style).

The unit's parameters, flattened and concatenated in order and padded with zeros to N_pad = dp * S
elements, are cut into dp contiguous slices of S; replica r holds slice r of the fp32 masters and
of the AdamW state, and nothing else of them. What each lifecycle action does (the unit state,
runtime/unit_state.py, calls this layout for what differs from a replicated state):

    P u   cast the master slice into its slot of a flat N_pad buffer in the compute dtype, then
          all-gather the slots: the module's parameters are views into that buffer
    B u   the view's gradients fold into a full flat fp32 accumulation (N_pad), as unsharded
    GS u  reduce-scatter that accumulation: each replica gets the sum of its own slice
    RS u.m  (gradient lifetime "micro-batch") reduce-scatter one micro-batch's accumulation into
          a slice-sized buffer; WRS u.m adds it to the slice's gradient
    GX u  (hybrid sharding) all-reduce the slice's gradient over the replicas that hold the same
          slice in the other shard groups; the layout's `group` is then the replica's shard
          group (neighbouring replicas, a node's), not all of the stage's replicas

How long the full accumulation lives is the layout's `grad_lifetime`: "step", allocated once and
kept; "transient", made by the unit's first backward of the step and freed when its
reduce-scatter has completed;
"micro-batch", made by each backward and freed when that micro-batch's reduce-scatter has
completed. What persists: N_pad + S floats a unit ("step"), S ("transient"), 2 S
("micro-batch": the slice's gradient and the reduction's output). Reduce-scatters are fp32
whatever the compute dtype: the gradient is reduced as the unsharded all-reduce reduces it, so
losses match the replicated run; a compute-dtype reduction would halve the traffic (bfloat16)
and round each micro-batch's partial sums.

On gloo a reduce-scatter is an all-reduce of the full-size buffer in place, and the replica
copies its slice out once the wait returns. gloo's own flat reduce-scatter does the same
arithmetic, but on a clone of the input: a hidden full-size buffer per reduction in flight,
outside the ledger. Its work also ignores the wait's deadline and has no future for the trace.
(torch 2.13, ProcessGroupGloo::reduce_scatter_tensor_coalesced.) The full-size buffer is not
read again before it is zeroed or freed, so summing into it in place is safe.
    N     the squared norm of the slice (the executor then sums it over the replicas)
    U u   AdamW on the slice, then zero both gradient buffers; the view is stale

AdamW is elementwise, so a replica updates its slice exactly as an unsharded replica would update
those elements; the optimizer runs over "pieces", one 1-D parameter per original tensor that meets
the slice (views into the flat master slice), so weight decay follows the original tensor's rule.
Checkpoints gather the whole unit (full_masters, optimizer_state) in the unsharded format, so a
checkpoint resumes under any layout, sharded or not. The state lives on the compute device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from ratrain.runtime.optim import set_lr
from ratrain.runtime.state_layout import NewOptimizer, StateLayout

if TYPE_CHECKING:
    from ratrain.runtime.unit_buffers import UnitBuffers

# torch 2.13 renamed the flat collectives; GPU users may run an older torch (>= 2.4).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Sharded(StateLayout):
    """Slice `replica` of `replicas` of the unit, over `group` (the stage's replicas)."""

    def __init__(self, group, replica: int, replicas: int, grad_lifetime: str = "step",
                 cross=None):
        self.group, self.replica, self.replicas = group, replica, replicas
        self.cross = cross  # hybrid sharding: the same slice's replicas in the other groups
        self.grad_lifetime = grad_lifetime
        self._gather_work = None  # the view's all-gather in flight
        self._incoming: torch.Tensor | None = None  # RS's output ("micro-batch")
        # gloo: (slice-sized output, full-size buffer being summed in place) of the reduction
        # in flight, whose slice is copied out once it has completed
        self._in_place = group is not None and dist.get_backend(group) == "gloo"
        self._scattering: tuple[torch.Tensor, torch.Tensor] | None = None

    def build(self, state: UnitBuffers, new_optimizer: NewOptimizer) -> None:
        if state.view_dtype is None or not state.params:
            raise ValueError("a sharded state computes with a gathered view of its parameters")
        self._new_optimizer = new_optimizer
        device = state.device
        self.shard = -(-state.numel // self.replicas)  # S: elements per replica, the last padded
        self.lo = self.replica * self.shard  # this replica's slice of the flat parameters
        self.hi = min(self.lo + self.shard, state.numel)

        flat = torch.cat([p.detach().reshape(-1).float() for p in state.params])
        self.master = torch.zeros(self.shard, dtype=torch.float32, device=device)
        if self.hi > self.lo:
            self.master[:self.hi - self.lo] = flat[self.lo:self.hi]
        del flat
        # The pieces: where each original tensor meets the slice, a view of the master slice.
        self.pieces: list[nn.Parameter] = []
        self._piece_of: list[tuple[int, int, int]] = []  # (param index, start in param, stop)
        for i, (offset, n) in enumerate(zip(state.offsets, state.sizes)):
            a, b = max(offset, self.lo), min(offset + n, self.hi)
            if a < b:
                self.pieces.append(nn.Parameter(self.master[a - self.lo:b - self.lo]))
                self._piece_of.append((i, a - offset, b - offset))
        state.masters = self.pieces
        decay = [len(state.shapes[i]) >= 2 for i, _, _ in self._piece_of]
        state.optimizer = new_optimizer(self.pieces, decay) if self.pieces else None

        state.update_grad = torch.zeros(self.shard, dtype=torch.float32, device=device)
        for piece, (i, a, b) in zip(self.pieces, self._piece_of):
            piece.grad = state.update_grad[self._in_slice(state, i, a):self._in_slice(state, i, b)]
        state.empty_view()  # `state.view`: the flat gathered buffer in the compute dtype, once made
        state.ledger.hold(("masters", state), "masters", [self.master])
        held = [state.update_grad]
        if self.grad_lifetime == "step":
            state.grad = self._new_accumulation(state)
            held.append(state.grad)
        elif self.grad_lifetime == "micro-batch":
            self._incoming = torch.zeros(self.shard, dtype=torch.float32, device=device)
            held.append(self._incoming)
        state.ledger.hold(("gradients", state), "gradients", held)
        # AdamW steps taken (every replica takes them together), counted on the device so that
        # a skipped step (found_inf) is counted without the host reading it.
        self.steps = torch.zeros((), dtype=torch.float32, device=device)

    def _new_accumulation(self, state: UnitBuffers) -> torch.Tensor:
        return torch.zeros(self.shard * self.replicas, dtype=torch.float32, device=state.device)

    def _in_slice(self, state: UnitBuffers, i: int, at: int) -> int:
        """Where element `at` of parameter i lies in the replica's slice."""
        return state.offsets[i] + at - self.lo

    # -- the compute view: an all-gather of the slices ----------------------------------------

    def make_view(self, state: UnitBuffers) -> dist.Work:
        """This replica's slice, cast, into its slot, then the all-gather of every slot (in
        place: the slot is the input). Returns the gather."""
        if state.view is None:
            state.view = torch.empty(self.shard * self.replicas, dtype=state.view_dtype,
                                     device=state.device)
            for p, view in zip(state.params, state.param_slices(state.view)):
                p.data = view
        slot = state.view[self.lo:self.lo + self.shard]
        slot.copy_(self.master)
        self._gather_work = _all_gather(state.view, slot, group=self.group, async_op=True)
        return self._gather_work

    def wait_view(self, state: UnitBuffers) -> None:
        if self._gather_work is not None:
            self._gather_work.wait()
            self._gather_work = None

    # -- sync, update -------------------------------------------------------------------------

    def accumulation(self, state: UnitBuffers) -> torch.Tensor:
        if state.grad is None:
            state.grad = self._new_accumulation(state)
        return state.grad

    def _start_reduce_scatter(self, out: torch.Tensor, full: torch.Tensor) -> dist.Work:
        """This replica's slice of the sum of `full` over the group, into `out` once
        `_finish_reduce_scatter` has run after the wait."""
        if self._in_place:
            self._scattering = (out, full)
            return dist.all_reduce(full, group=self.group, async_op=True)
        return _reduce_scatter(out, full, group=self.group, async_op=True)

    def _finish_reduce_scatter(self) -> None:
        if self._scattering is not None:
            out, full = self._scattering
            self._scattering = None
            out.copy_(full[self.lo:self.lo + self.shard])

    def start_sync(self, state: UnitBuffers, group=None) -> dist.Work:
        """The reduce-scatter: this replica's slice of the sum over the replicas (the loss is
        already scaled by 1/dp, so the sum is the mean). Over the layout's own group."""
        return self._start_reduce_scatter(state.update_grad, self.accumulation(state))

    def synced(self, state: UnitBuffers) -> None:
        self._finish_reduce_scatter()
        if self.grad_lifetime != "step":
            state.grad = None

    def start_reduce(self, state: UnitBuffers) -> dist.Work:
        """One micro-batch's reduce-scatter, into a slice-sized buffer (the slice's gradient
        still accumulates the earlier micro-batches')."""
        return self._start_reduce_scatter(self._incoming, state.grad)

    def reduced(self, state: UnitBuffers) -> None:
        self._finish_reduce_scatter()
        state.update_grad.add_(self._incoming)
        state.grad = None

    def start_cross_sync(self, state: UnitBuffers) -> dist.Work:
        """Hybrid sharding: the slice's gradient, summed within the group, summed over the
        groups (in place)."""
        return dist.all_reduce(state.update_grad, group=self.cross, async_op=True)

    def updated(self, state: UnitBuffers, found_inf: torch.Tensor | None) -> None:
        self.steps.add_(1)
        if found_inf is not None:
            self.steps.sub_(found_inf)

    # -- checkpoints: the whole unit, in the unsharded format ---------------------------------

    def whole(self, state: UnitBuffers, slice_: torch.Tensor) -> torch.Tensor:
        """The flat N-element whole of one S-element slice per replica (a collective)."""
        whole = torch.empty(self.shard * self.replicas, dtype=slice_.dtype, device=state.device)
        _all_gather(whole, slice_.contiguous(), group=self.group)
        return whole[:state.numel]

    def _slice_of_pieces(self, state: UnitBuffers, key: str) -> torch.Tensor:
        """The optimizer's `key` state of every piece, laid out as the master slice."""
        out = torch.zeros(self.shard, dtype=torch.float32, device=state.device)
        for piece, (i, a, b) in zip(self.pieces, self._piece_of):
            out[self._in_slice(state, i, a):self._in_slice(state, i, b)] = (
                state.optimizer.state[piece][key])
        return out

    def full_masters(self, state: UnitBuffers) -> list[torch.Tensor]:
        return [t.clone() for t in state.param_slices(self.whole(state, self.master))]

    def slice_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This replica's S-element slice of a flat N-element whole (whole's inverse)."""
        out = torch.zeros(self.shard, dtype=flat.dtype, device=self.master.device)
        if self.hi > self.lo:
            out[:self.hi - self.lo] = flat[self.lo:self.hi]
        return out

    def load_masters(self, state: UnitBuffers, tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1).float().to(state.device) for t in tensors])
        with torch.no_grad():
            self.master.copy_(self.slice_of(flat))

    def _template(self, state: UnitBuffers
                  ) -> tuple[torch.optim.Optimizer | None, list[torch.Tensor]]:
        """An AdamW over stand-ins of the unit's parameters (no elements, the right number of
        dimensions: the rule for weight decay reads it), and the stand-ins in the parameters'
        order: its state_dict is the unsharded format."""
        stand_ins = [torch.empty((0,) * len(shape)) for shape in state.shapes]
        return self._new_optimizer(stand_ins, None), stand_ins

    def optimizer_state(self, state: UnitBuffers) -> dict | None:
        """The unit's AdamW state as an unsharded AdamW over its parameters would hold it
        (every replica joins the gathers; their results are equal)."""
        template, stand_ins = self._template(state)
        if template is None:
            return None
        if state.optimizer is not None:
            set_lr([template], state.optimizer.param_groups[0]["lr"])
        updates = int(self.steps)
        if updates:
            moments = {k: state.param_slices(self.whole(state, self._slice_of_pieces(state, k)))
                       for k in ("exp_avg", "exp_avg_sq")}
            for i, p in enumerate(stand_ins):
                template.state[p] = {"step": torch.tensor(float(updates)),
                                     **{k: moments[k][i].cpu().clone() for k in moments}}
        return template.state_dict()

    def load_optimizer_state(self, state: UnitBuffers, sd: dict) -> None:
        """Take this replica's slice of an unsharded AdamW state (optimizer_state's format)."""
        template, stand_ins = self._template(state)
        template.load_state_dict(sd)
        by_param = [template.state.get(p, {}) for p in stand_ins]
        self.steps.fill_(int(by_param[0]["step"]) if by_param and by_param[0] else 0)
        if state.optimizer is None:
            return
        sharded = state.optimizer.state_dict()
        index = {id(p): k for k, p in enumerate(q for g in state.optimizer.param_groups
                                                 for q in g["params"])}
        sharded["state"] = {
            index[id(piece)]: {"step": by_param[i]["step"].clone(),
                               **{k: by_param[i][k].reshape(-1)[a:b].clone()
                                  for k in ("exp_avg", "exp_avg_sq")}}
            for piece, (i, a, b) in zip(self.pieces, self._piece_of) if by_param[i]}
        state.optimizer.load_state_dict(sharded)
