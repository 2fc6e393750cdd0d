"""The memory ledger of a rank's real tensors (the account itself: ratrain/schedule/ledger.py).

A tensor is counted by its storage (address and size), so views of one storage, and a unit's
output and the next unit's detached input, count once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import torch

from ratrain.schedule.ledger import Ledger


class MemoryLedger(Ledger):
    def hold(self, owner: Hashable, kind: str, tensors: Iterable[torch.Tensor | None]) -> None:
        """`owner` keeps `tensors` alive (None entries and empty storages are skipped)."""
        for key, nbytes in tensor_storages(tensors):
            self.hold_storage(owner, kind, key, nbytes)


def tensor_storages(tensors: Iterable[torch.Tensor | None]) -> list[tuple[int, int]]:
    """(storage address, bytes) of each tensor that has memory: how the ledger keys tensors."""
    out = []
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() != 0:
            out.append((storage.data_ptr(), storage.nbytes()))
    return out
