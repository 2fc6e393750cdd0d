"""A config value out of range is refused naming what the user gave: the flag where a flag gave
it (until 2026-12-02 `--outer-lr -1` was told `train.outer_lr must be positive`; now `--outer-lr
(train.outer_lr) must be positive`), the key alone where a --config file did. And a Hugging Face config.json's keys that ratrain does not
compute are said, not taken silently."""

from __future__ import annotations

import json

import pytest

from ratrain.errors import UserError
from ratrain.models.hf import config_from_hf

from .cli_runner import run_cli

DILOCO = ("--dp", "2", "--sync", "diloco:2")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _error(monkeypatch, capsys, *args: str) -> str:
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-progress", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize("args,said", [
    ((*DILOCO, "--outer-lr", "-1"), "--outer-lr (train.outer_lr) must be positive, got -1.0"),
    ((*DILOCO, "--outer-lr", "nan"), "--outer-lr (train.outer_lr) must be a finite number, "
     "got nan"),
    ((*DILOCO, "--outer-momentum", "1.5"),
     "--outer-momentum (train.outer_momentum) must be in [0, 1), got 1.5"),
    (("--dp", "2", "--sync", "diloco:2:2", "--outer-mix", "2"),
     "--outer-mix (train.outer_mix) must be in [0, 1), got 2.0"),
    (("--seq-len", "0"), "--seq-len (train.seq_len) must be positive, got 0"),
    (("--seq-len", "100000"), "--seq-len 100000 (train.seq_len) exceeds the model's "
     "max_seq_len 1024"),
    (("--global-batch", "6", "--micro-batch-size", "4"),
     "--global-batch 6 (train.global_batch) is not a multiple of --micro-batch-size 4 "
     "(train.micro_batch_size)"),
])
def test_a_bad_flag_is_named_as_typed(monkeypatch, capsys, args, said):
    assert _error(monkeypatch, capsys, *args) == said


def test_a_config_files_value_keeps_its_key_and_a_flag_it_does_not_name_is_left_out(
        monkeypatch, capsys, tmp_path):
    (tmp_path / "run.yaml").write_text("train:\n  outer_lr: -1.0\n  seq_len: 0\n")
    assert _error(monkeypatch, capsys, "--config", "run.yaml") == (
        "train.seq_len must be positive, got 0")
    # --lr typed, the file's outer_lr refused: "lr" inside "outer_lr" is not the flag's
    assert _error(monkeypatch, capsys, "--config", "run.yaml", "--seq-len", "16", "--lr",
                  "0.01", *DILOCO) == "train.outer_lr must be positive, got -1.0"


def test_a_message_that_names_its_flag_is_not_led_by_it_again(monkeypatch, capsys):
    assert _error(monkeypatch, capsys, "--threads", "0") == (
        "--threads (parallel.threads_per_rank) must be >= 1, got 0")


LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
             num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=80,
             max_position_embeddings=64, rms_norm_eps=1e-5)


@pytest.mark.parametrize("arch,model_type", [("LlamaForCausalLM", "llama"),
                                             ("Qwen2ForCausalLM", "qwen2")])
def test_a_hugging_face_attention_dropout_is_said_to_be_left_out(tmp_path, arch, model_type):
    """HF's Llama and Qwen2 drop attention weights out in training; ratrain has no dropout,
    so a config asking for it trains otherwise: said (until 2026-12-02, silently)."""
    said = []
    (tmp_path / "config.json").write_text(json.dumps(
        {**LLAMA, "architectures": [arch], "model_type": model_type, "attention_dropout": 0.1}))
    cfg = config_from_hf(tmp_path, said.append)
    assert cfg.dim == 64 and len(said) == 1, said
    assert said[0] == (f"{tmp_path / 'config.json'}: attention_dropout 0.1 is not applied: "
                       "ratrain trains without dropout on the attention weights, where Hugging "
                       "Face training drops them out (inference, which drops nothing, is the "
                       "same)")


def test_no_dropout_and_a_pretraining_tp_say_nothing(tmp_path, capsys):
    """pretraining_tp > 1 only split the same products into slices in older transformers (the
    weights are stored whole): nothing for ratrain to compute otherwise."""
    for extra in ({}, {"attention_dropout": 0.0, "pretraining_tp": 1},
                  {"attention_dropout": None, "pretraining_tp": 4}):
        (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **extra}))
        config_from_hf(tmp_path)
        assert capsys.readouterr().err == "", extra


def test_the_dropout_warning_goes_to_stderr_and_only_for_a_config_taken(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "attention_dropout": 0.25}))
    config_from_hf(tmp_path)
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "attention_dropout 0.25 is not applied" in err, err
    (tmp_path / "config.json").write_text(json.dumps(
        {**LLAMA, "attention_dropout": 0.25, "num_attention_heads": 5}))  # 64 / 5 heads
    with pytest.raises(UserError):
        config_from_hf(tmp_path)
    assert capsys.readouterr().err == ""
