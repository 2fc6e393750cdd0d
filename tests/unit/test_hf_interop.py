"""Hugging Face interop: transformers' own LLaMA / Qwen2 models are the reference for the logits."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.models import (
    LlamaModel,
    build_units,
    config_from_hf,
    count_params,
    get_preset,
    hf_param_name,
    load_hf_weights,
    save_hf,
)

DIMS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
            vocab_size=80, max_position_embeddings=64, rms_norm_eps=1e-5)
TOL = 1e-4


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Weights well away from a fresh init's near-uniform attention, so position handling shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.15 * torch.randn(p.shape, generator=g))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def ours_logits(model, tokens):
    with torch.no_grad():
        return model.eval()(tokens)


def small_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=80, dim=64, n_layers=2, n_heads=4, ffn_dim=96, max_seq_len=64)
    return ModelConfig(**{**base, **kw})


TOKENS = torch.randint(0, DIMS["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
# Llama 3.1's RoPE scaling over a context of 32: of head_dim 16's wavelengths (6.3, 19.9, 62.8,
# ...) the first is kept, the second blended, the rest slowed 8x
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


@pytest.mark.parametrize(
    "hf_cls,hf_cfg",
    [
        (LlamaForCausalLM, LlamaConfig(**DIMS)),
        (Qwen2ForCausalLM, Qwen2Config(**DIMS, num_key_value_heads=2, rope_theta=1e6)),
        (LlamaForCausalLM, LlamaConfig(**DIMS, num_key_value_heads=2, rope_scaling=LLAMA3,
                                       tie_word_embeddings=True)),
    ],
    ids=["llama", "qwen2", "llama3.2"],
)
def test_hf_checkpoint_loads_with_equal_logits(tmp_path, hf_cls, hf_cfg):
    ref = hf_cls(hf_cfg).eval()
    randomize(ref, seed=1)
    ref.save_pretrained(tmp_path)
    cfg = config_from_hf(tmp_path)
    if hf_cls is Qwen2ForCausalLM:
        assert cfg.qkv_bias and cfg.n_kv_heads == 2 and cfg.rope_theta == 1e6
    ours = LlamaModel(cfg, seed=5)
    load_hf_weights(ours, cfg, tmp_path)
    assert max_diff(ours_logits(ours, TOKENS), hf_logits(ref, TOKENS)) < TOL
    if hf_cfg.tie_word_embeddings:  # Llama 3.2: the scaling read, and it matters here
        assert (cfg.rope_factor, cfg.rope_original_max_len, cfg.tie_embeddings) == (8.0, 32, True)
        unscaled = dataclasses.replace(cfg, rope_factor=1.0)
        plain = LlamaModel(unscaled, seed=5)
        load_hf_weights(plain, unscaled, tmp_path)
        assert max_diff(ours_logits(plain, TOKENS), hf_logits(ref, TOKENS)) > 100 * TOL


def test_sharded_checkpoint_loads_into_one_stage(tmp_path):
    ref = LlamaForCausalLM(LlamaConfig(**DIMS)).eval()
    randomize(ref, seed=2)
    ref.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    cfg = config_from_hf(tmp_path)
    full = LlamaModel(cfg, seed=0)
    load_hf_weights(full, cfg, tmp_path)
    stage = build_units(cfg, seed=9, indices=[2, 3])  # second block and head only
    load_hf_weights(stage, cfg, tmp_path)
    for unit in stage:
        ref_unit = dict(full.units[unit.index].named_parameters())
        for name, p in unit.named_parameters():
            assert torch.equal(p, ref_unit[name]), name


@pytest.mark.parametrize(
    "cfg,arch",
    [
        (small_cfg(), "LlamaForCausalLM"),
        (small_cfg(n_kv_heads=2, rope_theta=1e6, qkv_bias=True), "Qwen2ForCausalLM"),
        (small_cfg(tie_embeddings=True), "LlamaForCausalLM"),
        (small_cfg(rope_factor=8.0, rope_original_max_len=32), "LlamaForCausalLM"),
    ],
    ids=["llama", "qwen2", "tied", "llama3"],
)
def test_export_loads_in_transformers_with_equal_logits(tmp_path, cfg, arch):
    ours = LlamaModel(cfg, seed=3)
    randomize(ours, seed=4)
    save_hf(ours, cfg, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [arch]
    ref = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(ref).__name__ == arch
    assert max_diff(ours_logits(ours, TOKENS), hf_logits(ref, TOKENS)) < TOL
    if cfg.tie_embeddings:
        assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()


def test_baichuan_w_pack_checkpoint_equals_unpacked_model(tmp_path):
    # Baichuan-13B-style layout and config keys, tiny dims: ALiBi (hidden size != 4096), 6 heads.
    cfg = small_cfg(dim=48, n_heads=6, norm_eps=1e-6, position="alibi")
    src = LlamaModel(cfg, seed=1)
    randomize(src, seed=6)
    tensors = {}
    for unit in src.units:
        for local, p in unit.named_parameters():
            tensors[hf_param_name(cfg, unit.index, local)] = p.detach().clone()
    for i in range(cfg.n_layers):
        prefix = f"model.layers.{i}.self_attn."
        qkv = [tensors.pop(f"{prefix}{x}_proj.weight") for x in "qkv"]
        tensors[prefix + "W_pack.weight"] = torch.cat(qkv)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_act": "silu",
        "hidden_size": 48, "intermediate_size": 96, "num_attention_heads": 6,
        "num_hidden_layers": 2, "model_max_length": 64, "rms_norm_eps": 1e-6, "vocab_size": 80,
        "tie_word_embeddings": False,
    }))
    loaded_cfg = config_from_hf(tmp_path)
    got = (loaded_cfg.position, loaded_cfg.norm_head, loaded_cfg.max_seq_len)
    assert got == ("alibi", False, 64)
    dst = LlamaModel(loaded_cfg, seed=2)
    load_hf_weights(dst, loaded_cfg, tmp_path)
    for (n, a), (_, b) in zip(src.named_parameters(), dst.named_parameters()):
        assert torch.equal(a, b), n
    assert max_diff(ours_logits(src, TOKENS), ours_logits(dst, TOKENS)) == 0


def test_alibi_norm_head_export_round_trips(tmp_path):
    cfg = get_preset("tiny-alibi")
    cfg.n_layers = 2
    ours = LlamaModel(cfg, seed=0)
    save_hf(ours, cfg, tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["architectures"] == ["BaichuanForCausalLM"]
    back = config_from_hf(tmp_path)
    assert (back.position, back.norm_head, back.norm_eps) == ("alibi", True, 1e-6)
    again = LlamaModel(back, seed=1)
    load_hf_weights(again, back, tmp_path)
    tokens = TOKENS % cfg.vocab_size
    assert max_diff(ours_logits(ours, tokens), ours_logits(again, tokens)) == 0


# Published Baichuan2 configs: they name neither ALiBi nor NormHead, the dims decide.
BAICHUAN2_13B = {
    "architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 13696, "model_max_length": 4096,
    "num_attention_heads": 40, "num_hidden_layers": 40, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False, "vocab_size": 125696, "z_loss_weight": 0,
}
BAICHUAN2_7B = {**BAICHUAN2_13B, "hidden_size": 4096, "intermediate_size": 11008,
                "num_attention_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 4096}


def test_published_baichuan2_configs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BAICHUAN2_13B))
    cfg = config_from_hf(tmp_path / "config.json")
    preset = get_preset("baichuan2-13b")
    fields = ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "norm_eps", "position")
    for field in fields + ("norm_head",):
        assert getattr(cfg, field) == getattr(preset, field), field
    assert count_params(cfg) == 13_896_668_160
    (tmp_path / "config.json").write_text(json.dumps(BAICHUAN2_7B))
    cfg7 = config_from_hf(tmp_path)
    assert (cfg7.position, cfg7.norm_head) == ("rope", True)


def write_config(tmp_path, **d):
    (tmp_path / "config.json").write_text(json.dumps(d))
    return tmp_path


def test_config_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        config_from_hf(tmp_path / "nowhere")
    gpt2 = write_config(tmp_path, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=64)
    want = (
        r"unsupported architecture 'GPT2LMHeadModel' in .*config\.json; "
        r"supported: LlamaForCausalLM, Qwen2ForCausalLM, BaichuanForCausalLM"
    )
    with pytest.raises(UserError, match=want):
        config_from_hf(gpt2)
    scaling = {"rope_type": "yarn", "factor": 8.0, "rope_theta": 5e5,
               "original_max_position_embeddings": 32}
    write_config(tmp_path, **LlamaConfig(**DIMS, rope_scaling=scaling).to_dict())
    with pytest.raises(UserError, match="RoPE scaling 'yarn'"):
        config_from_hf(tmp_path)


def test_weight_errors_are_user_errors(tmp_path):
    cfg = small_cfg()
    save_hf(LlamaModel(cfg), cfg, tmp_path)
    with pytest.raises(UserError, match="lacks 6 tensor"):  # q/k/v biases of 2 layers
        biased = dataclasses.replace(cfg, qkv_bias=True)
        load_hf_weights(LlamaModel(biased), biased, tmp_path)
    wider = dataclasses.replace(cfg, ffn_dim=128)
    want = r"layers\.0\.mlp\.gate_proj\.weight .* shape \[96, 64\], model expects \[128, 64\]"
    with pytest.raises(UserError, match=want):
        load_hf_weights(LlamaModel(wider), wider, tmp_path)
    with pytest.raises(UserError, match="checkpoint not found"):
        load_hf_weights(LlamaModel(cfg), cfg, tmp_path / "missing")


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama3"])
def test_a_stage_built_a_unit_at_a_time_holds_the_hugging_face_weights(tmp_path, monkeypatch,
                                                                       preset):
    """--model HF_DIR through the executor's stages (bf16 views of host masters, split in two,
    a tied head apart from its embedding too): every master is the tensor of the checkpoint it
    maps to, and each unit is built only after the one before has moved into its state (a
    stage built at once held its whole fp32 weights: 27 GB a rank at llama2-7b)."""
    from safetensors.torch import load_file

    from ratrain.config import RunConfig
    from ratrain.runtime import stage as stage_module
    from ratrain.runtime.stage import Stage

    model = dataclasses.replace(get_preset(preset), n_layers=2)
    save_hf(build_units(model, 7), model, tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    cfg = RunConfig(model=model)
    cfg.train.dtype, cfg.train.init_from, cfg.train.seed = "bfloat16", str(tmp_path), 0
    built, full_at_build = [], []  # the fp32 weights still in built modules at each build
    real_build = stage_module.build_unit

    def build_unit(model_cfg, u, seed, embedding=None):
        full_at_build.append(sum(p.numel() for m in built for p in m.parameters()))
        built.append(real_build(model_cfg, u, seed, embedding=embedding))
        return built[-1]

    monkeypatch.setattr(stage_module, "build_unit", build_unit)
    stages = [Stage(cfg, units, torch.device("cpu"), view_units=units, state_home="host")
              for units in (range(0, 2), range(2, model.n_units))]
    assert len(built) == model.n_units and full_at_build == [0] * model.n_units
    for s in stages:
        for u in s.units:
            state = s.state[u]
            name_of = {id(t): n for n, t in s.modules[u].state_dict(keep_vars=True).items()}
            for p, master in zip(state.params, state.full_masters()):
                assert torch.equal(master, saved[hf_param_name(model, u, name_of[id(p)])])
