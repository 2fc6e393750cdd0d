"""Host arenas (runtime/host_arena.py): a block carved into aligned tensors of their own that
keep it alive, an overflow refused, the CUDA registration made and undone at the block's end
(with a stand-in for cudart), and host-homed state carved from one block per unit: the same
training run bit for bit, and the memory ledger's exact sizes."""

from __future__ import annotations

import gc

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.runtime import host_arena
from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.engine import PipelineEngine
from ratrain.runtime.host_arena import ALIGN, PAGE, HostArena, carved_nbytes
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.plan import build_plan

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


def _cfg() -> RunConfig:
    cfg = RunConfig()
    cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.n_kv_heads = 64, 2, 4, 2
    cfg.model.ffn_dim, cfg.model.vocab_size, cfg.model.max_seq_len = 160, 257, 64
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 32, 8, 2
    cfg.train.lr, cfg.train.warmup_steps = 3e-3, 0
    return cfg


def _host_homed_run(steps: int = 3):
    """A host-homed executor run with fp32 views one unit ahead and offload: its losses, its
    final masters, and the engine."""
    cfg = _cfg()
    plan = build_plan(cfg.model.n_layers, 1, 1, cfg.n_micro, view_window=1, state_home="host",
                      activation="offload")
    engine = PipelineEngine(cfg, plan, None, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(steps):
        w = torch.randint(0, cfg.model.vocab_size, (8, 33), generator=g)
        batches = list(zip(w[:, :-1].split(2), w[:, 1:].split(2)))
        losses.append(engine.train_step(batches, 3e-3, step).loss)
    masters = [m.detach().clone() for m in engine.stage.master_params()]
    return losses, masters, engine


class _PerTensor:
    """Host state as it was before arenas: every tensor an allocation of its own."""

    def take(self, shape, dtype):
        return torch.empty(shape, dtype=dtype)


@pytest.mark.parametrize("gpu_fold_path", [False, True])
def test_host_homed_state_in_one_block_a_unit_trains_bit_for_bit_as_before(
        monkeypatch, gpu_fold_path):
    """The arena changes where the bytes live, nothing else: the same losses and masters, to
    the bit, as tensors allocated one by one. With `gpu_fold_path` the folds take the GPU's
    path (a first copy into the zero accumulation, later ones staged and added on the host)."""
    if gpu_fold_path:
        monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    losses, masters, engine = _host_homed_run()
    for state in engine.stage.state.values():  # each unit's masters and gradient: one block
        if state.masters:
            tensors = [*state.masters, state.grad]
            start, end = tensors[0].data_ptr(), _span(tensors[-1])[1]
            assert sorted(map(_span, tensors)) == list(map(_span, tensors))
            assert end - start <= carved_nbytes(t.numel() * 4 for t in tensors)
    with monkeypatch.context() as m:
        m.setattr(CopyEngine, "host_arena", lambda self, nbytes: _PerTensor())
        before_losses, before_masters, _ = _host_homed_run()
    assert losses == before_losses
    assert all(torch.equal(a, b) for a, b in zip(masters, before_masters))


def test_the_ledger_counts_host_homed_state_at_its_exact_sizes():
    """Masters and gradients carved from one block are counted by their own bytes, under their
    own kinds (the alignment between them is not state; the simulator counts 4 bytes a
    parameter for each)."""
    _, _, engine = _host_homed_run(steps=1)
    n = sum(m.numel() for m in engine.stage.master_params())
    ledger = engine.stage.ledger
    assert ledger.bytes["masters"] == 4 * n and ledger.bytes["gradients"] == 4 * n
