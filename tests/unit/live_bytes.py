"""The bytes of the storages torch allocates, alive at once: what tests hold the simulator's
memory against where a CPU has no allocator statistics (tests/unit/test_working_bytes.py)."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops create under the mode that are still alive, and their peak
    since `reset`. Not new memory: an op's output over one of its inputs' storages (a view, an
    in-place op), and the `foreign` tensors' storages (made before: parameters, inputs)."""

    def __init__(self, *foreign: torch.Tensor):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0
        self.foreign = {t.untyped_storage()._cdata for t in foreign}

    def reset(self) -> int:
        """The peak from now on; the bytes alive now."""
        self.peak = self.now
        return self.now

    def _freed(self, key: int) -> None:
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.live or key in inputs or key in self.foreign or not storage.nbytes():
                continue
            self.live[key] = storage.nbytes()
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._freed, key)
        return out
