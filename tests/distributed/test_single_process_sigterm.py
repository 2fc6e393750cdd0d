"""SIGTERM to a run of one process (pp = dp = 1, `ratrain train`'s default) without
--checkpoint-on-interrupt: until 2026-12-03 it died by the signal, saying nothing, and could
leave the save in flight as its .partial directory. Now it stops as Ctrl-C stops it, said as
SIGTERM's, exit 143, and the run resumes from the newest checkpoint as if never stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest

from .test_failure import endless_config, losses, start, wait_for_steps

pytestmark = pytest.mark.dist


def test_sigterm_stops_a_single_process_run_as_ctrl_c_does(corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=2, keep_checkpoints=100),
                 run_dir, "--pp", "1", "--dp", "1")
    wait_for_steps(proc, run_dir, 5)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    found = re.fullmatch(r"terminated \(SIGTERM\); the newest checkpoint it completed is "
                         r"(step_\d+) \(continue with --resume (\S+)\)", stderr.strip())
    assert found and found[2] == str(run_dir), stderr
    assert not list((run_dir / "checkpoints").glob("*.partial"))
    newest = checkpoint.complete_dirs(run_dir)[-1]
    assert newest.name == found[1] and manifest.problem(newest) is None

    logged = losses(run_dir)
    step = checkpoint.load_meta(newest)["step"]
    resumed = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "train", "--resume", str(run_dir),
         "--steps", str(step + 2), "--no-progress", "--no-report"], capture_output=True,
        text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    got = losses(run_dir)
    assert sorted(got) == list(range(1, step + 3))
    for s in range(step + 1, step + 3):
        if s in logged:  # computed before the signal: the resumed run computes it alike
            assert got[s] == logged[s], (s, got[s], logged[s])
