"""Checkpoints saved in the background (checkpoint/saving.py): the same files as a synchronous
save, training goes on while they are written, and a run killed mid-save keeps the checkpoint
before it, from which a resumed run computes the uninterrupted run's losses bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest
from ratrain.checkpoint.saving import SLOW_WRITES_ENV
from ratrain.training.metrics import read_metrics
from ratrain.training.run import train

from .conftest import micro_config
from .test_failure import STARTED, _sigint_as_a_terminal_gives_it, endless_config, losses

pytestmark = pytest.mark.dist


def _saved(run_dir) -> dict:
    """Per checkpoint: its manifest but the config (which says async or sync), the Python
    generators' states and the CPU peak each run measured for its MFU."""
    out = {}
    for ckpt in checkpoint.complete_dirs(run_dir):
        meta = checkpoint.load_meta(ckpt)
        assert manifest.problem(ckpt) is None
        assert sorted(p.name for p in ckpt.iterdir()) == sorted([*meta["files"], manifest.NAME])
        meta.pop("config")
        meta.pop("cpu_core_peak", None)
        for generators in meta["rng"].values():  # each fork reseeds Python's: no two runs agree
            generators.pop("python")
        out[ckpt.name] = meta
    return out


def test_async_saves_the_same_files_as_sync_while_training_goes_on(corpus, tmp_path, monkeypatch):
    cfg = micro_config(*corpus, steps=6)
    cfg.parallel.pp = 2
    cfg.train.checkpoint_every, cfg.train.eval_every, cfg.train.keep_checkpoints = 3, 0, 5
    cfg.train.checkpoint_async = False
    sync = train(cfg, tmp_path / "sync", progress=False, trace=False)
    # each rank writes 3 units, 0.4 s after each: a save takes >= 1.2 s of the writer's time
    monkeypatch.setenv(SLOW_WRITES_ENV, "0.4")
    cfg.train.checkpoint_async = True
    background = train(cfg, tmp_path / "async", progress=False, trace=False)

    got, want = _saved(tmp_path / "async"), _saved(tmp_path / "sync")
    assert list(want) == ["step_000003", "step_000006"]
    assert got == want  # every file's size and sha256, the loader, generators, plan and step
    assert [s["step"] for s in sync["checkpoint_saves"]] == [3, 6]
    first = background["checkpoint_saves"][0]
    assert first["step"] == 3 and first["written_s"] >= 1.2
    assert first["taken_s"] < 0.2 * first["written_s"]  # the training thread only copied
    # steps 4 and 5 ran while step 3's files were being written: they took less than the save
    steps = {r["step"]: r["step_time_s"] for r in read_metrics(tmp_path / "async" / "metrics.jsonl")}
    assert steps[4] + steps[5] < first["written_s"], (steps, first)
    assert losses(tmp_path / "async") == losses(tmp_path / "sync")


def _wait_for(what, proc, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not what():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the run never got there"
        time.sleep(0.05)


def test_a_run_killed_mid_save_keeps_the_previous_checkpoint_and_resumes_exactly(corpus, tmp_path):
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=3, keep_checkpoints=100)
    run_dir = tmp_path / "run"
    # 1 s after each unit's files: a save is in flight for >= 3 s, the kill lands inside it
    proc = subprocess.Popen(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(cfg_file), "--run-dir",
         str(run_dir), "--no-progress", "--checkpoint-async"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_as_a_terminal_gives_it, env={**os.environ, SLOW_WRITES_ENV: "1"})
    STARTED.append(proc)
    first, second = (checkpoint.checkpoint_dir(run_dir, s) for s in (3, 6))
    _wait_for(lambda: first.is_dir(), proc)
    partial = second.with_suffix(".partial")
    _wait_for(lambda: partial.is_dir() and any(partial.glob("unit_*")), proc)
    os.killpg(proc.pid, signal.SIGKILL)  # every process of the run, at once
    proc.communicate(timeout=60)

    assert [p.name for p in checkpoint.complete_dirs(run_dir)] == ["step_000003"]
    assert manifest.problem(first) is None
    assert partial.is_dir() and not (partial / manifest.NAME).exists()  # killed mid-save
    assert max(losses(run_dir)) > 3  # training had gone on past the save it was writing

    def cli(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "ratrain.cli", "train", "--no-progress",
                               "--no-report", *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "skipping" not in done.stderr, done.stderr

    cli("--resume", str(run_dir), "--steps", "8")
    cli("--config", str(cfg_file), "--run-dir", str(tmp_path / "straight"), "--steps", "8")
    assert losses(run_dir) == losses(tmp_path / "straight")  # bit for bit, every step
    assert [p.name for p in checkpoint.complete_dirs(run_dir)] == [
        "step_000003", "step_000006", "step_000008"]
    assert not list(checkpoint.root(run_dir).glob("*.partial"))
