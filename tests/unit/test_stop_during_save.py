"""A stop request (Ctrl-C, SIGTERM) while a save is in flight, in a one-process run
(training/loop.py, checkpoint/saving.py): the save, its state taken already, is let finish and
said; a second request drops it, and the run says which it dropped. And a run stopped before
its first save was made is no run whose checkpoints were moved (training/run_checkpoints.py):
--resume auto starts it over. Until 2026-12-04 the save was dropped silently (a run stopped in
its end-of-run save lost every step), and such a run could not be resumed at all."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest
from ratrain.checkpoint.saving import SLOW_WRITES_ENV
from ratrain.training.metrics import read_metrics

from .cli_runner import small_config
from .test_checkpoint_options import _refused, _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _start(tmp_path: Path, slow_s: float, *args: str, **train) -> subprocess.Popen:
    """`ratrain train` of small_config in tmp_path/run, in a process of its own, its writer
    slowed by `slow_s` a unit (4 units)."""
    cfg = small_config(tmp_path, **train)
    return subprocess.Popen(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(cfg), "--run-dir", "run",
         "--no-progress", "--no-report", "--no-trace", *args], cwd=tmp_path,
        env={**os.environ, SLOW_WRITES_ENV: str(slow_s)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal


def _writing(proc: subprocess.Popen, run: Path, step: int) -> None:
    """Wait until the save of `step` is being written (its partial directory is there)."""
    partial = checkpoint.checkpoint_dir(run, step).with_suffix(".partial")
    deadline = time.time() + 30
    while not partial.is_dir():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the save never started"
        time.sleep(0.02)


def _ended(proc: subprocess.Popen) -> list[str]:
    try:
        return proc.communicate(timeout=30)[1].strip().splitlines()
    finally:
        proc.kill()


def test_a_stop_lets_the_save_in_flight_finish_and_says_so(tmp_path, monkeypatch, capsys):
    """SIGTERM in the end-of-run save: the run had trained every step, and kept none."""
    run = tmp_path / "run"
    proc = _start(tmp_path, 0.8, steps=6, checkpoint_every=3)
    _writing(proc, run, 6)
    proc.send_signal(signal.SIGTERM)
    lines = _ended(proc)
    assert proc.returncode == 143, lines
    assert "waiting for the save of step_000006 to finish (Ctrl-C again to drop it)" in lines
    assert lines[-1] == ("terminated (SIGTERM); the newest complete checkpoint is step_000006 "
                         "(continue with --resume run)"), lines
    assert manifest.problem(checkpoint.checkpoint_dir(run, 6)) is None
    # and the run is done: the command again trains nothing
    code, err = _train(monkeypatch, capsys, "--config", str(tmp_path / "small.yaml"),
                       "--run-dir", "run", "--resume", "auto")
    assert code == 0 and "run finished at step 6 of 6: nothing to train" in err, err


def test_a_second_stop_drops_the_save_in_flight_and_names_it(tmp_path):
    run = tmp_path / "run"
    proc = _start(tmp_path, 0.8, steps=6, checkpoint_every=3)
    _writing(proc, run, 6)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)  # (the wait is said after a second)
    proc.send_signal(signal.SIGINT)
    sent = time.time()
    lines = _ended(proc)
    assert time.time() - sent < 5  # the writer stops at the next unit
    assert proc.returncode == 130, lines
    assert "waiting for the save of step_000006 to finish (Ctrl-C again to drop it)" in lines
    assert lines[-1] == ("interrupted; the save of step_000006 in flight was dropped; the newest "
                         "complete checkpoint is step_000003 (continue with --resume run)"), lines
    assert [p.name for p in checkpoint.complete_dirs(run)] == ["step_000003"]
    assert not list((run / "checkpoints").glob("*.partial"))


def test_a_run_stopped_before_its_first_save_was_made_starts_over(tmp_path, monkeypatch, capsys):
    """--checkpoint-sync: the stop lands in the save's write, in the training thread, which
    cannot finish it. Nothing was saved, and nothing was moved or deleted: --resume RUN says
    so, and --resume auto starts the run over, with or without its empty checkpoints/ (a stop
    as the state was being taken leaves none)."""
    run = tmp_path / "run"
    proc = _start(tmp_path, 2, "--checkpoint-sync", steps=100, checkpoint_every=3)
    _writing(proc, run, 3)
    proc.send_signal(signal.SIGTERM)
    lines = _ended(proc)
    assert proc.returncode == 143, lines
    assert lines[-1] == ("terminated (SIGTERM); the save of step_000003 in flight was dropped; "
                         "there is no checkpoint to resume from yet (--checkpoint-on-interrupt "
                         "saves one at Ctrl-C)"), lines
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
    said = ("the run saves one every 3 steps and at its end, and its first save (step 3) was "
            "not made before it stopped at step 3; --resume auto --run-dir run starts it over")
    assert (run / "checkpoints").is_dir()
    _refused(monkeypatch, capsys, said, "--resume", "run")
    shutil.rmtree(run / "checkpoints")  # (it said the directory was moved or deleted)
    _refused(monkeypatch, capsys, said, "--resume", "run")
    code, err = _train(monkeypatch, capsys, "--config", str(tmp_path / "small.yaml"),
                       "--run-dir", "run", "--resume", "auto", "--steps", "4")
    assert code == 0 and "starting the run from step 0" in err, err
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]
