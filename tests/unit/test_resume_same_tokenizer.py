"""A resume that names the run's tokenizer again by another file of the same bytes (the run's own
copy, RUN/tokenizer.json, or a copy of the original) goes on (training/resume_settings.py's
same_setting: until 2026-12-03 it was refused as a change of data.tokenizer), the run's copy
also where the original has been replaced by another tokenizer since; another tokenizer is
still refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from ratrain.training.metrics import read_metrics

from .cli_runner import run_cli, small_config
from .test_run_tokenizer import FLAGS, _bpe


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _run_on_a_bpe_tokenizer(monkeypatch, capsys, tmp_path: Path) -> tuple[Path, Path]:
    """A 1-step run in tmp_path/run trained on tok.json; its config file."""
    path = small_config(tmp_path, steps=1)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["vocab_size"] = 320
    path.write_text(yaml.safe_dump(cfg))
    _bpe(monkeypatch, capsys, "text", "tok.json")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(path), "--run-dir", "run",
                           "--tokenizer", "tok.json", *FLAGS)
    assert code == 0, err
    return tmp_path / "run", path


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl")]


def test_the_runs_copy_or_a_copy_of_the_original_is_the_runs_tokenizer(monkeypatch, capsys,
                                                                       tmp_path):
    run, _ = _run_on_a_bpe_tokenizer(monkeypatch, capsys, tmp_path)
    shutil.copy("tok.json", "same.json")
    for step, tokenizer in ((2, "run/tokenizer.json"), (3, "same.json")):
        code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", "run", "--tokenizer",
                               tokenizer, "--steps", str(step), *FLAGS)
        assert code == 0, err
        assert _steps(run) == list(range(1, step + 1))


def test_resume_auto_takes_the_runs_copy_as_its_tokenizer(monkeypatch, capsys, tmp_path):
    run, config = _run_on_a_bpe_tokenizer(monkeypatch, capsys, tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(config), "--run-dir",
                           "run", "--resume", "auto", "--tokenizer", "run/tokenizer.json",
                           "--steps", "2", *FLAGS)
    assert code == 0, err
    assert _steps(run) == [1, 2]


@pytest.mark.parametrize("how", ["run", "auto"])
def test_the_runs_copy_is_its_tokenizer_where_the_original_was_replaced(monkeypatch, capsys,
                                                                        tmp_path, how):
    """The refusal of a resume on the replaced original offers the copy as a way out: it was
    refused as a change of --tokenizer (the original's path -> the copy), its bytes compared
    with the replaced original's."""
    run, config = _run_on_a_bpe_tokenizer(monkeypatch, capsys, tmp_path)
    (tmp_path / "other.py").write_text("def other(a, b):\n    return [a * b for _ in range(9)]\n" * 40)
    _bpe(monkeypatch, capsys, "other.py", "tok.json")
    resume = (("--resume", "run") if how == "run" else
              ("--config", str(config), "--run-dir", "run", "--resume", "auto"))
    again = () if how == "run" else ("--tokenizer", "tok.json")  # (its config names none)
    code, _, err = run_cli(monkeypatch, capsys, "train", *resume, *again, "--steps", "2", *FLAGS)
    assert code == 2 and "(--tokenizer run/tokenizer.json)" in err, err
    code, _, err = run_cli(monkeypatch, capsys, "train", *resume, "--tokenizer",
                           "run/tokenizer.json", "--steps", "2", *FLAGS)
    assert code == 0, err
    assert _steps(run) == [1, 2]


def test_another_tokenizer_is_still_refused(monkeypatch, capsys, tmp_path):
    run, _ = _run_on_a_bpe_tokenizer(monkeypatch, capsys, tmp_path)
    (tmp_path / "other.py").write_text("def other(a, b):\n    return [a * b for _ in range(9)]\n" * 40)
    _bpe(monkeypatch, capsys, "other.py", "other.json")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", "run", "--tokenizer",
                           "other.json", "--steps", "2", *FLAGS)
    assert code == 2 and err.strip().splitlines() == [
        f"error: cannot change --tokenizer ({tmp_path / 'tok.json'} -> other.json) when "
        "resuming; start a new run instead"], err
    assert _steps(run) == [1]
