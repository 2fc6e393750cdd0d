"""A rank that dies takes the whole run down quickly, with one clear message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import micro_config

pytestmark = pytest.mark.dist


def _spawned_children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(c) for c in out
            if "spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


def test_killing_one_rank_stops_all(corpus, tmp_path):
    cfg = micro_config(*corpus, steps=100_000)
    cfg.parallel.pp = 2
    cfg_file = tmp_path / "run.yaml"
    cfg.save(cfg_file)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(cfg_file),
         "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and metrics.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "training never started"
        time.sleep(0.5)
    children = _spawned_children(proc.pid)
    assert len(children) == 2
    os.kill(children[1], signal.SIGKILL)
    killed_at = time.time()
    _, stderr = proc.communicate(timeout=60)
    assert time.time() - killed_at < 60
    assert proc.returncode == 1
    assert "rank 1 failed" in stderr and "SIGKILL" in stderr, stderr
    assert stderr.count("failed") == 1, stderr
    assert "Traceback" not in stderr
    for child in children:  # no rank left behind
        assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()


def test_an_exception_in_the_ranks_is_reported_once(corpus, tmp_path):
    cfg = micro_config(*corpus, steps=30)
    cfg.parallel.pp = 2
    cfg.train.lr, cfg.train.warmup_steps = 1e5, 0  # diverges within a few steps on every rank
    cfg.save(tmp_path / "run.yaml")
    proc = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"),
         "--run-dir", str(tmp_path / "run"), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: rank ") and "TrainingDiverged: loss is nan" in lines[0]
