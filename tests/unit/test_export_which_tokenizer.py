"""`ratrain export --tokenizer T` writes T only where it is the tokenizer the run trained with
(or where the run does not know its own: .bin ids, a record gone), carries the chat template
and pad token of the tokenizer's directory, and says where transformers cannot load the model
by itself (Baichuan's ALiBi / NormHead)."""

import json
import shutil

import pytest
import yaml
from transformers import AutoTokenizer

from .cli_runner import run_cli, run_cli_ok, small_config

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
            "<|im_end|>\n{% endfor %}")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _train(monkeypatch, capsys, tmp_path, run: str, *flags: str, **model) -> str:
    path = small_config(tmp_path, steps=1)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"].update(vocab_size=320, **model)
    path.write_text(yaml.safe_dump(cfg))
    run_cli_ok(monkeypatch, capsys, "train", "--config", str(path), "--run-dir", run,
               "--threads", "1", "--no-progress", "--no-report", *flags)
    return run


def _bpe(monkeypatch, capsys, tmp_path, out: str, vocab: int = 300) -> str:
    small_config(tmp_path)  # its corpus, tmp_path/text
    run_cli_ok(monkeypatch, capsys, "tokenizer", "--data", "text", "--vocab-size", str(vocab),
               "--out", f"{out}/")
    return out


def _refused(monkeypatch, capsys, *args: str) -> str:
    code, _, err = run_cli(monkeypatch, capsys, "export", *args)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_tokenizer_the_run_did_not_train_with_is_refused(monkeypatch, capsys, tmp_path):
    _bpe(monkeypatch, capsys, tmp_path, "tok")
    _bpe(monkeypatch, capsys, tmp_path, "other", vocab=290)
    byte_run = _train(monkeypatch, capsys, tmp_path, "byte_run")
    said = _refused(monkeypatch, capsys, byte_run, "--out", "hf", "--tokenizer", "tok")
    assert "--tokenizer tok is not the tokenizer byte_run trained with, the byte tokenizer" in said
    assert not (tmp_path / "hf").exists()
    run_cli_ok(monkeypatch, capsys, "export", byte_run, "--out", "hf", "--tokenizer", "byte")

    bpe_run = _train(monkeypatch, capsys, tmp_path, "bpe_run", "--tokenizer", "tok")
    said = _refused(monkeypatch, capsys, bpe_run, "--out", "hf2", "--tokenizer", "other")
    assert "--tokenizer other is not the tokenizer bpe_run trained with" in said
    assert "bpe_run/tokenizer.json (its copy)" in said and not (tmp_path / "hf2").exists()
    shutil.copytree("tok", "tok_elsewhere")  # the same file, elsewhere: the run's
    run_cli_ok(monkeypatch, capsys, "export", bpe_run, "--out", "hf2", "--tokenizer",
               "tok_elsewhere")
    assert (tmp_path / "hf2" / "tokenizer.json").read_bytes() == (
        tmp_path / "tok" / "tokenizer.json").read_bytes()


def test_a_run_that_cannot_say_its_tokenizer_takes_the_one_given(monkeypatch, capsys, tmp_path):
    _bpe(monkeypatch, capsys, tmp_path, "tok")
    run = _train(monkeypatch, capsys, tmp_path, "run", "--tokenizer", "tok")
    shutil.move("tok", "moved")
    (tmp_path / run / "tokenizer.json").unlink()  # a run of before 2026-12-02: no copy
    code, out, err = run_cli(monkeypatch, capsys, "export", run, "--out", "hf", "--tokenizer",
                             "moved")
    assert code == 0, err
    assert "is not there to compare it with" in err and "exporting with moved" in err


def test_the_chat_template_and_pad_token_are_kept_and_exported(monkeypatch, capsys, tmp_path):
    _bpe(monkeypatch, capsys, tmp_path, "qtok")
    (tmp_path / "qtok" / "tokenizer_config.json").write_text(json.dumps(
        {"pad_token": "<|endoftext|>", "chat_template": "stale: chat_template.jinja wins"}))
    (tmp_path / "qtok" / "chat_template.jinja").write_text(TEMPLATE)
    run = _train(monkeypatch, capsys, tmp_path, "run", "--tokenizer", "qtok")
    shutil.rmtree("qtok")  # the run keeps what it needs
    said = run_cli_ok(monkeypatch, capsys, "export", run, "--out", "hf")
    assert "with its chat template, pad token <|endoftext|>" in said
    hf = AutoTokenizer.from_pretrained("hf")
    assert hf.pad_token == "<|endoftext|>"
    chat = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"


def test_an_alibi_export_says_transformers_needs_baichuans_code(monkeypatch, capsys, tmp_path):
    plain = _train(monkeypatch, capsys, tmp_path, "plain")
    code, _, err = run_cli(monkeypatch, capsys, "export", plain, "--out", "hf")
    assert code == 0 and "Baichuan" not in err, err
    run = _train(monkeypatch, capsys, tmp_path, "alibi", position="alibi")
    code, _, err = run_cli(monkeypatch, capsys, "export", run, "--out", "hf_alibi")
    assert code == 0, err
    notes = [line for line in err.splitlines() if "Baichuan" in line]
    assert len(notes) == 1 and "Baichuan-13B's modeling_baichuan.py" in notes[0]
    assert "trust_remote_code=True" in notes[0]
    written = json.loads((tmp_path / "hf_alibi" / "config.json").read_text())
    assert written["model_type"] == "baichuan"
