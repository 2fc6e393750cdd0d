"""A resume of a run that has trained all its steps (cli/train_resume.py, training/
run_checkpoints.py): a preemptible job reruns its command in a loop, the last time after the
run finished, and that rerun must not look like a failure (until 2026-12-03 it exited 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratrain.training.metrics import read_metrics

from .cli_runner import small_config
from .test_checkpoint_options import _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


FINISHED = "run finished at step 2 of 2: nothing to train (pass --steps N with N > 2 to train further)"


def _finished_run(monkeypatch, capsys, tmp_path) -> tuple[str, ...]:
    """A run of 2 steps in tmp_path/run; the command that trained it."""
    command = ("--config", str(small_config(tmp_path)), "--run-dir", "run", "--resume", "auto",
               "--threads", "1")
    code, err = _train(monkeypatch, capsys, *command)
    assert code == 0, err
    return command


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl")]


def test_the_same_command_again_on_a_finished_run_says_so_and_exits_0(monkeypatch, capsys,
                                                                      tmp_path):
    command = _finished_run(monkeypatch, capsys, tmp_path)
    summary = (tmp_path / "run" / "summary.json").read_bytes()
    code, err = _train(monkeypatch, capsys, *command)
    assert code == 0 and err.strip().splitlines() == [f"--resume auto: {FINISHED}"], err
    # nothing trained, nothing rewritten
    assert _steps(tmp_path / "run") == [1, 2]
    assert (tmp_path / "run" / "summary.json").read_bytes() == summary
    # a larger --steps, the way on, trains on
    code, err = _train(monkeypatch, capsys, *command, "--steps", "3")
    assert code == 0, err
    assert _steps(tmp_path / "run") == [1, 2, 3]


def test_a_finished_run_under_another_command_is_refused_as_before(monkeypatch, capsys, tmp_path):
    command = _finished_run(monkeypatch, capsys, tmp_path)
    code, err = _train(monkeypatch, capsys, *command, "--lr", "0.5")
    assert code == 2 and ("--resume auto: run was started with other settings: --lr 0.003 "
                          "(this command: 0.5)") in err, err


def test_an_explicit_resume_of_a_finished_run_says_the_same_line_and_exits_0(monkeypatch, capsys,
                                                                          tmp_path):
    _finished_run(monkeypatch, capsys, tmp_path)
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--threads", "1")
    lines = err.strip().splitlines()
    assert code == 0 and len(lines) == 1 and lines[0].endswith(FINISHED), err
    assert _steps(tmp_path / "run") == [1, 2]


def test_a_run_finished_past_its_newest_checkpoint_is_finished_too(monkeypatch, capsys,
                                                                   tmp_path):
    """Its summary.json says so (a run that saves at its end only with --checkpoint-on-interrupt's
    save before it): until 2026-12-04 each rerun resumed from the checkpoint and trained the
    rest again, rewriting metrics.jsonl and summary.json."""
    command = (*_finished_run(monkeypatch, capsys, tmp_path), "--steps", "4", "--no-checkpoints")
    code, err = _train(monkeypatch, capsys, *command)  # from step_000002 on, saving none
    assert code == 0, err
    summary = (tmp_path / "run" / "summary.json").read_bytes()
    finished = FINISHED.replace("2", "4")
    code, err = _train(monkeypatch, capsys, *command)
    assert code == 0 and err.strip().splitlines() == [f"--resume auto: {finished}"], err
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--threads", "1")
    assert code == 0 and err.strip().splitlines()[-1] == finished, err
    assert _steps(tmp_path / "run") == [1, 2, 3, 4]
    assert (tmp_path / "run" / "summary.json").read_bytes() == summary
    # one whose metrics.jsonl is removed (the refusals' way to start over) trains on
    (tmp_path / "run" / "metrics.jsonl").unlink()
    code, err = _train(monkeypatch, capsys, *command)
    assert code == 0 and "finished" not in err, err
    assert _steps(tmp_path / "run") == [3, 4]  # (from step_000002)


def test_a_finished_run_without_checkpoints_is_not_started_over(monkeypatch, capsys, tmp_path):
    command = ("--config", str(small_config(tmp_path)), "--run-dir", "run", "--resume", "auto",
               "--threads", "1", "--no-checkpoints")
    assert _train(monkeypatch, capsys, *command)[0] == 0
    code, err = _train(monkeypatch, capsys, *command)
    assert code == 0 and err.strip().splitlines() == [f"--resume auto: {FINISHED}"], err
    assert _steps(tmp_path / "run") == [1, 2]
