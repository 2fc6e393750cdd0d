"""Under torchrun a node may reach the start's meetings long after the others: it prepares
first (tokenizing a large corpus takes minutes). One that has not arrived within --comm-timeout
ends the run with one line saying so, and that raising --comm-timeout helps, as the other comm
timeouts end it (exit 1). Until 2026-12-03 the waiting rank ended on torch's traceback: a bare
`DistStoreError: wait timeout after 2000ms` from joining the world, or gloo's `Timed out waiting
2000ms for send operation` from process_groups.stop_together where the world was joined before
the node prepared (a resume's rank_0s, the link probe). Rank 1 arrives late here by sleeping
before it starts `ratrain train`, until torchrun stops it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import micro_config

pytestmark = pytest.mark.dist

WAIT_S = 90
"""The longest wait for a run here (each ends in about 8 s on 2 cores)."""

_LATE = '''
import os, sys, time
if sys.argv.pop(1) == "joined":  # as a resume's rank_0s, or the link probe, joins the world
    from ratrain.runtime.process_groups import join_world
    join_world("gloo", 2.0)
if os.environ["RANK"] == "1":
    time.sleep(300)  # still preparing: torchrun stops it once rank 0 has ended
from ratrain.cli import main
main()
'''


def _late_rank_1(corpus, tmp_path: Path, joined: bool) -> tuple[int, str]:
    """`ratrain train` at dp 2 under torchrun, rank 1 late, --comm-timeout 2: the exit status
    and stderr."""
    cfg = micro_config(*corpus, steps=2)
    cfg.train.eval_every = 0
    cfg.save(tmp_path / "run.yaml")
    (tmp_path / "late.py").write_text(_LATE)
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(tmp_path / "late.py"), "joined" if joined else "-", "train", "--config",
         str(tmp_path / "run.yaml"), "--dp", "2", "--run-dir", str(tmp_path / "run"),
         "--no-progress", "--no-trace", "--no-report", "--comm-timeout", "2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun's agent stops its workers on SIGTERM
        _, err = proc.communicate()
        pytest.fail(f"hung: no end in {WAIT_S} s (--comm-timeout 2):\n" + err[-3000:])
    return proc.returncode, err


@pytest.mark.parametrize("joined, said", [
    (False, "joining the world: a rank did not arrive"),
    (True, "the ranks' word on their checks: rank 1 did not arrive")])
def test_a_peer_that_has_not_arrived_ends_the_run_in_one_line(corpus, tmp_path, joined, said):
    code, err = _late_rank_1(corpus, tmp_path, joined)
    assert code != 0
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        f"error: start of training: {said} within --comm-timeout 2 s (still preparing, or "
        "tokenizing its data?); raise --comm-timeout to wait longer"], err[-3000:]
    # rank 0 ended as a comm timeout does (exit 1, no traceback of its own); torchrun stopped
    # rank 1 (SIGTERM)
    ended = re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s+exitcode\s*: (-?\d+)", err)
    assert sorted(ended) == [("0", "1"), ("1", "-15")], err[-3000:]
    assert "DistStoreError" not in err and "unbound_buffer" not in err, err[-3000:]
    assert "ratrain/runtime" not in err, err[-3000:]  # no traceback through ratrain's code
