"""Hugging Face interop: transformers' own LLaMA / Qwen2 models are the reference for the logits."""

import dataclasses
import json
import re

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


# --- directories whose weights are not what config.json says, refused before any process ---


def hf_dir(path, shard: bool = False, **config):
    """A tiny transformers LLaMA saved in `path` (in shards of ~100 KB: 4 of them)."""
    ref = LlamaForCausalLM(LlamaConfig(**{**DIMS, **config})).eval()
    randomize(ref, seed=7)
    ref.save_pretrained(path, **({"max_shard_size": "100KB"} if shard else {}))
    return path


def resolved(path, tokenizer=None):
    from ratrain.cli.options import resolve_model
    from ratrain.config import RunConfig

    cfg = RunConfig()
    resolve_model(str(path), cfg, tokenizer)
    return cfg


def test_export_refuses_a_directory_that_holds_weights(tmp_path):
    """Exported into a sharded model's directory, the old index and shards stayed beside the new
    model.safetensors: transformers read the new weights, ratrain the old ones."""
    hf_dir(tmp_path / "hf", shard=True)
    before = (tmp_path / "hf" / "config.json").read_text()
    cfg = small_cfg()
    with pytest.raises(UserError, match=r"hf already holds weights \(model-00001-of-0000.\."
                                        r"safetensors, .* \.\.\.\): export into a new directory"):
        save_hf(LlamaModel(cfg), cfg, tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").read_text() == before
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    save_hf(LlamaModel(cfg), cfg, tmp_path / "new")
    with pytest.raises(UserError, match="new already holds weights"):  # nor itself, again
        save_hf(LlamaModel(cfg), cfg, tmp_path / "new")


def _shards(d):
    return sorted(d.glob("model-*.safetensors"))


def _write(f, text):
    f.write_text(text)


@pytest.mark.parametrize("spoil,said", [
    (lambda d: [f.unlink() for f in _shards(d)],
     r"hf lacks 4 of the shards its index names: model-00001-of-00004\.safetensors, "
     r"model-00002-of-00004\.safetensors, model-00003-of-00004\.safetensors and 1 more"),
    (lambda d: _shards(d)[-1].unlink(), "lacks 1 of the shards its index names: model-00004"),
    (lambda d: _write(d / "model.safetensors.index.json", "{"),
     r"cannot read .*model\.safetensors\.index\.json: Expecting"),
    (lambda d: _write(d / "model.safetensors.index.json", '{"metadata": {}}'),
     r"model\.safetensors\.index\.json has no weight_map"),
    (lambda d: _write(_shards(d)[0], "version https://git-lfs.github.com/spec/v1\noid x\n"),
     r"model-00001-of-00004\.safetensors is a git-lfs pointer, not the weights: fetch them"),
    (lambda d: _write(_shards(d)[1], "garbage" * 10),
     r"model-00002-of-00004\.safetensors is not a readable safetensors file"),
    (lambda d: _write(d / "model.safetensors", ""),
     r"holds both model\.safetensors and model\.safetensors\.index\.json"),
], ids=["no-shards", "a-shard-missing", "index-not-json", "no-weight-map", "lfs-pointer",
        "garbage", "stale-single-file"])
def test_broken_weight_files_are_refused_when_the_arguments_are_read(tmp_path, spoil, said):
    """They trained from random weights (no shard at all) or crashed in the stages' build."""
    d = hf_dir(tmp_path / "hf", shard=True)
    assert len(_shards(d)) == 4
    spoil(d)
    with pytest.raises(UserError, match=said):
        resolved(d)


def _edit_weights(d, edit):
    from safetensors.torch import load_file

    tensors = load_file(d / "model.safetensors")
    edit(tensors)
    save_file(tensors, d / "model.safetensors")


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))


def test_a_tied_head_saved_apart_must_be_the_embedding(tmp_path, capsys):
    """tie_word_embeddings with a different lm_head.weight: ratrain tied them, transformers 5
    keeps lm_head (logits 1.7 apart)."""
    d = hf_dir(tmp_path / "hf")
    _edit_config(d, tie_word_embeddings=True)
    with pytest.raises(UserError, match=r"ties the head to the embedding .* but lm_head\.weight "
                                        r"differs from model\.embed_tokens\.weight"):
        resolved(d)
    _edit_weights(d, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    capsys.readouterr()
    cfg = resolved(d)
    assert cfg.model.tie_embeddings and cfg.train.init_from
    assert capsys.readouterr().err == ""  # the head's copy is no unused tensor


@pytest.mark.parametrize("edit,config,said", [
    (None, {"num_hidden_layers": 1},
     r"hf holds weights of model\.layers\.1, but its config\.json has num_hidden_layers 1"),
    (lambda t: t.update({"model.layers.2.mlp.up_proj.weight": torch.zeros(96, 64)}),
     {}, r"holds weights of model\.layers\.2, but"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.ones(64)}), {},
     r"holds 1 bias tensor\(s\) its config\.json's model has none of, e\.g\. "
     r"model\.layers\.0\.self_attn\.q_proj\.bias"),
    (lambda t: t.update({k: (100 * v).to(torch.int32) for k, v in t.items()}), {},
     r"model\.embed_tokens\.weight in .* is I32, not floating point"),
], ids=["fewer-layers-in-config", "extra-layer", "q-bias-in-llama", "int32"])
def test_weights_the_config_does_not_describe_are_refused(tmp_path, edit, config, said):
    """They were dropped (or cast to float) silently."""
    d = hf_dir(tmp_path / "hf")
    if edit:
        _edit_weights(d, edit)
    _edit_config(d, **config)
    with pytest.raises(UserError, match=said):
        resolved(d)


def test_other_unused_tensors_are_named_in_one_warning(tmp_path, capsys):
    d = hf_dir(tmp_path / "hf")
    extra = {f"model.extra.{i}": torch.zeros(2) for i in range(4)}
    _edit_weights(d, lambda t: t.update({"model.rotary_emb.inv_freq": torch.ones(8), **extra}))
    capsys.readouterr()
    assert resolved(d).train.init_from == str(d.resolve())
    err = capsys.readouterr().err
    assert err == (f"warning: --model {d}: 5 tensor(s) in its weights are not used by the model: "
                   "model.extra.0, model.extra.1, model.extra.2 and 2 more\n")


def test_a_baichuan_export_with_rope_scaling_round_trips(tmp_path):
    """A RoPE model with a NormHead is written as Baichuan; its Llama 3 scaling was not read
    back."""
    cfg = small_cfg(norm_head=True, rope_factor=4.0, rope_high_freq_factor=2.0,
                    rope_original_max_len=32, rope_theta=12345.0, name="hf")
    ours = LlamaModel(cfg, seed=3)
    randomize(ours, seed=4)
    save_hf(ours, cfg, tmp_path / "hf")
    back = config_from_hf(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
        "BaichuanForCausalLM"]
    assert back == cfg
    again = LlamaModel(back, seed=1)
    load_hf_weights(again, back, tmp_path / "hf")
    assert max_diff(ours_logits(ours, TOKENS), ours_logits(again, TOKENS)) == 0


LLAMA3_PARAMS = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
                 "rope_theta": 1e4}


@pytest.mark.parametrize("config,said", [
    ({"rms_norm_eps": "1e-5"}, r'rms_norm_eps is "1e-5", expected a number'),
    ({"vocab_size": "301"}, r'vocab_size is "301", expected an integer'),
    ({"num_hidden_layers": True}, r"num_hidden_layers is true, expected an integer"),
    ({"rms_norm_eps": None}, r"rms_norm_eps is null, expected a number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": None}},
     r"rope_parameters\.rope_theta is null, expected a number"),
    ({"rope_parameters": {k: v for k, v in LLAMA3_PARAMS.items() if k != "low_freq_factor"}},
     r"lacks 'rope_parameters\.low_freq_factor'"),
    ({"rope_scaling": "llama3", "rope_parameters": None},
     r"rope_scaling \"llama3\" \(not an object\)"),
    ({"tie_word_embeddings": "false"}, r'tie_word_embeddings is "false", expected true or false'),
], ids=["eps-string", "vocab-string", "layers-bool", "eps-null", "theta-null",
        "llama3-incomplete", "scaling-string", "tie-string"])
def test_config_values_of_the_wrong_type_are_named(tmp_path, config, said):
    """Each crashed with a TypeError or KeyError (exit 1, a traceback)."""
    write_config(tmp_path, **{**LlamaConfig(**DIMS).to_dict(), **config})
    with pytest.raises(UserError, match=said):
        config_from_hf(tmp_path)


@pytest.mark.parametrize("text", ["[1, 2]", "null"])
def test_a_config_that_is_no_object_is_refused(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    said = re.escape(f"config.json: expected a JSON object, got {text}")
    with pytest.raises(UserError, match=said):
        config_from_hf(tmp_path)


def test_a_tokenizer_json_beside_the_model_is_said_to_be_unused(tmp_path, capsys):
    d = hf_dir(tmp_path / "hf")
    (d / "tokenizer.json").write_text("{}")
    capsys.readouterr()
    resolved(d)
    assert capsys.readouterr().err == (
        f"warning: --model {d}: its tokenizer.json is not used (the byte tokenizer is); "
        f"--tokenizer {d / 'tokenizer.json'} uses it\n")
    resolved(d, tokenizer=str(d / "tokenizer.json"))
    assert capsys.readouterr().err == ""


def test_plan_reads_no_tokenizer_and_says_nothing_of_one(tmp_path, monkeypatch, capsys):
    """(`train` warns of a directory's unused tokenizer.json: resolved's test above.) `plan`
    reads no tokenizer: it does not warn of one, and --tokenizer is train's (until 2026-12-04
    plan took it and its plan file dropped it, and after that it warned of a tokenizer it then
    refused the flag for)."""
    from .cli_runner import run_cli

    d = hf_dir(tmp_path / "hf", vocab_size=300)
    (d / "tokenizer.json").write_text("{}")
    plan = ("plan", "--model", str(d), "--seq-len", "32", "--global-batch", "4")
    code, _, err = run_cli(monkeypatch, capsys, *plan)
    assert code == 0, err
    assert "tokenizer" not in err, err
    code, _, err = run_cli(monkeypatch, capsys, *plan, "--tokenizer", str(d / "tokenizer.json"))
    assert code == 2 and "give it to `ratrain train --plan FILE`" in err, err
