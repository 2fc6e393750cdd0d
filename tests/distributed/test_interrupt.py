"""Ctrl-C stops every rank within seconds; with --checkpoint-on-interrupt the ranks first finish
the step together and save a checkpoint, from which a resumed run continues exactly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest

from .test_failure import _gone, _rank_pids, endless_config, losses, start, wait_for_steps

pytestmark = pytest.mark.dist


def _train(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ratrain.cli", "train", "--no-progress", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_ctrl_c_with_checkpoint_on_interrupt_saves_a_checkpoint_that_resumes_exactly(corpus, tmp_path):
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=0)
    run_dir = tmp_path / "run"
    # A terminal's Ctrl-C: SIGINT to the launcher and every rank (one process group).
    proc = start(cfg_file, run_dir, "--checkpoint-on-interrupt")
    wait_for_steps(proc, run_dir, 3)
    children = _rank_pids(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.time()
    _, stderr = proc.communicate(timeout=60)
    assert time.time() - sent < 15
    assert proc.returncode == 130
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    found = re.fullmatch(r"interrupted after step (\d+); saved checkpoint (\S+) "
                         r"\(continue with --resume (\S+)\)", lines[0])
    assert found and found[3] == str(run_dir), lines[0]
    step = int(found[1])
    assert found[2] == str(checkpoint.checkpoint_dir(run_dir, step))
    assert manifest.problem(checkpoint.checkpoint_dir(run_dir, step)) is None
    assert sorted(losses(run_dir)) == list(range(1, step + 1))
    assert all(_gone(child) for child in children)

    _train("--resume", str(run_dir), "--steps", str(step + 3))
    _train("--config", str(cfg_file), "--run-dir", str(tmp_path / "straight"), "--steps", str(step + 3))
    assert losses(run_dir) == losses(tmp_path / "straight")  # bit for bit, every step


def test_under_diloco_ctrl_c_stops_where_the_replicas_next_meet(corpus, tmp_path):
    """The replicas send nothing between outer syncs, the stop request included: they stop
    together at the next one, and say so."""
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=0)
    run_dir = tmp_path / "run"
    proc = start(cfg_file, run_dir, "--pp", "1", "--dp", "2", "--sync", "diloco:6",
                 "--checkpoint-on-interrupt")
    wait_for_steps(proc, run_dir, 6)  # the rows come six at a time, at each outer sync
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    found = re.search(r"interrupted after step (\d+); saved checkpoint", stderr)
    assert found, stderr
    step = int(found[1])
    assert step % 6 == 0 and step >= 12, stderr
    waited = re.search(r"stopping after step (\d+), where the replicas next meet", stderr)
    assert waited is None or int(waited[1]) == step, stderr
    assert sorted(losses(run_dir)) == list(range(1, step + 1))
    assert manifest.problem(checkpoint.checkpoint_dir(run_dir, step)) is None
