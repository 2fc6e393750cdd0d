"""The closed-form unit costs: what autograd saves in each unit's forward, byte for byte as
torch's saved-tensor hooks see it, for each position encoding, GQA, NormHead and several shapes."""

from __future__ import annotations

import pytest
import torch

from ratrain.models.llama import build_units
from ratrain.models import params
from ratrain.models.params import unit_param_counts
from ratrain.models.presets import get_preset
from ratrain.sim import unit_costs as uc


def _saved_storages(unit, x, targets=None) -> dict[int, int]:
    params = {p.untyped_storage().data_ptr() for p in unit.parameters()}
    x = x.detach().requires_grad_(x.is_floating_point())
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key != x.untyped_storage().data_ptr():
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = unit(x) if targets is None else unit.loss(x, targets)
    return seen, y


@pytest.mark.parametrize("preset,batch,seq,chunked,dtype", [
    ("tiny", 2, 128, False, "float32"), ("tiny-gqa", 3, 64, False, "float32"),
    ("tiny-alibi", 2, 96, False, "float32"), ("small", 1, 256, False, "float32"),
    ("tiny", 2, 128, True, "float32"), ("tiny-alibi", 2, 96, True, "float32"),
    ("tiny", 2, 128, False, "bfloat16"), ("tiny-gqa", 3, 64, True, "bfloat16"),
    ("small", 1, 256, False, "float16")])
def test_saved_bytes_match_what_autograd_saves(preset, batch, seq, chunked, dtype, monkeypatch):
    """chunked: the head's loss in chunks of 40 tokens (models/head_loss.py), which keeps no
    logits (with NormHead too). bfloat16, float16: the units' views, whose RMSNorms save an
    fp32 copy of their input (3 hidden states a block more in bf16 than the count in fp32 had:
    llama2-7b's plan at micro-batch 8 ran out of a 20 GB cap on an H200, 2026-11-28)."""
    if chunked:
        monkeypatch.setattr(params, "HEAD_CHUNK_ELEMENTS", 40 * 512)
    model = get_preset(preset)
    model.n_layers = 1
    embedding, block, head = (u.to(getattr(torch, dtype)) for u in build_units(model, 0))
    tokens = torch.randint(0, model.vocab_size, (batch, seq + 1))
    x, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # as the loader
    shape = uc.UnitShape(model, batch, seq, dtype)
    saved, h = _saved_storages(embedding, x)
    assert sum(saved.values()) == uc.saved_bytes(shape, "embedding") == 0
    saved, h = _saved_storages(block, h)
    assert sum(saved.values()) == uc.saved_bytes(shape, "block") + uc.table_bytes(shape, "block")
    saved, loss = _saved_storages(head, h, targets)
    assert uc.head_chunks(shape) == chunked
    assert sum(saved.values()) == uc.saved_bytes(shape, "head") + targets.untyped_storage().nbytes()
    assert uc.output_bytes(shape, "block") == h.untyped_storage().nbytes()


def test_flops_count_attention_and_parameters():
    model = get_preset("llama2-7b")
    shape = uc.UnitShape(model, 1, 4096)
    block = uc.forward_flops(shape, "block")
    assert block == pytest.approx(2 * 4096 * (unit_param_counts(model)[1] - 2 * 4096)
                                  + 2 * 32 * 4096 ** 2 * 128)  # 2 x params x tokens + causal QK, AV
    assert uc.backward_flops(shape, "block") == 2 * block
    assert uc.forward_flops(shape, "head") == 2 * 4096 * 4096 * 32000


@pytest.mark.parametrize("preset,tied", [("tiny", False), ("tiny-gqa", False), ("tiny-alibi", False),
                                         ("tiny", True)])
def test_param_sizes_are_the_units_parameters_in_order(preset, tied):
    """Sharded state slices each unit's parameters flattened in `parameters()` order: the
    closed form must list the same tensors in the same order (q/k/v biases, a tied head)."""
    from ratrain.runtime.optim import unit_parameters

    model = get_preset(preset)
    model.n_layers, model.tie_embeddings = 1, tied
    owned: set[int] = set()
    for u, unit in enumerate(build_units(model, 0)):
        kind = uc.unit_kind(model, u)
        sizes = [p.numel() for p in unit_parameters(unit, owned)]
        assert uc.param_sizes(model, kind) == sizes
        assert uc.param_tensors(model, kind) == len(sizes)
        assert sum(sizes) == uc.param_count(model, u)


def test_a_shard_is_a_slice_of_the_flattened_parameters():
    """tiny's block (791,040 parameters in 9 tensors) over 7 replicas: slices of 113,006, the
    last padded by 2; replica 0's slice meets the first norm, q and k, replica 6's only down."""
    model = get_preset("tiny")
    d, f = 256, 688
    sizes = [d, d * d, d * d, d * d, d * d, d, d * f, d * f, f * d]
    n = sum(sizes)
    assert uc.param_sizes(model, "block") == sizes and n == 791_040
    s = -(-n // 7)
    assert uc.shard(model, 1, 7) == uc.Shard(size=s, padded=7 * s, real=s, pieces=3)
    assert uc.shard(model, 1, 7, rank=6) == uc.Shard(size=s, padded=7 * s, real=n - 6 * s, pieces=1)
    assert uc.shard(model, 1, 3) == uc.Shard(size=n // 3, padded=n, real=n // 3, pieces=7)
    assert uc.shard(model, 0, 2) == uc.Shard(size=512 * d // 2, padded=512 * d, real=512 * d // 2,
                                             pieces=1)
