"""Long-lived host tensors of known size, carved from one block of memory of their exact size.

torch pins host memory through its caching host allocator, which rounds every allocation up to
a power of two: a 4096 x 11008 fp32 master (172 MiB) takes 256 MiB, and llama2-7b's host-homed
state lost ~15 GB of a 125 GB host that way (docs/machines.md). A unit's masters and gradient
live for the whole run and their sizes are known when the unit is built, so its layout carves
them from one block (runtime/state_layout.Replicated). Where a GPU copies to and from the block
asynchronously it is page-locked as a whole with cudaHostRegister, which rounds nothing (to the
page, where the caching allocator rounds to the power of two): registered memory is pinned for
CUDA (is_pinned() is true; cudaMemcpyAsync from it is a real DMA). Without CUDA the block is
plain memory, carved the same way.

Host buffers that live a step or less and come back with the same sizes every step (a fold's
staging of a view's gradient, offloaded activations: CopyEngine.host_empty) stay with the
caching allocator, which hands the same blocks out again; an arena for them would have to
reimplement its free lists.

Each carved tensor is a torch storage of its own over its bytes of the block (torch.from_numpy
of a slice of the numpy array that owns the block): the memory ledger counts tensors by their
storage and checkpoints write a tensor's storage, so views of one shared storage would count
the whole block under whichever kind registered last. Every such storage keeps the array alive.
The owner is a numpy array, not a torch tensor, because of the order in which it ends: numpy
runs an array's weak-reference callbacks before it frees the array's memory, so the block is
unregistered while its pages still exist; a torch storage frees its memory first
(StorageImpl::release_resources) and only then lets its Python object go.

A block lives as long as any tensor carved from it, not as long as copies in flight: the unit
states that own the blocks keep them for the run.
"""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Iterable

import numpy as np
import torch

ALIGN = 512  # bytes: where each carved tensor starts (whole cache lines; DMA likes it too)
PAGE = mmap.PAGESIZE  # a registered block spans whole pages of its own: no page is shared
# with another block, which CUDA would refuse to register twice
_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context, not only the current device's


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def carved_nbytes(sizes: Iterable[int]) -> int:
    """The bytes a block needs to carve tensors of these sizes (in bytes), in this order."""
    return sum(_round_up(n, ALIGN) for n in sizes)


class HostArena:
    """A host block of `nbytes`, page-locked for CUDA where `pinned`; `take` carves it front
    to back."""

    def __init__(self, nbytes: int, pinned: bool = False):
        self.nbytes = nbytes
        self._used = 0
        span = _round_up(nbytes, PAGE)
        owner = np.empty(span + PAGE, dtype=np.uint8)  # room to start on a page boundary
        start = -owner.ctypes.data % PAGE
        self._block = owner[start:start + span]
        if pinned:
            address = self._block.ctypes.data
            _check(torch.cuda.cudart().cudaHostRegister(address, span, _HOST_REGISTER_PORTABLE),
                   f"cudaHostRegister of {span} bytes")
            # at interpreter exit CUDA may be gone before the block, and the process's
            # registrations end with it anyway
            weakref.finalize(owner, _unregister, address).atexit = False

    def take(self, shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized tensor of `shape` and `dtype`, the next bytes of the block."""
        shape = torch.Size(shape)
        n = shape.numel() * dtype.itemsize
        if n == 0:  # no bytes: a storage at the next tensor's address would alias it
            return torch.empty(shape, dtype=dtype)
        if self._used + n > self.nbytes:
            raise RuntimeError(f"host arena overflow: {n} bytes asked at offset {self._used} "
                               f"of a block of {self.nbytes}")
        t = torch.from_numpy(self._block[self._used:self._used + n]).view(dtype).view(shape)
        self._used = _round_up(self._used + n, ALIGN)
        return t


def _unregister(address: int) -> None:
    _check(torch.cuda.cudart().cudaHostUnregister(address), "cudaHostUnregister")


def _check(err, what: str) -> None:
    if int(err) != 0:
        message = torch.cuda.cudart().cudaGetErrorString(err)
        raise RuntimeError(f"{what} failed: CUDA error {int(err)} ({message})")
