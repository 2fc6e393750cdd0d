"""A unit's training state sharded over its data-parallel replicas (ZeRO-style).

The unit's parameters, flattened and concatenated in order and padded with zeros to N_pad = dp * S
elements, are cut into dp contiguous slices of S; replica r holds slice r of the fp32 masters and
of the AdamW state, and nothing else of them. What each lifecycle action does:

    P u   cast the master slice into its slot of a flat N_pad buffer in the compute dtype, then
          all-gather the slots: the module's parameters are views into that buffer
    B u   the view's gradients fold into a full flat fp32 accumulation (N_pad), as unsharded
    GS u  reduce-scatter that accumulation: each replica gets the sum of its own slice
    N     the squared norm of the slice (the executor then sums it over the replicas)
    U u   AdamW on the slice, then zero both gradient buffers; the view is stale

AdamW is elementwise, so a replica updates its slice exactly as an unsharded replica would update
those elements; the optimizer runs over "pieces", one 1-D parameter per original tensor that meets
the slice (views into the flat master slice), so weight decay follows the original tensor's rule.
Checkpoints gather the whole unit (full_masters, optimizer_state) in the unsharded format, so a
checkpoint resumes under any layout, sharded or not.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ratrain.optim import set_lr
from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.memory_ledger import MemoryLedger
from ratrain.runtime.unit_state import UnitState

# torch 2.13 renamed the flat collectives; GPU users may run an older torch (>= 2.4).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ShardedUnitState(UnitState):
    def __init__(
        self,
        params: list[nn.Parameter],
        new_optimizer: Callable[..., torch.optim.Optimizer | None],
        *,
        view_dtype: torch.dtype,
        group,
        replica: int,
        replicas: int,
        copies: CopyEngine | None = None,
        ledger: MemoryLedger | None = None,
    ):
        self.params = params
        self.device = self.home = params[0].device
        self.view_dtype = view_dtype
        self.copies = copies or CopyEngine(self.device)
        self.ledger = ledger or MemoryLedger()
        self.group, self.replica, self.replicas = group, replica, replicas
        self.shapes = [p.shape for p in params]  # the view's, once gathered
        self.sizes = [p.numel() for p in params]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(params))]
        self.numel = sum(self.sizes)
        self.shard = -(-self.numel // replicas)  # S: elements per replica, the last one padded
        self.lo = replica * self.shard  # this replica's slice of the flat parameters
        self.hi = min(self.lo + self.shard, self.numel)

        flat = torch.cat([p.detach().reshape(-1).float() for p in params])
        self.master = torch.zeros(self.shard, dtype=torch.float32, device=self.device)
        if self.hi > self.lo:
            self.master[:self.hi - self.lo] = flat[self.lo:self.hi]
        del flat
        # The pieces: where each original tensor meets the slice, a view of the master slice.
        self.pieces: list[nn.Parameter] = []
        self._piece_of: list[tuple[int, int, int]] = []  # (param index, start in param, stop)
        for i, (offset, n) in enumerate(zip(self.offsets, self.sizes)):
            a, b = max(offset, self.lo), min(offset + n, self.hi)
            if a < b:
                self.pieces.append(nn.Parameter(self.master[a - self.lo:b - self.lo]))
                self._piece_of.append((i, a - offset, b - offset))
        self.masters = self.pieces
        decay = [len(self.shapes[i]) >= 2 for i, _, _ in self._piece_of]
        self.optimizer = new_optimizer(self.pieces, decay) if self.pieces else None
        self._new_optimizer = new_optimizer

        self.grad = torch.zeros(self.shard * replicas, dtype=torch.float32, device=self.device)
        self.shard_grad = torch.zeros(self.shard, dtype=torch.float32, device=self.device)
        for piece, (i, a, b) in zip(self.pieces, self._piece_of):
            piece.grad = self.shard_grad[self._in_slice(i, a):self._in_slice(i, b)]
        self._empty_view()  # `_view`: the flat gathered buffer in the compute dtype, once made
        self.ledger.hold(("masters", self), "masters", [self.master])
        self.ledger.hold(("gradients", self), "gradients", [self.grad, self.shard_grad])
        self._sync = None
        self._view_ready = None  # the all-gather in flight
        self._folding = None
        self.updates = 0  # AdamW steps taken: every replica takes them together

    def _in_slice(self, i: int, at: int) -> int:
        """Where element `at` of parameter i lies in the replica's slice."""
        return self.offsets[i] + at - self.lo

    @property
    def has_view(self) -> bool:
        return True

    def _param_slices(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's region of a flat (N or N_pad) tensor, shaped like the parameter."""
        return [flat[offset:offset + n].view(shape)
                for shape, offset, n in zip(self.shapes, self.offsets, self.sizes)]

    # -- the compute view: an all-gather of the slices ----------------------------------------

    def prefetch(self) -> dist.Work:
        """Start gathering the view: this replica's slice, cast, into its slot, then the
        all-gather of every slot (in place: the slot is the input). Returns the gather."""
        if self._view is None:
            self._view = torch.empty(self.shard * self.replicas, dtype=self.view_dtype,
                                     device=self.device)
            for p, view in zip(self.params, self._param_slices(self._view)):
                p.data = view
        slot = self._view[self.lo:self.lo + self.shard]
        slot.copy_(self.master)
        self._view_ready = _all_gather(self._view, slot, group=self.group, async_op=True)
        self.ledger.hold(("views", self), "views", [self._view])
        return self._view_ready

    def wait_view(self) -> None:
        if self._view_ready is not None:
            self._view_ready.wait()
            self._view_ready = None

    def release_view(self) -> None:
        self._empty_view()
        self.ledger.release(("views", self))

    def _empty_view(self) -> None:
        self._view = None
        for p in self.params:
            p.data = torch.empty(0, dtype=self.view_dtype, device=self.device)

    def fold_grads(self) -> None:
        """Add the view's gradients, in fp32, to the full accumulation."""
        for p, acc in zip(self.params, self._param_slices(self.grad)):
            if p.grad is not None:
                acc.add_(p.grad.float())
                p.grad = None

    # -- sync, norm, update -------------------------------------------------------------------

    def start_sync(self, group=None) -> dist.Work:
        """Start the reduce-scatter: this replica's slice of the sum over the replicas (the
        loss is already scaled by 1/dp, so the sum is the mean)."""
        self._sync = _reduce_scatter(self.shard_grad, self.grad, group=self.group, async_op=True)
        return self._sync

    def sq_norm(self) -> torch.Tensor:
        """Squared L2 norm of this replica's slice of the gradient, per piece (as exact as the
        unsharded per-tensor norms); zero where the slice is all padding."""
        if not self.pieces:
            return torch.zeros((), device=self.device)
        norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in self.pieces])
        return (norms * norms).sum()

    def update(self, grad_factor: float | None = None) -> None:
        self.updates += 1
        if self.optimizer is not None:
            if grad_factor is not None:
                self.shard_grad.mul_(grad_factor)
            self.optimizer.step()
            self.ledger.hold(("optimizer", self), "optimizer", [
                t for state in self.optimizer.state.values() for t in state.values()
                if torch.is_tensor(t)])
        self.zero_grad()

    def zero_grad(self) -> None:
        self.grad.zero_()
        self.shard_grad.zero_()

    # -- checkpoints: the whole unit, in the unsharded format ---------------------------------

    def _gather(self, slice_: torch.Tensor) -> torch.Tensor:
        """The flat N-element whole of one S-element slice per replica (a collective)."""
        whole = torch.empty(self.shard * self.replicas, dtype=slice_.dtype, device=self.device)
        _all_gather(whole, slice_.contiguous(), group=self.group)
        return whole[:self.numel]

    def _slice_of_pieces(self, key: str) -> torch.Tensor:
        """The optimizer's `key` state of every piece, laid out as the master slice."""
        out = torch.zeros(self.shard, dtype=torch.float32, device=self.device)
        for piece, (i, a, b) in zip(self.pieces, self._piece_of):
            out[self._in_slice(i, a):self._in_slice(i, b)] = self.optimizer.state[piece][key]
        return out

    def full_masters(self) -> list[torch.Tensor]:
        return [t.clone() for t in self._param_slices(self._gather(self.master))]

    def load_masters(self, tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1).float().to(self.device) for t in tensors])
        with torch.no_grad():
            self.master.zero_()
            self.master[:self.hi - self.lo] = flat[self.lo:self.hi]

    def _template(self) -> tuple[torch.optim.Optimizer | None, list[torch.Tensor]]:
        """An AdamW over stand-ins of the unit's parameters (no elements, the right number of
        dimensions: the rule for weight decay reads it), and the stand-ins in the parameters'
        order: its state_dict is the unsharded format."""
        stand_ins = [torch.empty((0,) * len(shape)) for shape in self.shapes]
        return self._new_optimizer(stand_ins, None), stand_ins

    def optimizer_state(self) -> dict | None:
        """The unit's AdamW state as an unsharded AdamW over its parameters would hold it
        (every replica joins the gathers; their results are equal)."""
        template, stand_ins = self._template()
        if template is None:
            return None
        if self.optimizer is not None:
            set_lr([template], self.optimizer.param_groups[0]["lr"])
        if self.updates:
            moments = {k: self._param_slices(self._gather(self._slice_of_pieces(k)))
                       for k in ("exp_avg", "exp_avg_sq")}
            for i, p in enumerate(stand_ins):
                template.state[p] = {"step": torch.tensor(float(self.updates)),
                                     **{k: moments[k][i].cpu().clone() for k in moments}}
        return template.state_dict()

    def load_optimizer_state(self, state: dict) -> None:
        """Take this replica's slice of an unsharded AdamW state (optimizer_state's format)."""
        template, stand_ins = self._template()
        template.load_state_dict(state)
        by_param = [template.state.get(p, {}) for p in stand_ins]
        self.updates = int(by_param[0]["step"]) if by_param and by_param[0] else 0
        if self.optimizer is None:
            return
        sharded = self.optimizer.state_dict()
        index = {id(p): k for k, p in enumerate(q for g in self.optimizer.param_groups
                                                 for q in g["params"])}
        sharded["state"] = {
            index[id(piece)]: {"step": by_param[i]["step"].clone(),
                               **{k: by_param[i][k].reshape(-1)[a:b].clone()
                                  for k in ("exp_avg", "exp_avg_sq")}}
            for piece, (i, a, b) in zip(self.pieces, self._piece_of) if by_param[i]}
        self.optimizer.load_state_dict(sharded)
