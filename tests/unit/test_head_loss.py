"""The head's loss without its logits in memory (models/head_loss.py): the loss and both
gradients of the plain logits-then-cross-entropy, for any chunking, in fp64, fp32 and under
bf16 autocast; and nothing of the logits' size kept for the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ratrain.models import params
from ratrain.models.head_loss import chunked_cross_entropy
from ratrain.models.llama import build_units, lm_loss
from ratrain.models.presets import get_preset


def _inputs(dtype, n=37, d=16, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(v, d, generator=g, dtype=dtype).requires_grad_()
    return x, w, torch.randint(0, v, (n,), generator=g)


def _plain(x, w, t):
    return F.cross_entropy(F.linear(x, w).float(), t)


@pytest.mark.parametrize("chunk", [1, 5, 36, 37, 1000])
def test_any_chunking_gives_the_plain_loss_and_gradients(chunk):
    x, w, t = _inputs(torch.float64)
    want = _plain(x, w, t)
    gx, gw = torch.autograd.grad(want, (x, w))
    got = chunked_cross_entropy(x, w, t, chunk)
    hx, hw = torch.autograd.grad(got * 3.0, (x, w))  # a scaled loss, as the executor's
    assert got.dtype == torch.float32
    assert abs(got.item() - want.item()) < 1e-6
    # fp64 products, an fp32 softmax: the gradients to fp32's precision
    assert torch.allclose(hx, 3 * gx, rtol=0, atol=1e-6)
    assert torch.allclose(hw, 3 * gw, rtol=0, atol=1e-6)


def test_gradcheck_in_float64_through_several_chunks(monkeypatch):
    x, w, t = _inputs(torch.float64, n=6, d=3, v=5)
    monkeypatch.setattr(params, "HEAD_CHUNK_ELEMENTS", 10)  # 2 tokens a chunk
    assert params.chunk_tokens(5) == 2
    # the softmax runs in fp32: a loose tolerance, but a wrong formula is far outside it
    assert torch.autograd.gradcheck(lambda a, b: chunked_cross_entropy(a, b, t), (x, w),
                                    eps=1e-3, atol=1e-3, rtol=1e-2)


def test_under_bf16_autocast_it_is_the_plain_heads_arithmetic():
    x, w, t = _inputs(torch.float32, n=64, d=32, v=97)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _plain(x, w, t)
        gx, gw = torch.autograd.grad(want, (x, w))
        got = chunked_cross_entropy(x, w, t, 16)
        hx, hw = torch.autograd.grad(got, (x, w))
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) < 1e-3
    assert hx.dtype == gx.dtype and hw.dtype == gw.dtype
    # the weight's gradient a chunk of rows at a time, each from one product as the plain
    # head's; the input's a sum of bf16 products in fp32 (2-3 bf16 rounding steps of its largest)
    assert (hw - gw).abs().max() < 1e-3 * gw.abs().max()
    assert (hx - gx).abs().max() < 1e-2 * gx.abs().max()


@pytest.mark.parametrize("chunked", [True, False])
def test_the_heads_loss_is_lm_loss_of_its_logits_and_keeps_no_logits(chunked, monkeypatch):
    """Past one chunk of logits the head keeps none of them; within one, the plain loss keeps
    its log-softmax (and recomputes nothing)."""
    if chunked:
        monkeypatch.setattr(params, "HEAD_CHUNK_ELEMENTS", 512 * 40)  # 40 tokens: 4 chunks
    model = get_preset("tiny-llama3")
    model.n_layers = 1
    head = build_units(model, 0)[-1]
    h = torch.randn(2, 64, model.dim).requires_grad_()
    targets = torch.randint(0, model.vocab_size, (2, 64))
    # held to the end: a freed unit's addresses could be the logits' and filter them out
    embedding = build_units(model, 0)[0]
    weights = {p.untyped_storage().data_ptr() for p in embedding.parameters()}
    weights |= {p.untyped_storage().data_ptr() for p in head.parameters()}
    weights |= {p.untyped_storage().data_ptr() for p in head.borrowed_parameters()}
    sizes = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            sizes.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = head.loss(h, targets)
    logits = 2 * 64 * model.vocab_size * 4  # fp32
    assert params.chunks(targets.numel(), model.vocab_size) == chunked
    if chunked:  # the hidden states' size at most (the norm's)
        assert sizes and max(sizes) == h.untyped_storage().nbytes() < logits
    else:
        assert max(sizes) == logits
    want = lm_loss(head(h), targets)
    # relative: the chunks sum their tokens' losses in another order (fp32, unseeded inputs
    # once missed an absolute 1e-6 by 1.4e-6 of 6.24)
    assert abs(loss.item() - want.item()) < 1e-6 * abs(want.item())
    (dh,) = torch.autograd.grad(loss, h)
    (eh,) = torch.autograd.grad(want, h)
    assert torch.allclose(dh, eh, atol=1e-6)


@pytest.mark.parametrize("schedule", ["1f1b", "zbh1"])
def test_with_the_loss_chunked_the_executors_ledger_is_the_simulators(schedule, monkeypatch):
    """Chunked (the head keeps no logits; split, its BI runs its whole backward), the executor's
    peak by kind is the simulator's, as it is plain."""
    from ratrain.config import RunConfig
    from ratrain.schedule.plan import build_plan

    from .executor_ledger import assert_simulated_ledger_is, executor_ledger, small_model

    cfg = RunConfig(model=small_model())
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    plan = build_plan(2, 1, 1, 4, schedule=schedule, view_window=1, state_home="host")
    plain = executor_ledger(cfg, plan, set())
    assert_simulated_ledger_is(plain, plan, cfg)
    monkeypatch.setattr(params, "HEAD_CHUNK_ELEMENTS", 512 * 48)  # 128 tokens: 3 chunks of 48
    chunked = executor_ledger(cfg, plan, set())
    assert_simulated_ledger_is(chunked, plan, cfg)


def _three_steps(engine_of, cfg):
    from .executor_ledger import step_batches

    engine = engine_of(cfg)
    batches = step_batches(cfg)
    losses = [engine.train_step(batches, 1e-2, step).loss for step in range(3)]
    return losses, [p.detach().clone() for s in engine.stage.state.values() for p in s.masters]


def test_a_split_schedule_with_the_loss_chunked_trains_as_one_process(monkeypatch):
    """ZB-H1 with views on the host, the head's loss in chunks (its BI runs its whole backward),
    is the one-process engine's run chunked alike, to fp32's 1e-5; and chunked, the losses are
    the plain loss's to 1e-5 (AdamW at lr 1e-2 moves the weights' last digits further apart)."""
    from ratrain.config import RunConfig
    from ratrain.runtime.engine import LocalEngine, PipelineEngine
    from ratrain.schedule.plan import build_plan

    from .executor_ledger import small_model

    cfg = RunConfig(model=small_model())
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    plan = build_plan(2, 1, 1, 4, schedule="zbh1", view_window=1, state_home="host")
    plain = _three_steps(lambda c: LocalEngine(c, torch.device("cpu")), cfg)
    monkeypatch.setattr(params, "HEAD_CHUNK_ELEMENTS", 512 * 48)
    one = _three_steps(lambda c: LocalEngine(c, torch.device("cpu")), cfg)
    split = _three_steps(lambda c: PipelineEngine(c, plan, None, device=torch.device("cpu")), cfg)
    for run, ref in ((split, one), (one, plain)):
        assert max(abs(a - b) / b for a, b in zip(run[0], ref[0])) < 1e-5, (run[0], ref[0])
    for got, want in zip(split[1], one[1]):
        assert (got - want).norm() <= 1e-5 * want.norm()
    for got, want in zip(one[1], plain[1]):
        assert (got - want).norm() <= 1e-4 * want.norm()
    assert any(not torch.equal(a, b) for a, b in zip(one[1], plain[1]))  # chunked, really
