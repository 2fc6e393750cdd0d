"""Imported first in the fork server (runtime/launch.py's preload), for its effects.

The server ignores SIGTERM and SIGINT, which the launcher blocked for it until now. A scheduler
signals every process of a job step (SLURM's SIGTERM before the kill); a server killed by it
reported each rank it forked as dead (exit code 255) before the ranks could finish their step
and save (--checkpoint-on-interrupt). multiprocessing would ignore SIGINT only after the
preload's imports (seconds of torch): a Ctrl-C then printed the server's traceback. The ranks it
forks inherit the ignore until launch._child sets their own.

The server ends the moment its launcher does, and each rank the moment the server does: the
kernel sends SIGKILL (PR_SET_PDEATHSIG). Its "alive" pipe could not: each fork request the
launcher sends carries a copy of the pipe's write end, so a launcher killed with a request
queued left the server importing torch for seconds, then forking the rank anyway.
"""

import ctypes
import os
import signal
import sys

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # launch.STOP_SIGNALS (not imported: torch)
_LAUNCHER_PID = "RATRAIN_LAUNCHER_PID"  # launch._launch's, for the server's start
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_prctl = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _end_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` ends; end now if it already has (this
    process is then someone else's child). Linux only: elsewhere launch._end_with's pipe ends
    the ranks, once they run."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # (asked first, then looked: no moment is left uncovered)
        os.kill(os.getpid(), signal.SIGKILL)


_server: int | None = os.getpid()  # None in a rank: its own forks are no ranks of this server


def _rank_ends_with_server() -> None:
    """A fork of the server, at once (before it reads what to run): it is a rank."""
    global _server
    server, _server = _server, None
    if server is not None:
        _end_with_parent(server)


# Tied first: test_launcher_killed takes the ignored SIGTERM as the sign that the tie is made.
_launcher = os.environ.pop(_LAUNCHER_PID, None)  # (not for the ranks: they take the launcher's)
if _launcher is not None:  # (None: a server some other code started)
    _end_with_parent(int(_launcher))
os.register_at_fork(after_in_child=_rank_ends_with_server)
for _signum in _STOP_SIGNALS:
    signal.signal(_signum, signal.SIG_IGN)  # (discards one pending while blocked)
signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
