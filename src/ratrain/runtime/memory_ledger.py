"""The bytes a rank holds, by kind, and their peak: what the planner's memory model is judged by.

Holders register the tensors they keep under an owner key (a unit's masters, one micro-batch's
saved activations, a receive buffer). Bytes are counted per storage, once, however many owners
or views share it: a unit's output and the next unit's detached input are one storage. A storage
counts under the kind of the latest owner that registered it (a received buffer becomes an
activation when the stage's first unit takes it as input).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable

import torch

KINDS = ("views", "masters", "gradients", "optimizer", "activations", "offloaded", "buffers")
"""views: compute-precision parameter copies; masters: fp32 weights in their home tier;
gradients: fp32 accumulation buffers; optimizer: AdamW moments; activations: what a unit keeps
for its backward on the compute device (saved tensors, inputs, outputs); offloaded: saved tensors
moved to the host tier; buffers: transfers in flight and activation gradients between units."""


class MemoryLedger:
    def __init__(self) -> None:
        self.bytes: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.peak = 0
        self.at_peak: dict[str, int] = dict(self.bytes)
        self._size: dict[int, tuple[str, int]] = {}  # storage address -> (kind, bytes)
        self._holders: dict[int, set[Hashable]] = defaultdict(set)
        self._owned: dict[Hashable, set[int]] = defaultdict(set)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def hold(self, owner: Hashable, kind: str, tensors: Iterable[torch.Tensor | None]) -> None:
        """`owner` keeps `tensors` alive (None entries are skipped)."""
        for t in tensors:
            if t is None:
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or owner in self._holders[key]:
                continue  # an empty storage, or already held by this owner
            if self._holders[key]:
                old, size = self._size[key]
                self.bytes[old] -= size
            else:
                size = storage.nbytes()
            self._size[key] = (kind, size)
            self.bytes[kind] += size
            self._holders[key].add(owner)
            self._owned[owner].add(key)
        self._note_peak()

    def release(self, owner: Hashable) -> None:
        """`owner` lets go of everything it registered."""
        for key in self._owned.pop(owner, ()):
            holders = self._holders[key]
            holders.discard(owner)
            if not holders:
                del self._holders[key]
                kind, size = self._size.pop(key)
                self.bytes[kind] -= size

    def reset_peak(self) -> None:
        self.peak = self.total
        self.at_peak = dict(self.bytes)

    def _note_peak(self) -> None:
        total = self.total
        if total > self.peak:
            self.peak = total
            self.at_peak = dict(self.bytes)
