"""A unit's training state: gradients in one flat buffer, a squared norm as exact as the
reference's clip_grad_norm_, and a compute view made from the masters and released."""

import torch

from ratrain.config import RunConfig
from ratrain.models.llama import build_units
from ratrain.models.presets import get_preset
from ratrain.optim import make_optimizer
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
