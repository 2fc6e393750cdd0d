"""The CPU cores this process may run on: its affinity mask, which taskset, a container's
cpuset or a batch job's allocation narrows, where os.cpu_count() counts the whole machine's
(16 ranks a node given 16 of its 128 cores would each have taken 16 threads). Pure Python,
below everything: the threads a rank computes on (training/prepare.py), the cores MFU counts,
and what `ratrain profile` records as the machine's cores."""

from __future__ import annotations

import os


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity to read (not Linux)
        return os.cpu_count() or 1
