"""Imported in the fork server only (runtime/launch.py's preload), for its effect: the server
ignores SIGTERM, as multiprocessing makes it ignore SIGINT. A scheduler signals every process
of a job step (SLURM's SIGTERM before the kill); a server killed by it reported each rank it
forked as dead (exit code 255) before the ranks could finish their step and save
(--checkpoint-on-interrupt). It still ends with the launcher (its "alive" pipe), and the ranks
it forks inherit the ignore until launch._child sets their own."""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
