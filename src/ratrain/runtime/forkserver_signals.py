"""Imported first in the fork server (runtime/launch.py's preload), for its effect: the server
ignores SIGTERM and SIGINT, which the launcher blocked for it until now. A scheduler signals
every process of a job step (SLURM's SIGTERM before the kill); a server killed by it reported
each rank it forked as dead (exit code 255) before the ranks could finish their step and save
(--checkpoint-on-interrupt). multiprocessing would ignore SIGINT only after the preload's
imports (seconds of torch): a Ctrl-C then printed the server's traceback. It still ends with
the launcher (its "alive" pipe), and the ranks it forks inherit the ignore until launch._child
sets their own."""

import signal

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # launch.STOP_SIGNALS (not imported: torch)
for _signum in _STOP_SIGNALS:
    signal.signal(_signum, signal.SIG_IGN)  # (discards one pending while blocked)
signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
