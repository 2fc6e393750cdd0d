"""What autograd saves for one unit's backward on one micro-batch, held where the executor can
count it, move it to the host tier and bring it back (`O`, `L`, `WL`).

Installed with torch's saved-tensor hooks around the unit's forward (or recompute): every tensor
autograd saves goes through `_pack`, which keeps it here and hands autograd an index; the
backward's `_unpack` returns whatever the index holds by then (the device tensor, or its reloaded
copy). The unit's input is held elsewhere for the whole step, so it is passed through untouched.

What autograd saves of a parameter (the weight itself, or a view of it such as a matmul's
`weight.t()`) is packed as a reference into the parameter's storage and rebuilt on unpack over
the storage the parameter has then. A compute view the program releases between a forward and
its backward (`X u`, then `P u` again) is thereby really freed: holding the tensor itself would
keep the released view's memory alive, out of the ledger, until the backward (a whole unit's
view per micro-batch in flight). The program makes the view again before the unit's backward,
with the same values (no update comes between a step's forward and its backward).
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import torch
from torch import nn

from ratrain.runtime.copy_engine import CopyEngine


class _InParameter(NamedTuple):
    """A saved tensor that lies in parameter `index`'s storage, by its place there."""

    index: int
    dtype: torch.dtype
    offset: int
    size: torch.Size
    stride: tuple[int, ...]


class SavedActivations:
    def __init__(self, params: list[nn.Parameter], passthrough: set[int]):
        self.params = params  # the parameters the unit reads (a tied head: the embedding's too)
        self._param_of = {p.untyped_storage().data_ptr(): i for i, p in enumerate(params)
                          if p.untyped_storage().data_ptr()}  # (0: no memory, nothing to find)
        self.passthrough = passthrough  # storage addresses of the unit's input
        self.tensors: list[torch.Tensor | None] = []  # None: dropped by keep_only_for (after
        # BI, when nothing moves them any more)
        self._reloaded = None  # the reload copy's event
        self._reading: set[int] | None = None  # keep_only_for's record of what nodes read
        self._releasing = False  # let_go_as_read's

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        if key in self._param_of:
            return _InParameter(self._param_of[key], t.dtype, t.storage_offset(), t.size(),
                                t.stride())
        if key in self.passthrough:
            return t
        # Detached: an op's saved output carries that op's node as grad_fn, and holding it here
        # would close a cycle through C++ (node -> its saved variable's hooks -> this -> tensor
        # -> node) that Python's gc cannot see. A full backward breaks it by freeing what it
        # used; a split backward's BI keeps the graph (retain_graph) and BW frees only the
        # weight halves, so every micro-batch's input-path graph leaked. Autograd re-attaches
        # the node on unpack, so nothing else changes.
        self.tensors.append(t.detach())
        return len(self.tensors) - 1

    def _unpack(self, packed):
        if isinstance(packed, _InParameter):
            p = self.params[packed.index]
            storage = p.untyped_storage()
            if storage.nbytes() == 0:
                raise RuntimeError("a unit's backward ran without its compute view (the program "
                                   "released it and did not prefetch it again)")
            return torch.empty(0, dtype=packed.dtype, device=p.device).set_(
                storage, packed.offset, packed.size, packed.stride)
        if isinstance(packed, int):
            if self._reading is not None:
                self._reading.add(packed)
            t = self.tensors[packed]
            if self._releasing:
                self.tensors[packed] = None
            return t
        return packed

    def let_go_as_read(self) -> None:
        """In a whole backward (no graph kept): each saved tensor is let go once its node has
        read it, so autograd frees it as the backward goes, as it would without these hooks.
        Held to the backward's end, a block's saved tensors stayed beside its gradients' peak
        (sim/working_bytes.py prices the backward as autograd runs it)."""
        self._releasing = True

    def keep_only_for(self, nodes) -> list[torch.Tensor]:
        """Drop every tensor none of the graph nodes `nodes` saved (after a split backward's
        BI: the rest of the graph will not run again); returns those kept. What a node saved
        is found by reading its `_saved_*` attributes, which goes through `_unpack`."""
        self._reading = set()
        try:
            for node in nodes:
                for name in _saved_names(type(node)):
                    getattr(node, name)
        finally:
            read, self._reading = self._reading, None
        self.tensors = [t if i in read else None for i, t in enumerate(self.tensors)]
        return [t for t in self.tensors if t is not None]

    def offload(self, copies: CopyEngine) -> None:
        """Start copying to host buffers; the device memory is freed once the copies ran.
        The buffers live until the backward and come back with the same sizes every step: the
        caching host allocator's (CopyEngine.host_empty), which reuses them, not an arena."""
        self.tensors = self._move(copies, lambda data: copies.host_empty(data))

    def reload(self, copies: CopyEngine, device: torch.device) -> None:
        """Start copying back to the compute device."""
        self.tensors = self._move(copies, lambda data: torch.empty_like(data, device=device))

    def wait_reload(self, copies: CopyEngine) -> None:
        copies.wait(self._reloaded)
        self._reloaded = None

    def _move(self, copies: CopyEngine, new_buffer) -> list[torch.Tensor]:
        """Copy each storage once (saved tensors are often views of one another, like x and
        x.float() in fp32) and rebuild every tensor as the same view of the new storage."""
        moved: dict[int, torch.UntypedStorage] = {}
        out = []
        for t in self.tensors:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in moved:
                data = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
                buffer = new_buffer(data)
                self._reloaded = copies.copy(buffer, data)
                moved[key] = buffer.untyped_storage()
            view = torch.empty(0, dtype=t.dtype, device=moved[key].device)
            out.append(view.set_(moved[key], t.storage_offset(), t.size(), t.stride()))
        return out


@cache
def _saved_names(node_type: type) -> tuple[str, ...]:
    """The attributes through which a graph node of this type hands out what it saved."""
    return tuple(n for n in dir(node_type) if n.startswith("_saved_")
                 and not n.endswith(("_sym_sizes", "_sym_strides", "_sym_argsize")))
