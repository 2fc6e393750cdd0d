"""Under torchrun, the same `--resume auto` command rerun on a run that has trained all its steps
ends on every rank with exit 0, saying so once (cli/train_resume.py): a preemptible job's loop
reruns it after the run finished."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import micro_config
from .test_failure import losses

pytestmark = pytest.mark.dist


def test_a_finished_runs_rerun_under_torchrun_ends_with_exit_0(corpus, tmp_path):
    cfg = micro_config(*corpus, steps=2)
    cfg.train.eval_every = 0
    cfg.save(tmp_path / "run.yaml")
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"), "--pp",
               "2", "--run-dir", str(tmp_path / "run"), "--resume", "auto", "--no-progress"]
    for attempt in (1, 2):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, (attempt, done.stderr[-3000:])
    said = [line for line in done.stderr.splitlines() if "nothing to train" in line]
    assert said == [f"--resume auto: {tmp_path / 'run'} finished at step 2 of 2: nothing to "
                    "train (pass --steps N with N > 2 to train further)"], done.stderr[-3000:]
    assert sorted(losses(tmp_path / "run")) == [1, 2]
