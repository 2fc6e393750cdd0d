"""The LLaMA-family units: sizes, position encodings, GQA, deterministic per-unit init, presets."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.models import (
    PRESETS,
    LlamaModel,
    build_unit,
    build_units,
    count_params,
    get_preset,
    hf_param_name,
    lm_loss,
    state_bytes,
    unit_param_counts,
)
from ratrain.models.llama import alibi_bias, alibi_slopes
from ratrain.models.rope import apply_rotary, rotary_table

PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "baichuan2-13b": 13_896_668_160,
    "qwen2.5-32b": 32_763_876_352,
    "llama2-70b": 68_976_648_192,
    "llama3.1-8b": 8_030_261_248,
    "llama3.2-1b": 1_235_814_400,
}
TINY = ["tiny", "tiny-gqa", "tiny-alibi", "tiny-llama3"]


def small_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=64, dim=32, n_layers=4, n_heads=4, ffn_dim=48, max_seq_len=64)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_param_counts_match_published(name):
    assert abs(count_params(PRESETS[name]) - PUBLISHED[name]) <= 0.01 * PUBLISHED[name]


@pytest.mark.parametrize("name", TINY)
def test_count_params_equals_built_model(name):
    cfg = get_preset(name)
    units = build_units(cfg, seed=0)
    assert [sum(p.numel() for p in u.parameters()) for u in units] == unit_param_counts(cfg)
    assert sum(p.numel() for p in LlamaModel(cfg).parameters()) == count_params(cfg)


def test_tied_embeddings_share_one_parameter():
    cfg = small_cfg(tie_embeddings=True)
    model = LlamaModel(cfg)
    emb, head = model.units[0], model.units[-1]
    assert head.output_weight() is emb.embed_tokens.weight
    assert "lm_head.weight" not in dict(head.named_parameters())
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    # A head built without unit 0 (last pipeline stage) owns a copy equal to the embedding.
    alone = build_unit(cfg, cfg.n_layers + 1, seed=0)
    assert torch.equal(alone.lm_head.weight, emb.embed_tokens.weight)
    assert hf_param_name(cfg, cfg.n_layers + 1, "lm_head.weight") == "model.embed_tokens.weight"


def test_state_bytes():
    cfg = PRESETS["llama2-7b"]
    n = count_params(cfg)
    sb = state_bytes(cfg, "bfloat16")
    assert sb["compute_weights"] == 2 * n and sb["optimizer"] == 8 * n
    assert sb["total"] == 18 * n
    assert state_bytes(cfg, "float32")["total"] == 16 * n  # the fp32 view is the master itself
    with pytest.raises(UserError):
        state_bytes(cfg, "int8")


def test_rotary_matches_naive_rotation():
    T, hd, theta = 7, 8, 500.0
    x = torch.randn(2, 3, T, hd, dtype=torch.float64)
    cos, sin = rotary_table(T, hd, theta, torch.device("cpu"), torch.float64)
    got = apply_rotary(x, cos, sin)
    want = torch.empty_like(x)
    half = hd // 2
    for pos in range(T):
        for i in range(half):  # pair (i, i + half) rotated by pos * theta^(-2i/hd)
            angle = pos * theta ** (-2 * i / hd)
            a, b = x[..., pos, i], x[..., pos, i + half]
            want[..., pos, i] = a * math.cos(angle) - b * math.sin(angle)
            want[..., pos, i + half] = a * math.sin(angle) + b * math.cos(angle)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_alibi_slopes_and_bias_match_naive_formula():
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    # 12 heads: the 8-head slopes, then every other slope of the 16-head set (BLOOM/Baichuan2).
    assert alibi_slopes(12) == pytest.approx(
        [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    )
    H, T = 12, 6
    bias = alibi_bias(H, T, torch.device("cpu"), torch.float32)
    slopes = alibi_slopes(H)
    for h in range(H):
        for i in range(T):
            for j in range(T):
                want = slopes[h] * (j - i) if j <= i else float("-inf")
                assert bias[h, i, j].item() == pytest.approx(want)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_attention_is_causal(position):
    model = LlamaModel(small_cfg(position=position)).eval()
    x = torch.randint(0, 64, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 64
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa_cfg = small_cfg(dim=64, n_heads=8, n_kv_heads=2, qkv_bias=True)
    mha_cfg = dataclasses.replace(gqa_cfg, n_kv_heads=8)
    gqa, mha = build_unit(gqa_cfg, 1, seed=0), build_unit(mha_cfg, 1, seed=1)
    n_rep, hd = 4, gqa_cfg.head_dim
    sd = gqa.state_dict()
    for proj in ("k_proj", "v_proj"):
        for kind in ("weight", "bias"):
            t = sd[f"self_attn.{proj}.{kind}"]
            # kv head g serves query heads g*n_rep .. g*n_rep + n_rep - 1
            heads = t.reshape(gqa_cfg.n_kv_heads, hd, *t.shape[1:])
            sd[f"self_attn.{proj}.{kind}"] = heads.repeat_interleave(n_rep, dim=0).flatten(0, 1)
    mha.load_state_dict(sd)
    h = torch.randn(2, 10, 64)
    torch.testing.assert_close(gqa(h), mha(h))


def test_units_built_alone_equal_full_model_units():
    cfg = get_preset("tiny")
    full = build_units(cfg, seed=7)
    torch.manual_seed(123)  # the global RNG must not matter
    alone = build_units(cfg, seed=7, indices=[3, 4])
    for u, ref in zip(alone, full[3:5]):
        assert u.index == ref.index
        for (n, p), (rn, rp) in zip(u.named_parameters(), ref.named_parameters()):
            assert n == rn and torch.equal(p, rp)
    other = build_units(cfg, seed=8, indices=[3])[0]
    assert not torch.equal(other.mlp.up_proj.weight, alone[0].mlp.up_proj.weight)


def test_init_scales():
    cfg = get_preset("small")
    block = build_unit(cfg, 1, seed=0)
    assert block.self_attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert block.mlp.down_proj.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert torch.all(block.input_layernorm.weight == 1)
    assert all(p.dtype == torch.float32 for p in block.parameters())


def test_hf_param_names():
    cfg = get_preset("tiny")
    assert hf_param_name(cfg, 0, "embed_tokens.weight") == "model.embed_tokens.weight"
    assert hf_param_name(cfg, 2, "mlp.up_proj.weight") == "model.layers.1.mlp.up_proj.weight"
    assert hf_param_name(cfg, 5, "norm.weight") == "model.norm.weight"
    assert hf_param_name(cfg, 5, "lm_head.weight") == "lm_head.weight"
    names = [n for n, _ in build_unit(get_preset("tiny-gqa"), 1, seed=0).named_parameters()]
    assert "self_attn.q_proj.bias" in names and "post_attention_layernorm.weight" in names


def test_unknown_preset_raises_user_error():
    with pytest.raises(UserError, match="unknown model preset 'nope'; available: .*tiny"):
        get_preset("nope")
    cfg = get_preset("tiny")
    cfg.dim = 1
    assert PRESETS["tiny"].dim == 256  # get_preset hands out copies


@pytest.mark.parametrize("name", TINY)
def test_forward_backward_and_initial_loss(name):
    cfg = get_preset(name)
    model = LlamaModel(cfg, seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 33))
    logits = model(tokens[:, :-1])
    assert logits.shape == (2, 32, cfg.vocab_size)
    loss = lm_loss(logits, tokens[:, 1:])
    want = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, want)
    assert lm_loss(logits.detach().bfloat16(), tokens[:, 1:]).dtype == torch.float32
    # Near-uniform predictions at init; NormHead's unit rows give somewhat larger logits.
    assert abs(loss.item() - math.log(cfg.vocab_size)) < (0.6 if cfg.norm_head else 0.2)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    assert model.units[1].self_attn.q_proj.weight.grad.abs().sum() > 0
