"""With --checkpoint-on-interrupt, a stop signal that reaches one torchrun node only (Ctrl-C in
its terminal, a scheduler's SIGTERM to it) stops every rank alike: the ranks agree on the
signal with the step's figures (training/step_meetings.agreed_stop), save, and each says the
same line and exits 130 or 143. Until 2026-12-04 the ranks not signalled saved and then ended
silently with exit 0, which torchrun's agent took for a finished run (it then waited 300 s in
its exit barrier for the other node)."""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest

from .conftest import micro_config
from .nodes import start_nodes

pytestmark = pytest.mark.dist

STOPPED_WITHIN_S = 30
"""How long after the signal every rank must have ended (a step, a save and the exit take a
few seconds)."""


def _start_two_nodes(corpus, tmp_path, *flags: str) -> list[subprocess.Popen]:
    """`ratrain train` at dp 2 as two torchrun nodes of one rank each (torchrun's environment,
    each node in a directory of its own), for as long as it takes to stop them."""
    cfg = micro_config(*corpus, steps=100_000)
    cfg.train.eval_every, cfg.train.checkpoint_every = 0, 0
    cfg.save(tmp_path / "run.yaml")
    return start_nodes(corpus, tmp_path / "run.yaml", "stop-agreed",
                       [["--comm-timeout", "60", "--checkpoint-on-interrupt", *flags]] * 2)


def _wait_for_rows(procs: list[subprocess.Popen], metrics, rows: int) -> None:
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= rows):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, "training never got there"
        time.sleep(0.05)


@pytest.mark.parametrize("flags, signum, how, rows", [
    ((), signal.SIGTERM, "terminated (SIGTERM)", 2),
    # the replicas meet every 20 steps only: the node asked says when they will stop
    (("--sync", "diloco:20"), signal.SIGINT, "interrupted", 20),
])
def test_a_signal_to_one_node_stops_every_rank_with_its_exit_code(corpus, tmp_path, flags,
                                                                  signum, how, rows):
    procs = _start_two_nodes(corpus, tmp_path, *flags)
    try:
        _wait_for_rows(procs, tmp_path / "node_0" / "run" / "metrics.jsonl", rows)
        procs[1].send_signal(signum)
        sent = time.monotonic()
        ended = [p.communicate(timeout=STOPPED_WITHIN_S)[1] for p in procs]
        assert time.monotonic() - sent < STOPPED_WITHIN_S
    finally:
        for p in procs:
            p.kill()
    steps = set()
    for rank, (proc, err) in enumerate(zip(procs, ended)):
        assert proc.returncode == 128 + signum, (rank, err[-3000:])
        found = re.search(rf"^{re.escape(how)} after step (\d+); saved checkpoint "
                          r"run/checkpoints/step_(\d+) \(continue with --resume run\)$", err,
                          re.MULTILINE)
        assert found and found[1] == str(int(found[2])), (rank, err[-3000:])
        steps.add(int(found[1]))
        assert "Traceback" not in err
    assert len(steps) == 1, ended
    step = steps.pop()
    if flags:
        assert step % 20 == 0 and step > rows, ended
        waited = re.findall(r"stopping after step (\d+), where the replicas next meet", ended[1])
        assert waited == [str(step)], ended[1][-3000:]
