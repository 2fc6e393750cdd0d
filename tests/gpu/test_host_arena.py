"""Host arenas on a GPU (runtime/host_arena.py): a registered block is pinned, copies to the
device and back from it run on a side stream and are exact, and it takes its own size (to the
page), where torch's caching host allocator takes the next power of two. Skipped where there is
no CUDA device."""

from __future__ import annotations

import pytest
import torch

from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.host_arena import PAGE, HostArena, carved_nbytes
from ratrain.runtime.process_memory import RssGrowth

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPES = [(1000, 37), (4097,)]  # fp32, sizes of no power of two


def test_a_registered_block_is_pinned_and_copies_through_it_are_exact():
    copies = CopyEngine(torch.device("cuda"))
    arena = copies.host_arena(carved_nbytes(4 * torch.Size(s).numel() for s in SHAPES))
    g = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        host = arena.take(shape, torch.float32)
        assert host.is_pinned()  # the second tensor too: the whole block is registered
        host.copy_(torch.randn(shape, generator=g))
        device = torch.empty(shape, device="cuda")
        copies.wait(copies.copy(device, host))  # non_blocking, on the copy stream
        back = torch.full(shape, float("nan")).pin_memory()
        copies.copy(back, device, gradient=True).synchronize()
        assert torch.equal(back, host)
        device.zero_()
        device.copy_(host, non_blocking=True)  # and on the compute stream
        host_again = torch.empty_like(host)
        host_again.copy_(device, non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(host_again, host)


def test_a_block_takes_its_size_where_the_caching_allocator_takes_a_power_of_two():
    """Registering the block makes its pages resident and pinned: the process grows by the
    block's size, not by the 64 MiB bucket torch's pinned allocation of the same size takes."""
    nbytes = 3 * 2 ** 24 + 12_345  # ~48 MiB
    torch.zeros(1, device="cuda")  # CUDA's own start is not the block's
    stats = getattr(torch.cuda, "host_memory_stats", None)  # torch >= 2.6
    held = (lambda: stats().get("allocated_bytes.current", 0)) if stats else (lambda: 0)
    before = held()
    rss = RssGrowth()
    rss.start()
    arena = HostArena(nbytes, pinned=True)
    grown = rss.peak()
    assert arena.take((nbytes // 4,), torch.float32).is_pinned()
    if grown is not None:  # Linux; huge pages may round each end of the block to 2 MiB
        assert nbytes - PAGE <= grown < nbytes + 2 ** 23, grown
    assert held() == before  # nothing of the caching allocator's
    cached = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    assert cached.is_pinned()
    # a new block of the next power of two (none where the bucket had a cached one already)
    assert held() - before in (0, 2 ** 26)
