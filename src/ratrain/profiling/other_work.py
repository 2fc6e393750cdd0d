"""How much of the machine other work used while we measured it.

A measurement of compute speed on a machine shared with other work (a small VM with other jobs,
a laptop) reads that work's load as our slowness: on 2 cores, one busy process besides two
measuring ranks makes each rank look 50% slower in a pipeline than alone, which `ratrain
profile` would write down as contention. Linux says how busy all cores were (/proc/stat, steal
included: a VM's host giving our cores to others); the measuring processes' own CPU time is
what they used (their rusage, once joined); the difference over the wall time is the cores
that other work kept busy.
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
    return t.user + t.system + t.children_user + t.children_system


class OtherWork:
    """`with OtherWork() as w: run()` -> w.cores: the cores other work kept busy on average
    while run() ran (0.0 where the machine cannot tell). Processes `run` starts count as ours
    once they have been waited for."""

    cores = 0.0

    def __enter__(self) -> OtherWork:
        self._busy, self._own, self._wall = machine_busy_s(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        busy, wall = machine_busy_s(), time.perf_counter() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return
        other = (busy - self._busy) - (_own_cpu_s() - self._own)
        self.cores = max(0.0, other / wall)
