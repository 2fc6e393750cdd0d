"""What autograd saves for one unit's backward on one micro-batch, held where the executor can
count it, move it to the host tier and bring it back (`O`, `L`, `WL`).

Installed with torch's saved-tensor hooks around the unit's forward (or recompute): every tensor
autograd saves goes through `_pack`, which keeps it here and hands autograd an index; the
backward's `_unpack` returns whatever the index holds by then (the device tensor, or its reloaded
copy). Parameters and the unit's input are held elsewhere for the whole step, so they are passed
through untouched and never offloaded.
"""

from __future__ import annotations

import torch

from ratrain.runtime.copy_engine import CopyEngine


class SavedActivations:
    def __init__(self, passthrough: set[int]):
        self.passthrough = passthrough  # storage addresses of parameters and the unit's input
        self.tensors: list[torch.Tensor] = []
        self._reloaded = None  # the reload copy's event

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        if t.untyped_storage().data_ptr() in self.passthrough:
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
        return self.tensors[packed] if isinstance(packed, int) else packed

    def offload(self, copies: CopyEngine) -> None:
        """Start copying to host buffers; the device memory is freed once the copies ran."""
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
