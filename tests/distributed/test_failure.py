"""A rank that dies, hangs or diverges takes the whole run down quickly, with one clear message,
and no checkpoint completed before is lost."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest
from ratrain.training.metrics import read_metrics

from .conftest import micro_config

pytestmark = pytest.mark.dist


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return sorted(int(c) for c in out)


def _rank_pids(pid: int) -> list[int]:
    """The ranks a `ratrain train` process launched, in rank order: the children of its fork
    server (runtime/launch.py)."""
    servers = [c for c in _children(pid)
               if "forkserver" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]
    return [rank for server in servers for rank in _children(server)]


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in status.read_text()
    except OSError:
        return True


def endless_config(corpus, tmp_path, **train):
    """pp=2 for as long as it takes to stop it; a constant learning rate, so that a resumed run
    computes the same steps whatever --steps it is given."""
    cfg = micro_config(*corpus, steps=100_000)
    cfg.parallel.pp = 2
    cfg.train.warmup_steps, cfg.train.min_lr, cfg.train.eval_every = 0, cfg.train.lr, 0
    for key, value in train.items():
        setattr(cfg.train, key, value)
    cfg.save(tmp_path / "run.yaml")
    return tmp_path / "run.yaml"


STARTED: list[subprocess.Popen] = []
"""Runs started by `start`, each the leader of its own process group: conftest kills what is
left of them after each test, so a failed test leaves no ranks training behind."""


def _sigint_as_a_terminal_gives_it() -> None:
    # A shell starts background jobs with SIGINT ignored, and children inherit that: the run
    # under test must see Ctrl-C as it would from a terminal, however pytest was started.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(cfg_file: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(cfg_file),
         "--run-dir", str(run_dir), "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_as_a_terminal_gives_it)
    STARTED.append(proc)
    return proc


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, steps: int, timeout: float = 120) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= steps):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "training never got there"
        time.sleep(0.2)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")}


def test_killing_one_rank_stops_all_and_loses_no_checkpoint(corpus, tmp_path):
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=3, keep_checkpoints=100)
    run_dir = tmp_path / "run"
    proc = start(cfg_file, run_dir)
    wait_for_steps(proc, run_dir, 8)
    # saves run in the background: step 6's may still be writing at step 8 on a busy machine
    # (a CI run, 2026-11-27); the run goes on saving every 3 steps meanwhile
    deadline = time.time() + 60
    while len(checkpoint.complete_dirs(run_dir)) < 2 and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    children = _rank_pids(proc.pid)
    assert len(children) == 2
    complete = [p.name for p in checkpoint.complete_dirs(run_dir)]
    os.kill(children[1], signal.SIGKILL)
    killed_at = time.time()
    _, stderr = proc.communicate(timeout=60)
    assert time.time() - killed_at < 60
    assert proc.returncode == 1
    assert "rank 1 failed" in stderr and "SIGKILL" in stderr, stderr
    assert stderr.count("failed") == 1, stderr
    assert "Traceback" not in stderr
    assert all(_gone(child) for child in children)  # no rank left behind

    # Every checkpoint completed before the kill is still there and verifies.
    after = checkpoint.complete_dirs(run_dir)
    assert len(complete) >= 2 and set(complete) <= {p.name for p in after}
    assert all(manifest.problem(p) is None for p in after)
    assert not list((run_dir / "checkpoints").glob("*.partial"))

    logged = losses(run_dir)
    newest = checkpoint.load_meta(after[-1])["step"]
    resumed = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "train", "--resume", str(run_dir),
         "--steps", str(newest + 2), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "skipping" not in resumed.stderr
    got = losses(run_dir)
    assert sorted(got) == list(range(1, newest + 3))
    for step in range(newest + 1, newest + 3):
        if step in logged:  # computed before the kill: the resumed run computes it again alike
            assert got[step] == logged[step], (step, got[step], logged[step])


def test_a_stopped_rank_ends_the_run_after_the_comm_timeout(corpus, tmp_path):
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=0)
    run_dir = tmp_path / "run"
    proc = start(cfg_file, run_dir, "--comm-timeout", "5")
    wait_for_steps(proc, run_dir, 3)
    children = _rank_pids(proc.pid)
    assert len(children) == 2
    os.kill(children[1], signal.SIGSTOP)
    stopped_at = time.time()
    try:
        _, stderr = proc.communicate(timeout=60)
        took = time.time() - stopped_at
    finally:
        for child in children:
            if not _gone(child):
                os.kill(child, signal.SIGKILL)
                os.kill(child, signal.SIGCONT)
    assert 5 <= took < 25, took
    assert proc.returncode == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert re.fullmatch(r"error: rank 0 failed: step \d+: waited 5 s in \S.* for rank 1 "
                        r"\(stopped, hung, or slower than --comm-timeout 5\)", lines[0]), lines[0]
    assert all(_gone(child) for child in children)  # the stopped one too


def test_a_diverged_run_stops_at_the_step_and_keeps_the_last_good_checkpoint(corpus, tmp_path):
    cfg = micro_config(*corpus, steps=30)
    cfg.parallel.pp = 2
    cfg.train.lr, cfg.train.warmup_steps = 1e5, 0  # diverges within a few steps on every rank
    cfg.train.checkpoint_every = 1
    cfg.save(tmp_path / "run.yaml")
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"),
         "--run-dir", str(run_dir), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    found = re.fullmatch(r"error: rank \d failed: loss is nan at step (\d+); the last good "
                         r"checkpoint is step_(\d+); lower the learning rate", lines[0])
    assert found, lines[0]
    bad, good = int(found[1]), int(found[2])
    assert good == bad - 1
    assert checkpoint.latest(run_dir).name == f"step_{good:06d}"
    assert json.loads((checkpoint.latest(run_dir) / "manifest.json").read_text())["step"] == good
    assert not checkpoint.checkpoint_dir(run_dir, bad).exists()
