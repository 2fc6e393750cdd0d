"""How much of the machine other work used while we measured it.

A measurement of compute speed on a machine shared with other work (a small VM with other jobs,
a laptop) reads that work's load as our slowness: on 2 cores, one busy process besides two
measuring ranks makes each rank look 50% slower in a pipeline than alone, which `ratrain
profile` would write down as contention. Linux says how busy all cores were (/proc/stat, steal
included: a VM's host giving our cores to others); the measuring processes' own CPU time is
what they used (their rusage, once joined); the difference over the wall time is the cores
that other work kept busy.

Ours includes the processes we started that are still alive, with the children they have
waited for (/proc/PID/stat): the ranks runtime/launch.py starts are forked by a fork server,
our child that lives as long as we do and waits for them, so their CPU time reaches our own
rusage only at our exit. Until 2026-11-27 it was not counted, and every profile measured on a
quiet machine read its own ranks as 1.4-2 cores of other work.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def machine_busy_s() -> float | None:
    """CPU seconds all cores have been busy since boot (user, nice, system, irq, softirq,
    steal); None where /proc/stat is not there."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_children_cpu_s()


def _live_children_cpu_s() -> float:
    """CPU seconds of our children still alive (zombies too), each with the children it has
    waited for: utime, stime, cutime and cstime of /proc/PID/stat; 0 where /proc is not
    there."""
    me, ticks = os.getpid(), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rfind(")") + 2:].split()  # after "(comm)", which may hold spaces
        if len(fields) > 14 and int(fields[1]) == me:  # fields[1]: the parent's pid
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


class OtherWork:
    """`with OtherWork() as w: run()` -> w.cores: the cores other work kept busy on average
    while run() ran (0.0 where the machine cannot tell). Processes `run` starts count as ours:
    those waited for, and those alive below us with what they have waited for."""

    cores = 0.0
    own_s = 0.0  # the CPU seconds counted as ours meanwhile

    def __enter__(self) -> OtherWork:
        self._busy, self._own, self._wall = machine_busy_s(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        busy, wall = machine_busy_s(), time.perf_counter() - self._wall
        self.own_s = _own_cpu_s() - self._own
        if busy is None or self._busy is None or wall <= 0:
            return
        self.cores = max(0.0, (busy - self._busy - self.own_s) / wall)
