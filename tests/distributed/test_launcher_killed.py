"""A launcher killed outright (SIGKILL) during start-up takes every process it started with it,
whenever it dies: as its fork server starts, while the server imports torch, as the server forks
the ranks (runtime/forkserver_signals.py). The server's own "alive" pipe did not end it: each
fork request queued for it carries a copy of the pipe's write end, so a server busy importing
went on, and forked a rank after its launcher was gone.

The processes of a run are those of its session: `start` makes the launcher a session leader,
and none of what it starts leaves it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from .test_failure import _children, endless_config, start

pytestmark = pytest.mark.dist

_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)  # in /proc/PID/status's SigIgn mask


def _in_session(sid: int) -> list[int]:
    """The processes of session `sid` that still run (a zombie has ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue  # (gone meanwhile)
        fields = stat[stat.rfind(")") + 2:].split()  # state ppid pgrp session ...
        if fields and fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def _wait_until(found, proc, what: str):
    deadline = time.time() + 120
    while not (result := found()):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, what
        time.sleep(0.01)
    return result


def _fork_server(launcher: int) -> list[int]:
    return [c for c in _children(launcher)
            if "forkserver" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


def _ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(mask, 16) & _SIGTERM_BIT)


def _server_starting(proc) -> None:
    _wait_until(lambda: _fork_server(proc.pid), proc, "no fork server")


def _server_importing(proc) -> None:
    """Frozen once it is past forkserver_signals (its first import: SIGTERM ignored), the way a
    server busy importing torch is: neither its pipe nor anything else of its own can end it."""
    server, = _wait_until(lambda: _fork_server(proc.pid), proc, "no fork server")
    _wait_until(lambda: _ignores_sigterm(server), proc, "the server never ignored SIGTERM")
    os.kill(server, signal.SIGSTOP)


def _ranks_forking(proc) -> None:
    server, = _wait_until(lambda: _fork_server(proc.pid), proc, "no fork server")
    _wait_until(lambda: _children(server), proc, "no rank forked")


@pytest.mark.parametrize("when", [_server_starting, _server_importing, _ranks_forking],
                         ids=lambda when: when.__name__.strip("_"))
def test_a_launcher_killed_during_start_up_leaves_no_process(corpus, tmp_path, when):
    proc = start(endless_config(corpus, tmp_path, checkpoint_every=0), tmp_path / "run")
    when(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)  # (not communicate: its pipes stay open while any process of it lives)
    deadline = time.time() + 10  # what the kernel ends is gone at once; 10 s for a busy machine
    while left := _in_session(proc.pid):
        assert time.time() < deadline, f"still running: {left}"
        time.sleep(0.1)
    proc.communicate(timeout=10)
