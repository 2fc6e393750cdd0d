"""Under `torchrun --max-restarts 1`, a job whose rank is killed restarts and, with
`--resume auto`, continues by itself from its newest checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratrain import checkpoint

from .conftest import micro_config
from .test_failure import losses

pytestmark = pytest.mark.dist


def _workers(agent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(agent)], capture_output=True, text=True).stdout.split()
    return [int(c) for c in out
            if "ratrain.cli" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


def test_a_restarted_torchrun_job_resumes_from_its_run_dir(corpus, tmp_path):
    steps = 60
    cfg = micro_config(*corpus, steps=steps)
    cfg.train.checkpoint_every, cfg.train.eval_every = 4, 0
    cfg.save(tmp_path / "run.yaml")
    run_dir = tmp_path / "run"
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "1", "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"),
         "--pp", "2", "--run-dir", str(run_dir), "--resume", "auto", "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.time() + 120
        while not checkpoint.complete_dirs(run_dir) or len(losses(run_dir)) < 6:
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "training never got there"
            time.sleep(0.1)
        workers = _workers(proc.pid)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)
        first_attempt = losses(run_dir)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # torchrun starts its workers in sessions of their own
            for pid in _workers(proc.pid) + [proc.pid]:
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr
    assert first_attempt and len(first_attempt) < steps  # it was killed part way
    got = losses(run_dir)
    assert sorted(got) == list(range(1, steps + 1))
    # Steps computed by both attempts (after the checkpoint the second resumed from) agree.
    for step, loss in first_attempt.items():
        assert got[step] == loss, (step, got[step], loss)
    assert checkpoint.latest(run_dir).name == f"step_{steps:06d}"
