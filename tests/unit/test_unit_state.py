"""A unit's training state: gradients in one flat buffer, a squared norm as exact as the
reference's clip_grad_norm_, a compute view made from the masters and released, one class for the
replicated and the sharded layout, and an overflowed step skipped without the host reading it."""

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.models.llama import build_units
from ratrain.models.presets import get_preset
from ratrain.runtime.optim import make_optimizer
from ratrain.runtime.sharded_layout import Sharded
from ratrain.runtime.state_layout import Replicated
from ratrain.runtime.unit_state import UnitState


def _block_state():
    cfg = RunConfig(model=get_preset("tiny"))
    block = build_units(cfg.model, 0, [1])[0]
    params = list(block.parameters())
    return block, UnitState(params, lambda params: make_optimizer(params, cfg.train))


def test_gradients_are_views_of_one_buffer_and_backward_accumulates_into_it():
    block, state = _block_state()
    assert state.grad.numel() == sum(p.numel() for p in state.params) == 791_040
    x = torch.randn(2, 8, 256)
    block(x).square().mean().backward()
    once = state.grad.clone()
    block(x).square().mean().backward()
    assert once.abs().sum() > 0 and torch.allclose(state.grad, 2 * once)  # accumulated in place
    start, end = state.grad.data_ptr(), state.grad.data_ptr() + 4 * state.grad.numel()
    assert all(start <= p.grad.data_ptr() < end for p in state.params)
    before = [p.detach().clone() for p in state.params]
    state.update(0.5)
    assert float(state.grad.abs().sum()) == 0.0  # consumed and zeroed
    assert any(not torch.equal(a, p) for a, p in zip(before, state.params))


def test_squared_norm_is_as_exact_as_per_tensor_norms():
    """A single fp32 norm over the flat buffer is off by ~1e-5 here; per-tensor norms (what
    clip_grad_norm_ computes) stay within 2e-6 of float64."""
    _, state = _block_state()
    g = torch.Generator().manual_seed(0)
    state.grad.copy_(torch.randn(state.grad.numel(), generator=g) * 1e-3 + 1e-3)
    exact = float(state.grad.double().square().sum())
    assert abs(float(state.sq_norm()) - exact) / exact < 2e-6
    reference = float(torch.nn.utils.get_total_norm([p.grad for p in state.params])) ** 2
    assert abs(float(state.sq_norm()) - reference) / reference < 1e-6


def test_a_view_is_made_from_the_masters_and_its_gradients_fold_into_fp32():
    cfg = RunConfig(model=get_preset("tiny"))
    block = build_units(cfg.model, 0, [1])[0]
    initial = [p.detach().clone() for p in block.parameters()]
    state = UnitState(list(block.parameters()), lambda params: make_optimizer(params, cfg.train),
                      view_dtype=torch.bfloat16)
    assert all(p.numel() == 0 for p in state.params)  # no view until prefetched
    assert all(torch.equal(m, w) and m.dtype == torch.float32 for m, w in zip(state.masters, initial))
    state.prefetch()
    state.wait_view()
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, w.bfloat16())
               for p, w in zip(state.params, initial))
    assert state.ledger.bytes["views"] == 2 * sum(w.numel() for w in initial)
    x = torch.randn(2, 8, 256, dtype=torch.bfloat16)
    block(x).float().square().mean().backward()
    state.fold_grads()
    assert all(p.grad is None for p in state.params)
    assert state.grad.dtype == torch.float32 and float(state.grad.abs().sum()) > 0
    state.release_view()
    assert all(p.numel() == 0 for p in state.params) and state.ledger.bytes["views"] == 0
    state.update()
    assert any(not torch.equal(m, w) for m, w in zip(state.masters, initial))


def _new_optimizer(cfg):
    return lambda params, decay=None: make_optimizer(params, cfg.train, decay)


def _layouts():
    """A state of the tiny preset's block 1 per layout (sharded: replica 0 of 2, no collective
    needed to build it or to update it), each over its own copy of the same weights."""
    cfg = RunConfig(model=get_preset("tiny"))
    def state(layout, view_dtype=None):
        block = build_units(cfg.model, 0, [1])[0]
        return UnitState(list(block.parameters()), _new_optimizer(cfg), layout, view_dtype=view_dtype)
    return {"replicated": lambda: state(Replicated()),
            "sharded": lambda: state(Sharded(None, 0, 2), torch.float32)}


def _fill(state, seed):
    """A gradient as the sync leaves it for the update."""
    g = torch.Generator().manual_seed(seed)
    state.update_grad.copy_(torch.randn(state.update_grad.numel(), generator=g) * 1e-3)


def _snapshot(state):
    opt = [t.clone() for s in state.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return [m.detach().clone() for m in state.masters], opt


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_a_skipped_step_leaves_masters_moments_and_step_count_bitwise_unchanged(layout):
    """found_inf = 1: the fused AdamW skips the step where it runs (the host never reads the
    flag) and reverts its step counter; the gradients are zeroed all the same. found_inf = 0
    and a grad_factor tensor update bit for bit as no flag and a Python float do."""
    state, twin = _layouts()[layout](), _layouts()[layout]()
    for s in (state, twin):
        _fill(s, 0)
        s.update(0.5)
    before = _snapshot(state)
    assert _equal(before[0], _snapshot(twin)[0]) and _equal(before[1], _snapshot(twin)[1])
    _fill(state, 1)
    state.update(torch.tensor(0.5), found_inf=torch.tensor(1.0))
    after = _snapshot(state)
    assert _equal(after[0], before[0]) and _equal(after[1], before[1])
    assert [float(s["step"]) for s in state.optimizer.state.values()] == [1.0] * len(state.masters)
    assert float(state.grad.abs().sum()) == float(state.update_grad.abs().sum()) == 0.0
    if layout == "sharded":
        assert int(state.layout.steps) == 1  # what its checkpoint will say
    for s, factor, found_inf in ((state, torch.tensor(0.5), torch.tensor(0.0)), (twin, 0.5, None)):
        _fill(s, 2)
        s.update(factor, found_inf)
    assert not _equal(_snapshot(state)[0], before[0])
    assert _equal(_snapshot(state)[0], _snapshot(twin)[0])
    assert _equal(_snapshot(state)[1], _snapshot(twin)[1])
    assert state.optimizer.found_inf is None  # the flag does not outlive its step


def test_replicated_and_sharded_states_are_one_class_and_update_alike():
    """The layout is an object the unit state holds, not a subclass; the two replicas of a
    sharded unit together update exactly the elements the replicated state does."""
    cfg = RunConfig(model=get_preset("tiny"))
    whole = _layouts()["replicated"]()
    halves = []
    for r in range(2):
        block = build_units(cfg.model, 0, [1])[0]
        halves.append(UnitState(list(block.parameters()), _new_optimizer(cfg), Sharded(None, r, 2),
                                view_dtype=torch.float32))
    assert {type(s) for s in (whole, *halves)} == {UnitState}
    assert isinstance(whole.layout, Replicated) and all(isinstance(h.layout, Sharded) for h in halves)
    assert all(h.has_view and h.grad.numel() == 2 * h.update_grad.numel() for h in halves)
    assert sum(h.ledger.bytes["masters"] for h in halves) == whole.ledger.bytes["masters"] == 4 * whole.numel
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        grad = torch.randn(whole.numel, generator=g) * 1e-3
        whole.grad.copy_(grad)
        padded = torch.cat([grad, torch.zeros(2 * halves[0].layout.shard - whole.numel)])
        for h in halves:  # what the reduce-scatter of one replica's sum leaves
            h.update_grad.copy_(padded[h.layout.lo:h.layout.lo + h.layout.shard])
        assert torch.allclose(sum(h.sq_norm() for h in halves), whole.sq_norm(), rtol=1e-6)
        for s in (whole, *halves):
            s.update(torch.tensor(0.5))
    flat = torch.cat([h.layout.master for h in halves])[:whole.numel]
    assert torch.equal(flat, torch.cat([m.detach().reshape(-1) for m in whole.masters]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_host_fold_adds_by_chunks_exactly_as_one_fp32_add(monkeypatch, dtype):
    """The host's fold of a GPU view's gradient (CopyEngine.add_to_fp32) goes through a scratch
    chunk by chunk: the same sums, bit for bit, as adding the whole tensor made fp32, over
    sizes below, at and past a chunk's, and a shaped tensor."""
    from ratrain.runtime import copy_engine
    monkeypatch.setattr(copy_engine, "FOLD_CHUNK", 1000)
    engine = copy_engine.CopyEngine(torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for shape in [(7,), (1000,), (2501,), (30, 77)]:
        acc = torch.randn(shape, generator=g)
        low = torch.randn(shape, generator=g).to(dtype)
        expected = acc + low.float()
        engine.add_to_fp32(acc, low)
        assert torch.equal(acc, expected), shape
        if dtype == torch.bfloat16:  # into a bf16 accumulation, a bf16 copy or an fp32 sum:
            for other in (low, torch.randn(shape, generator=g)):  # the fp32 sum rounded
                acc = torch.randn(shape, generator=g).bfloat16()
                expected = (acc.float() + other.float()).bfloat16()
                engine.add_to_fp32(acc, other)
                assert torch.equal(acc, expected), (shape, other.dtype)


def test_the_host_homed_norm_is_as_accurate_as_fp64_over_chunks_and_ragged_tails(monkeypatch):
    """Host-homed state on a GPU takes its squared norm chunk by chunk on a thread pool: the
    same value as fp64 to ~1e-9 relative, whatever the tensors' sizes against the chunk and
    row (here smaller than a tensor, ragged, empty), where fp32 norms of whole tensors drift."""
    from ratrain.runtime import host_norm

    monkeypatch.setattr(host_norm, "NORM_CHUNK", 3 * host_norm.NORM_ROW + 5)
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=g) * s for n, s in
             ((200_003, 1.0), (host_norm.NORM_ROW, 1e-3), (7, 30.0), (0, 1.0))]
    exact = sum(float(t.double().square().sum()) for t in grads)
    got = host_norm.host_sq_norm(grads)
    assert got.dtype == torch.float32 and got.shape == ()
    assert float(got) == pytest.approx(exact, rel=1e-7)
    assert float(host_norm.host_sq_norm([torch.zeros(0)])) == 0.0


def test_the_host_update_for_a_gpu_scales_in_adamw_and_zeroes_lazily(monkeypatch):
    """Where the host updates for a GPU (run here on the CPU), the clip factor is the fused
    AdamW's grad_scale and the update leaves the accumulation unzeroed for the next fold to
    overwrite: the same masters as the plain path's product and zeroing, to the bit where the
    factor is 1, also for a parameter that gets no gradient in the next step (its last
    gradient must not come back), and to the last bits where the clip bites."""
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu",
                        property(lambda self: getattr(self, "for_gpu", False)))
    cfg = RunConfig(model=get_preset("tiny"))
    states = {}
    for lean in (False, True):
        block = build_units(cfg.model, 0, [1])[0]
        state = UnitState(list(block.parameters()), lambda ps: make_optimizer(ps, cfg.train),
                          view_dtype=torch.bfloat16)
        state.for_gpu = lean
        states[lean] = (block, state)
    x = torch.randn(2, 8, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    for step, factor in enumerate((1.0, 1.0, 0.3)):
        for block, state in states.values():
            state.prefetch()
            state.wait_view()
            block(x).square().mean().backward()
            if step == 1:
                state.params[0].grad = None  # unused this step
            state.fold_grads()
            state.update(torch.tensor(factor))
            state.release_view()
        plain, lean = (states[k][1] for k in (False, True))
        assert float(plain.grad.abs().sum()) == 0.0 < float(lean.grad.abs().sum())  # not zeroed
        for a, b in zip(plain.masters, lean.masters):
            if factor == 1.0:
                assert torch.equal(a, b), step
            else:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    assert float(lean.sq_norm()) == 0.0  # read before any fold: the stale sum is zeroed first
