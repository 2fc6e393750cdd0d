"""Hugging Face directories read as transformers reads them: hidden_act "swish" (SiLU), a
LLaMA config.json without max_position_embeddings (2048, LlamaConfig's default), a base
LlamaModel's weights named as such (not as a tied model's), and a directory named like a
preset refused as `--model NAME`, taken as `--model ./NAME`, and resumed so."""

import json

import pytest
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

from ratrain.errors import UserError
from ratrain.models import config_from_hf

from .cli_runner import run_cli, run_cli_ok, small_config, train_refused

SMALL = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
TRAIN = ("--threads", "1", "--no-progress", "--no-report")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _edit(path, **changes):
    d = json.loads((path / "config.json").read_text())
    d.update(changes)
    (path / "config.json").write_text(json.dumps({k: v for k, v in d.items() if v is not None}))


def test_swish_is_silu_and_max_positions_takes_transformers_default(tmp_path):
    LlamaConfig(**SMALL, hidden_act="swish").save_pretrained(tmp_path / "swish")
    assert config_from_hf(tmp_path / "swish").dim == 32
    LlamaConfig(**SMALL).save_pretrained(tmp_path / "nomax")
    _edit(tmp_path / "nomax", max_position_embeddings=None)
    said = []
    assert config_from_hf(tmp_path / "nomax", said.append).max_seq_len == 2048
    assert said == [f"{tmp_path / 'nomax' / 'config.json'} lacks max_position_embeddings: "
                    "taking 2048, transformers' default for LlamaForCausalLM"]
    LlamaConfig(**SMALL, hidden_act="gelu").save_pretrained(tmp_path / "gelu")
    with pytest.raises(UserError, match="hidden_act 'gelu' is not supported"):
        config_from_hf(tmp_path / "gelu")


def test_a_base_models_weights_are_named_as_such(monkeypatch, capsys, tmp_path):
    LlamaModel(LlamaConfig(**SMALL)).save_pretrained(tmp_path / "base")
    _edit(tmp_path / "base", architectures=["LlamaForCausalLM"])
    capsys.readouterr()  # (transformers' progress bar)
    said = train_refused(monkeypatch, capsys, "--model", "base", *TRAIN)
    assert "its tensors are a base model's (LlamaModel: names without the model. prefix" in said
    assert "tie_word_embeddings" not in said
    # a tied model's weights under an untied config: still the tied hint
    LlamaForCausalLM(LlamaConfig(**SMALL, tie_word_embeddings=True)).save_pretrained(
        tmp_path / "tied")
    _edit(tmp_path / "tied", tie_word_embeddings=False)
    capsys.readouterr()
    said = train_refused(monkeypatch, capsys, "--model", "tied", *TRAIN)
    assert "set tie_word_embeddings to true" in said and "base model" not in said


def test_a_directory_named_like_a_preset_is_refused_unless_spelled_as_one(
        monkeypatch, capsys, tmp_path):
    LlamaConfig(**SMALL).save_pretrained(tmp_path / "tiny")
    config = str(small_config(tmp_path, steps=1))
    said = train_refused(monkeypatch, capsys, "--config", config, "--model", "tiny", *TRAIN)
    assert said == ("error: --model tiny is both a preset and a directory here: --model ./tiny "
                    "for the directory")
    run_cli_ok(monkeypatch, capsys, "train", "--config", config, "--model", "./tiny",
               "--run-dir", "run", *TRAIN)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", "run", "--model", "./tiny",
                           "--steps", "2", *TRAIN)
    assert code == 0, err
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "vocab_size: 300" in saved and "dim: 32" in saved
