"""What a run says of the weights it starts from (models/hf_start.py), and the messages about a
Hugging Face directory's weights and config.json: a leftover train.init_from of other shapes
named, a --config's model field overriding config.json warned of, where the weights come from,
an untied head the weights lack, config.json's own keys in its refusals, a typo'd key."""

import dataclasses
import json

import pytest
import yaml

from ratrain.config import ModelConfig, RunConfig
from ratrain.errors import UserError
from ratrain.models import LlamaModel, config_from_hf, save_hf
from ratrain.models.hf_files import check_weights

from .cli_runner import run_cli, small_config

MODEL = ModelConfig(name="hf", vocab_size=257, dim=32, n_layers=2, n_heads=2, ffn_dim=64,
                    max_seq_len=64, rope_theta=50000.0, norm_eps=1e-6)
TRAIN = ("--threads", "1", "--steps", "1", "--no-report", "--no-checkpoints")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _hf_dir(tmp_path, cfg: ModelConfig = MODEL):
    save_hf(LlamaModel(cfg), cfg, tmp_path / "hf")
    return tmp_path / "hf"


def _config(tmp_path, model: dict, **train) -> str:
    path = small_config(tmp_path, **train)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"] = model
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_leftover_init_from_of_other_shapes_is_named(monkeypatch, capsys, tmp_path):
    hf = _hf_dir(tmp_path)
    config = _config(tmp_path, {**dataclasses.asdict(MODEL), "dim": 64}, init_from=str(hf))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", config, *TRAIN)
    assert code != 0
    assert f"train.init_from {hf} (the weights the run starts from)" in err
    assert "has shape [257, 32], model expects [257, 64]" in err


def test_a_config_field_other_than_the_weights_config_json_is_warned_of_once(
        monkeypatch, capsys, tmp_path):
    hf = _hf_dir(tmp_path)
    config = _config(tmp_path, {**dataclasses.asdict(MODEL), "rope_theta": 10000.0,
                                "norm_eps": 1e-5}, init_from=str(hf))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", config, *TRAIN)
    assert code == 0, err
    assert err.count("warning: model.rope_theta 10000 differs from 50000, the rope_theta of "
                     f"{hf / 'config.json'}") == 1
    assert err.count("warning: model.norm_eps 1e-05 differs from 1e-06, the rms_norm_eps") == 1
    assert f"weights: {hf / 'model.safetensors'} (" in err


def test_the_start_says_where_the_weights_come_from(monkeypatch, capsys, tmp_path):
    hf = _hf_dir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", str(hf), "--data",
                           str(tmp_path / "hf" / "config.json"), "--seq-len", "16",
                           "--global-batch", "2", "--eval-batches", "0", *TRAIN)
    assert code == 0, err
    assert f"weights: {hf / 'model.safetensors'} (21 tensors)" in err  # 2 layers of 9, 3 more
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", _config(
        tmp_path, dataclasses.asdict(MODEL), seed=3), *TRAIN)
    assert code == 0, err
    assert "weights: random init (seed 3)" in err


def test_an_untied_head_the_weights_lack_names_tie_word_embeddings(tmp_path):
    hf = _hf_dir(tmp_path, dataclasses.replace(MODEL, tie_embeddings=True))
    d = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**d, "tie_word_embeddings": False}))
    with pytest.raises(UserError, match=r"lacks 1 tensor the model needs, e\.g\. lm_head\.weight;"
                       r" .*tie_word_embeddings: false in config\.json"):
        check_weights(hf, config_from_hf(hf))


def test_a_config_json_refusal_names_its_own_keys(tmp_path):
    hf = _hf_dir(tmp_path)
    d = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**d, "num_attention_heads": 4,
                                                "num_key_value_heads": 3}))
    with pytest.raises(UserError, match="config.json: num_attention_heads 4 is not divisible by "
                                        "num_key_value_heads 3$"):
        config_from_hf(hf)


def test_a_typo_d_key_is_given_the_key_it_misspells(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"train": {"warmup_step": 3, "stpes": 2}}))
    with pytest.raises(UserError, match=r"'train': stpes \(did you mean steps\?\), warmup_step "
                                        r"\(did you mean warmup_steps\?\)"):
        RunConfig.load(path)


def test_a_model_dir_without_safetensors_says_why_its_weights_are_random(tmp_path):
    from ratrain.cli.options import resolve_model

    hf = _hf_dir(tmp_path)
    (hf / "model.safetensors").unlink()
    (hf / "model.pt").write_bytes(b"pickle")
    with pytest.raises(UserError, match=r"its weights \(model.pt\) are of a kind ratrain does "
                                        "not read"):
        resolve_model(str(hf), RunConfig())
    (hf / "model.pt").unlink()
    cfg = RunConfig()
    cfg.train.init_from = "/elsewhere"  # a --config's leftover
    resolve_model(str(hf), cfg)
    assert cfg.train.init_from is None
