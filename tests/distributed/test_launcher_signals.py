"""The launcher of a local multi-process run takes its ranks with it: Ctrl-C and SIGTERM (a
scheduler's warning) stop them, and a SIGKILL'd launcher leaves none training on as orphans
(runtime/launch.py: the ranks are the fork server's children, not the launcher's)."""

from __future__ import annotations

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
from ratrain.checkpoint.saving import SLOW_WRITES_ENV

from .test_failure import (_children, _gone, _rank_pids, endless_config, losses, start,
                           wait_for_steps)

pytestmark = pytest.mark.dist


def _launched(pid: int) -> list[int]:
    """The ranks and the fork server they are forks of (it lives as long as any of them)."""
    servers = [c for c in _children(pid)
               if "forkserver" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]
    ranks = _rank_pids(pid)
    assert len(servers) == 1 and len(ranks) == 2, (servers, ranks)
    return servers + ranks


def _wait_gone(pids: list[int], within: float) -> None:
    deadline = time.time() + within
    while not all(_gone(pid) for pid in pids):
        assert time.time() < deadline, [pid for pid in pids if not _gone(pid)]
        time.sleep(0.1)


# the launcher alone, or every process of the run: SLURM signals every process of a job step
TO = {"launcher": os.kill, "every process": os.killpg}


@pytest.mark.parametrize("signum, said, to", [
    (signal.SIGINT, "interrupted", "launcher"),  # Ctrl-C where the ranks' SIGINT is ignored
    (signal.SIGTERM, "terminated (SIGTERM)", "launcher"),
    (signal.SIGTERM, "terminated (SIGTERM)", "every process"),
])
def test_a_stop_signal_stops_all_ranks_within_seconds(corpus, tmp_path, signum, said, to):
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=0)
    run_dir = tmp_path / "run"
    proc = start(cfg_file, run_dir)
    wait_for_steps(proc, run_dir, 2)
    launched = _launched(proc.pid)
    TO[to](proc.pid, signum)
    sent = time.time()
    _, stderr = proc.communicate(timeout=30)  # (a rank left holds its pipes)
    assert time.time() - sent < 10
    assert proc.returncode == 128 + signum, stderr  # as a shell says of the signal: 130, 143
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0] == (f"{said}: stopped all 2 ranks; there is no checkpoint to resume from "
                        "yet (--checkpoint-on-interrupt saves one at Ctrl-C)"), stderr
    server, *ranks = launched
    assert all(_gone(rank) for rank in ranks)  # the launcher waited for them
    _wait_gone([server], 5)  # it ends at its own pace, once the last of them is gone
    assert not checkpoint.complete_dirs(run_dir)


def test_ctrl_c_names_the_newest_checkpoint_the_run_keeps(corpus, tmp_path):
    """It said "the run keeps its checkpoints up to the last completed save" whether it had
    one or none."""
    run_dir = tmp_path / "run"
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=1, checkpoint_async=False),
                 run_dir)
    wait_for_steps(proc, run_dir, 3)
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    newest = checkpoint.complete_dirs(run_dir)[-1].name
    assert stderr.strip() == (f"interrupted: stopped all 2 ranks; the newest complete "
                              f"checkpoint is {newest} (continue with --resume {run_dir})")


def test_ctrl_c_while_the_fork_server_imports_says_one_line(corpus, tmp_path):
    """multiprocessing has its fork server ignore SIGINT only after the preload's imports
    (seconds of torch): a Ctrl-C then printed the server's KeyboardInterrupt traceback."""
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=0), tmp_path / "run")
    deadline = time.time() + 60
    while not [c for c in _children(proc.pid) if "forkserver" in Path(
            f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().startswith("interrupted"), stderr


@pytest.mark.parametrize("to", TO)
def test_sigterm_with_checkpoint_on_interrupt_saves_a_checkpoint_that_verifies(corpus, tmp_path,
                                                                              to):
    """To every process, the ranks' own SIGTERM killed them before the launcher could ask for
    the save: a rank's SIGTERM is now the same request as its SIGINT. (That such a checkpoint
    resumes exactly, test_interrupt's Ctrl-C test shows.)"""
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=0)
    run_dir = tmp_path / "run"
    proc = start(cfg_file, run_dir, "--checkpoint-on-interrupt")
    wait_for_steps(proc, run_dir, 2)
    launched = _launched(proc.pid)
    TO[to](proc.pid, signal.SIGTERM)
    sent = time.time()
    _, stderr = proc.communicate(timeout=30)
    assert time.time() - sent < 15
    assert proc.returncode == 143, stderr  # 130 until 2026-12-02: said as Ctrl-C
    found = re.fullmatch(r"terminated \(SIGTERM\) after step (\d+); saved checkpoint (\S+) "
                         r"\(continue with --resume (\S+)\)", stderr.strip())
    assert found, stderr
    step = int(found[1])
    assert manifest.problem(checkpoint.checkpoint_dir(run_dir, step)) is None
    server, *ranks = launched
    assert all(_gone(rank) for rank in ranks)  # the launcher waited for them
    _wait_gone([server], 5)  # it ends at its own pace, once the last of them is gone


def test_a_killed_launcher_leaves_no_rank_running(corpus, tmp_path):
    cfg_file = endless_config(corpus, tmp_path, checkpoint_every=0)
    run_dir = tmp_path / "run"
    proc = start(cfg_file, run_dir)
    wait_for_steps(proc, run_dir, 2)
    launched = _launched(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)  # (not communicate: its pipes stay open while any rank lives)
    # the ranks see their pipe from the launcher close and end themselves (SIGKILL); once
    # they are gone, so is the fork server
    _wait_gone(launched, 10)
    proc.communicate(timeout=10)


def test_sigterm_to_a_single_process_run_saves_and_says_sigterm(corpus, tmp_path):
    """One process (and each torchrun worker) stops in its own loop: its exit said Ctrl-C's
    130 of a scheduler's SIGTERM."""
    run_dir = tmp_path / "run"
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=0), run_dir, "--pp", "1",
                 "--dp", "1", "--checkpoint-on-interrupt")
    wait_for_steps(proc, run_dir, 2)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    found = re.fullmatch(r"terminated \(SIGTERM\) after step (\d+); saved checkpoint \S+ "
                         r"\(continue with --resume \S+\)", stderr.strip())
    assert found, stderr
    assert manifest.problem(checkpoint.checkpoint_dir(run_dir, int(found[1]))) is None


@pytest.mark.parametrize("first, code, said", [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),  # the first says why
])
def test_a_second_signal_stops_a_single_process_run_at_once(corpus, tmp_path, monkeypatch, first,
                                                            code, said):
    """With --checkpoint-on-interrupt: the second Ctrl-C was taken as the first again, and the
    run finished its step and its save (minutes, for a large model) before it stopped."""
    # the save after the first signal takes 12 s (2 s after each of the model's 6 units), and
    # stops between two units when dropped
    monkeypatch.setenv(SLOW_WRITES_ENV, "2")
    run_dir = tmp_path / "run"
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=0), run_dir, "--pp", "1",
                 "--dp", "1", "--checkpoint-on-interrupt")
    wait_for_steps(proc, run_dir, 2)
    os.kill(proc.pid, first)
    time.sleep(1)
    os.kill(proc.pid, signal.SIGINT)
    sent = time.time()
    try:
        _, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the second signal did not stop the run")
    assert time.time() - sent < 6
    assert proc.returncode == code, stderr
    assert stderr.strip().startswith(f"{said}; "), stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not checkpoint.complete_dirs(run_dir)


def test_sigterm_stops_a_single_process_run_as_ctrl_c_does(corpus, tmp_path):
    """Without --checkpoint-on-interrupt: until 2026-12-03 it died by the signal, saying
    nothing, and could leave the save in flight as its .partial directory. Now it stops as
    Ctrl-C stops it, said as SIGTERM's, exit 143, and resumes as if never stopped."""
    run_dir = tmp_path / "run"
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=2, keep_checkpoints=100),
                 run_dir, "--pp", "1", "--dp", "1")
    wait_for_steps(proc, run_dir, 5)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    found = re.fullmatch(r"terminated \(SIGTERM\); the newest complete checkpoint is "
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
