"""Host arenas (runtime/host_arena.py): a block carved into aligned tensors of their own that
keep it alive, an overflow refused, the CUDA registration made and undone at the block's end
(with a stand-in for cudart)."""

from __future__ import annotations

import gc

import pytest
import torch

from ratrain.runtime import host_arena
from ratrain.runtime.host_arena import ALIGN, PAGE, HostArena, carved_nbytes

SHAPES = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((1000,), torch.float32),
          ((1,), torch.uint8), ((64, 64), torch.float16)]


def _nbytes(shape, dtype) -> int:
    return torch.Size(shape).numel() * dtype.itemsize


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def test_carved_tensors_are_aligned_disjoint_parts_of_one_block_that_hold_their_values():
    total = carved_nbytes(_nbytes(s, d) for s, d in SHAPES)
    arena = HostArena(total)
    tensors = [arena.take(s, d) for s, d in SHAPES]
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(t.shape, generator=g).to(t.dtype) for t in tensors]
    for t, v in zip(tensors, values):
        t.copy_(v)
    spans = sorted(_span(t) for t in tensors)
    assert all(start % ALIGN == 0 for start, _ in spans)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # disjoint
    assert spans[-1][1] - spans[0][0] <= total  # within one block of the size asked
    assert all(torch.equal(t, v) for t, v in zip(tensors, values))  # nothing overwrote another
    # each a storage of its own, of its exact bytes (how the ledger and checkpoints count it)
    assert [t.untyped_storage().nbytes() for t in tensors] == [_nbytes(s, d) for s, d in SHAPES]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)
    assert not any(t.is_pinned() for t in tensors)  # no CUDA: plain memory
    del arena
    gc.collect()
    assert all(torch.equal(t, v) for t, v in zip(tensors, values))  # the tensors keep the block


def test_a_request_past_the_end_of_the_block_is_refused():
    arena = HostArena(1124)
    arena.take((200,), torch.float32)  # 800 bytes, the next request starts at 1024
    with pytest.raises(RuntimeError, match="host arena overflow: 404 bytes asked at offset "
                                           "1024 of a block of 1124"):
        arena.take((101,), torch.float32)
    assert arena.take((25,), torch.float32).numel() == 25  # exactly what is left
    assert arena.take((0, 4), torch.float32).shape == (0, 4)  # no bytes: always room


class _FakeCudart:
    """What host_arena asks of torch.cuda.cudart(), recorded (no CUDA here)."""

    def __init__(self, register_error: int = 0):
        self.calls: list[tuple] = []
        self.register_error = register_error

    def cudaHostRegister(self, address, nbytes, flags):
        self.calls.append(("register", address, nbytes, flags))
        return self.register_error

    def cudaHostUnregister(self, address):
        self.calls.append(("unregister", address))
        return 0

    def cudaGetErrorString(self, err):
        return "out of memory"


def test_a_pinned_block_is_registered_whole_pages_and_unregistered_when_its_last_tensor_goes(
        monkeypatch):
    cudart = _FakeCudart()
    monkeypatch.setattr(host_arena.torch.cuda, "cudart", lambda: cudart)
    nbytes = 3 * PAGE + 100
    arena = HostArena(nbytes, pinned=True)
    (_, address, span, flags), = cudart.calls
    assert address % PAGE == 0 and span == 4 * PAGE and flags == 1  # portable
    a = arena.take((100,), torch.float32)
    b = arena.take((PAGE,), torch.uint8)
    assert a.data_ptr() == address and address <= b.data_ptr() < address + span
    del arena, a
    gc.collect()
    assert len(cudart.calls) == 1  # b still lives in the block
    del b
    gc.collect()
    assert cudart.calls[1:] == [("unregister", address)]

    failing = _FakeCudart(register_error=2)
    monkeypatch.setattr(host_arena.torch.cuda, "cudart", lambda: failing)
    with pytest.raises(RuntimeError, match=r"cudaHostRegister of 8192 bytes failed: CUDA error "
                                           r"2 \(out of memory\)"):
        HostArena(PAGE + 1, pinned=True)
