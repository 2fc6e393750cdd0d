"""Under torchrun only rank 0 hashes a whole checkpoint, and its choice is every rank's: a final
checkpoint altered in place (same size, other bytes) is skipped by rank 0 alone, and the world
resumes from the older one and trains to the end. Until 2026-12-03 the other ranks saw the
final one at its sizes and ended (--resume auto: exit 0, leaving rank 0 waiting --comm-timeout;
--resume RUN: exit 2 on every rank, "finished"). A run that is finished ends as before."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ratrain import checkpoint
from ratrain.training.metrics import read_metrics

from .conftest import micro_config

pytestmark = pytest.mark.dist

WAIT_S = 90
"""The longest wait for a run here (each takes about 12 s on 2 cores, 20 s on busy ones)."""
COMM_TIMEOUT_S = 150
"""Past WAIT_S: a rank left waiting for one that ended shows as a hang."""


def _torchrun(corpus, cwd: Path, *args: str) -> tuple[int, str]:
    """`ratrain train` under torchrun, 2 ranks of pp 2: its exit status and stderr."""
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ratrain.cli", "train", "--config", str(cwd / "run.yaml"), "--pp", "2",
         "--no-progress", "--no-trace", "--no-report", "--comm-timeout", str(COMM_TIMEOUT_S),
         *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun's agent stops its workers on SIGTERM
        _, err = proc.communicate()
        pytest.fail(f"hung: no end in {WAIT_S} s (--comm-timeout {COMM_TIMEOUT_S}):\n"
                    + err[-3000:])
    return proc.returncode, err


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    """A 4-step run under torchrun, checkpointed at steps 2 and 4."""
    where = tmp_path_factory.mktemp("finished")
    cfg = micro_config(*corpus, steps=4)
    cfg.train.checkpoint_every, cfg.train.eval_every = 2, 0
    cfg.save(where / "run.yaml")
    code, err = _torchrun(corpus, where, "--run-dir", str(where / "run"))
    assert code == 0, err[-3000:]
    return where


def _copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copy(finished / "run.yaml", tmp_path / "run.yaml")
    shutil.copytree(finished / "run", tmp_path / "run")
    return tmp_path / "run"


def _records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}


@pytest.mark.parametrize("resume", ["auto", "run"])
def test_a_final_checkpoint_altered_in_place_resumes_every_rank_from_the_older_one(
        corpus, finished, tmp_path, resume):
    run = _copy(finished, tmp_path)
    before = _records(run)
    # the last stage's head: rank 1's unit, which it loads (hashing it) from rank 0's choice
    altered = run / "checkpoints" / "step_000004" / "unit_0005.safetensors"
    data = bytearray(altered.read_bytes())
    data[-1] ^= 0xFF
    altered.write_bytes(data)
    assert checkpoint.manifest.problem(altered.parent, hashed=False) is None  # whole at its sizes
    args = ("--run-dir", str(run), "--resume", "auto") if resume == "auto" else (
        "--resume", str(run))
    code, err = _torchrun(corpus, tmp_path, *args)
    assert code == 0, err[-3000:]
    assert ("skipping checkpoint step_000004: unit_0005.safetensors does not match its sha256 "
            "in the manifest (altered or corrupted); the newest that verifies is step_000002"
            ) in err, err[-3000:]
    assert err.count("skipping checkpoint step_000004") == 1, err[-3000:]  # hashed once
    assert "nothing to train" not in err
    after = _records(run)
    assert sorted(after) == [1, 2, 3, 4]
    for step in (1, 2):  # kept as they were, timings and all: steps 1-2 were not trained again
        assert after[step] == before[step], step
    for step in (3, 4):  # trained again from step 2's checkpoint: the same plan, the same losses
        assert after[step]["loss"] == before[step]["loss"], step
    final = checkpoint.latest(run)
    assert final.name == "step_000004" and checkpoint.manifest.problem(final) is None


def test_a_finished_run_still_ends_on_every_rank(corpus, finished, tmp_path):
    """--resume auto: said once, exit 0 on every rank; --resume RUN: an error, exit 2 on every
    rank (cli/train_resume.py, docs/reliability.md)."""
    run = _copy(finished, tmp_path)
    done = (f"{run} finished at step 4 of 4: nothing to train (pass --steps N with N > 4 to "
            "train further)")
    code, err = _torchrun(corpus, tmp_path, "--run-dir", str(run), "--resume", "auto")
    assert code == 0, err[-3000:]
    assert [line for line in err.splitlines() if "nothing to train" in line] == [
        f"--resume auto: {done}"], err[-3000:]
    code, err = _torchrun(corpus, tmp_path, "--resume", str(run))
    assert code != 0
    said = re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s+exitcode\s*: (\d+)", err)
    assert sorted(said) == [("0", "2"), ("1", "2")], err[-3000:]  # torchrun's table of them
    said = [line for line in err.splitlines() if "nothing to train" in line]
    # rank 1's: its own until 2026-12-03, now rank 0's ("rank 0 stopped before training: ")
    assert f"error: {done}" in said and len(said) == 2 and all(
        line.startswith("error: ") and line.endswith(done) for line in said), err[-3000:]
    assert sorted(_records(run)) == [1, 2, 3, 4]
