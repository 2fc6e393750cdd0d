"""`ratrain export` writes the run's tokenizer beside the model, as `transformers.AutoTokenizer`
reads it, and config.json's eos id is the one ratrain placed after every document."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from ratrain.data.tokenizer import ByteTokenizer, load_tokenizer

from .cli_runner import run_cli, run_cli_ok as _cli, small_config

# non-ASCII text of 2-, 3- and 4-byte characters, odd spacing, a control byte, and the text of
# the end-of-document token, which ratrain encodes as text
TEXT = ("def straße(x):\n\treturn 'naïve — 日本語 🙂'  \x00\x7f  # <|endoftext|> ends  \n"
        + "".join(map(chr, range(1, 0x800, 7))))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _train(monkeypatch, capsys, tmp_path: Path, *flags: str, vocab_size: int = 257) -> Path:
    path = small_config(tmp_path, steps=1)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["vocab_size"] = vocab_size
    path.write_text(yaml.safe_dump(cfg))
    _cli(monkeypatch, capsys, "train", "--config", str(path), "--run-dir", "run", "--threads",
         "1", "--no-progress", "--no-report", *flags)
    return tmp_path / "run"


def _bpe(monkeypatch, capsys, tmp_path: Path) -> Path:
    small_config(tmp_path)  # for its corpus, tmp_path/text
    _cli(monkeypatch, capsys, "tokenizer", "--data", "text", "--vocab-size", "300", "--out", "tok/")
    return tmp_path / "tok" / "tokenizer.json"


def _config(out: Path, name: str = "config.json") -> dict:
    return json.loads((out / name).read_text())


def test_a_bpe_run_exports_its_tokenizer_and_eos_id(monkeypatch, capsys, tmp_path):
    tok_json = _bpe(monkeypatch, capsys, tmp_path)
    run = _train(monkeypatch, capsys, tmp_path, "--tokenizer", str(tok_json), vocab_size=320)
    said = _cli(monkeypatch, capsys, "export", str(run), "--out", "hf")
    ours = load_tokenizer(str(tok_json))
    assert ours.eos_id == Tokenizer.from_file(str(tok_json)).token_to_id("<|endoftext|>")
    assert f"end of document <|endoftext|> = id {ours.eos_id}" in said

    hf = AutoTokenizer.from_pretrained("hf")
    ids = ours.encode(TEXT)
    assert len(ids) < len(TEXT.encode())  # merges were learned: not the bytes again
    assert hf(TEXT)["input_ids"] == ids
    assert hf.decode(ids) == ours.decode(ids) == TEXT
    assert hf.eos_token_id == ours.eos_id
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == tok_json.read_bytes()
    for name in ("config.json", "generation_config.json"):
        assert _config(tmp_path / "hf", name)["eos_token_id"] == ours.eos_id
    model = AutoModelForCausalLM.from_pretrained("hf")
    assert model.config.eos_token_id == model.generation_config.eos_token_id == ours.eos_id


def test_a_byte_run_exports_a_tokenizer_json_giving_the_same_ids(monkeypatch, capsys, tmp_path):
    run = _train(monkeypatch, capsys, tmp_path)
    said = _cli(monkeypatch, capsys, "export", str(run), "--out", "hf")
    assert "tokenizer: the byte tokenizer (UTF-8 bytes" in said and "= id 256" in said

    ours, hf = ByteTokenizer(), AutoTokenizer.from_pretrained("hf")
    ids = ours.encode(TEXT)
    assert hf(TEXT)["input_ids"] == ids
    assert hf.decode(ids) == TEXT
    assert hf.decode([*ids, 256], skip_special_tokens=True) == ours.decode([*ids, 256])
    assert len(hf) == ours.vocab_size and hf.eos_token_id == ours.eos_id
    assert _config(tmp_path / "hf")["eos_token_id"] == 256  # was transformers' default, 2
    assert _config(tmp_path / "hf", "generation_config.json")["eos_token_id"] == 256


def test_a_tokenizer_moved_since_the_run_is_named_with_the_way_out(monkeypatch, capsys, tmp_path):
    tok_json = _bpe(monkeypatch, capsys, tmp_path)
    run = _train(monkeypatch, capsys, tmp_path, "--tokenizer", str(tok_json), vocab_size=320)
    shutil.move(tmp_path / "tok", tmp_path / "moved")
    (run / "tokenizer.json").unlink()  # a run of before 2026-12-02, which kept no copy of it
    code, _, err = run_cli(monkeypatch, capsys, "export", str(run), "--out", "hf")
    assert code != 0 and "its tokenizer: if it moved, export with `ratrain export " in err, err
    assert "Traceback" not in err and not (tmp_path / "hf").exists()
    _cli(monkeypatch, capsys, "export", str(run), "--out", "hf", "--tokenizer", "moved")
    assert AutoTokenizer.from_pretrained("hf").eos_token_id == load_tokenizer("moved").eos_id


def test_a_run_on_pre_tokenized_ids_writes_no_tokenizer_and_says_so(monkeypatch, capsys, tmp_path):
    ids = np.random.default_rng(0).integers(0, 257, 4096).astype("<u2")
    ids.tofile(tmp_path / "ids.bin")
    run = _train(monkeypatch, capsys, tmp_path, "--data", "ids.bin")
    said = _cli(monkeypatch, capsys, "export", str(run), "--out", "hf")
    assert "tokenizer: none written" in said and "--tokenizer FILE writes it" in said
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    assert "eos_token_id" not in _config(tmp_path / "hf")
