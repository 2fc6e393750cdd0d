"""`ratrain export` into the run's own directory or its checkpoints: refused before anything
is written; a --tokenizer that is already the --out directory's tokenizer.json is kept, not
copied onto itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from .cli_runner import run_cli, run_cli_ok, small_config


@pytest.fixture
def bpe_run(monkeypatch, capsys, tmp_path) -> Path:
    """A run trained with --tokenizer FILE, which keeps a copy of it as RUN/tokenizer.json."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    path = small_config(tmp_path, steps=1)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["vocab_size"] = 320
    path.write_text(yaml.safe_dump(cfg))
    run_cli_ok(monkeypatch, capsys, "tokenizer", "--data", "text", "--vocab-size", "300",
               "--out", "tok/")
    run_cli_ok(monkeypatch, capsys, "train", "--config", str(path), "--run-dir", "run",
               "--threads", "1", "--no-progress", "--no-report", "--tokenizer",
               "tok/tokenizer.json")
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    return tmp_path / "run"


def test_an_out_that_is_the_run_or_its_checkpoints_is_refused_before_writing(
        monkeypatch, capsys, bpe_run):
    before = sorted(p.relative_to(bpe_run) for p in bpe_run.rglob("*"))
    for out, said in ((bpe_run, "is the run directory itself"),
                      (bpe_run / "checkpoints", "is inside the run's checkpoint directory"),
                      (bpe_run / "checkpoints" / "hf", "is inside the run's checkpoint directory")):
        code, _, err = run_cli(monkeypatch, capsys, "export", str(bpe_run), "--out", str(out))
        assert code == 2, err
        assert err.startswith(f"error: --out {out} {said}")
        assert f"e.g. --out {bpe_run / 'hf'}" in err
    assert sorted(p.relative_to(bpe_run) for p in bpe_run.rglob("*")) == before


def test_a_tokenizer_already_in_out_is_kept_where_it_is(monkeypatch, capsys, bpe_run):
    out = bpe_run / "hf"
    out.mkdir()
    shutil.copy(bpe_run / "tokenizer.json", out / "tokenizer.json")
    kept = (out / "tokenizer.json").read_text()
    run_cli_ok(monkeypatch, capsys, "export", str(bpe_run), "--out", str(out), "--tokenizer",
               str(out / "tokenizer.json"))
    assert (out / "tokenizer.json").read_text() == kept
    assert (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file()
