"""Bytes held, by kind, and their peak: the one account the executor keeps of real tensors
(runtime/memory_ledger.py) and the simulator keeps of predicted ones (sim/), so the two are
compared kind by kind. Pure Python.

Holders register storages under an owner key (a unit's masters, one micro-batch's saved
activations, a receive buffer). A storage counts once, however many owners hold it, under the
kind of the latest owner that registered it (a received buffer becomes an activation when the
stage's first unit takes it as input), until every owner has let go.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from ratrain.schedule.ops import Effect, Release, owner_key

KINDS = ("views", "masters", "gradients", "optimizer", "activations", "offloaded", "buffers")
"""views: compute-precision parameter copies; masters: fp32 weights in their home tier;
gradients: fp32 accumulation buffers; optimizer: AdamW moments and step counters; activations:
what a unit keeps for its backward on the compute device (saved tensors, inputs, outputs);
offloaded: saved tensors moved to the host tier; buffers: transfers in flight and activation
gradients between units."""


class Ledger:
    def __init__(self) -> None:
        self.bytes: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.total = 0
        self.peak = 0
        self.at_peak: dict[str, int] = dict(self.bytes)
        # storage -> [kind, bytes, its holders]; owner -> the storages it holds (each once).
        # One entry per storage: the simulator's ledger walks thousands of plans.
        self._storages: dict[Hashable, list] = {}
        self._owned: dict[Hashable, list[Hashable]] = {}

    def hold_storage(self, owner: Hashable, kind: str, storage: Hashable, nbytes: int) -> None:
        """`owner` keeps `storage` (of `nbytes`) alive."""
        entry = self._storages.get(storage)
        if entry is None:
            self._storages[storage] = [kind, nbytes, {owner}]
        elif owner in entry[2]:
            return
        else:  # counted once, at its size, under the kind of its latest holder
            old, nbytes = entry[0], entry[1]
            self.bytes[old] -= nbytes
            self.total -= nbytes
            entry[0] = kind
            entry[2].add(owner)
        self.bytes[kind] += nbytes
        self.total += nbytes
        owned = self._owned.get(owner)
        if owned is None:
            self._owned[owner] = [storage]
        else:
            owned.append(storage)
        self._note_peak()

    def release(self, owner: Hashable) -> None:
        """`owner` lets go of everything it registered."""
        for storage in self._owned.pop(owner, ()):
            kind, size, holders = self._storages[storage]
            holders.discard(owner)
            if not holders:
                del self._storages[storage]
                self.bytes[kind] -= size
                self.total -= size

    def reset_peak(self) -> None:
        self.peak = self.total
        self.at_peak = dict(self.bytes)

    def _note_peak(self) -> None:
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.bytes)


def apply_effects(ledger: Ledger, effects: Iterable[Effect], unit: int | None, mb: int | None,
                  storages: Callable[[str], Iterable[tuple[Hashable, int]]]) -> None:
    """Apply an action's memory effects (its spec's `memory`, schedule/ops.py) in order;
    `storages` binds a storage name to (storage key, bytes) pairs: real tensors in the
    executor, sizes in the simulator."""
    for effect in effects:
        owner = owner_key(effect, unit, mb)
        if isinstance(effect, Release):
            ledger.release(owner)
            continue
        for name in effect.storages:
            for key, nbytes in storages(name):
                ledger.hold_storage(owner, effect.kind, key, nbytes)
