"""glibc's malloc in a CPU rank that runs a split schedule: keep freed memory in the process.

A split schedule's steps free and allocate more, and at other times, than a whole backward's:
BI drops activations and makes its seeds, BW frees both later, and grouped holds every
micro-batch's activations. glibc hands freed heap memory back to the system and serves later
allocations with fresh pages, so those steps paid page faults. `small` at pp=2 with 4
micro-batches, adjacent runs of `ratrain train` (docs/benchmarks.md, 2026-11-26):
- glibc's defaults: zbh1 1.026-1.03x 1f1b, its backward 11% dearer than 1f1b's;
- freed memory kept: 1.117-1.193x, the backward as cheap as 1f1b's.
1f1b ran at the same speed either way.

Not applied where the user tuned malloc (any MALLOC_* variable in the environment: the
README's MALLOC_MMAP_THRESHOLD_ advice for a memory budget goes the other way), off glibc, or on
a GPU rank (its activations are not in malloc's heap).
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters (malloc.h) and what is set: no mmap below 1 GiB, no trimming of the heap's
# top below 2 GiB (mallopt takes an int), and 256 MiB more asked of the system at each growth.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
KEEP = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, (1 << 31) - 1),
        (_M_TOP_PAD, 256 << 20))

_kept = False


def keep_freed_memory() -> bool:
    """Tell glibc to keep what is freed (once per process); whether it is in effect."""
    global _kept
    if _kept:
        return True
    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    _kept = all(mallopt(param, value) == 1 for param, value in KEEP)
    return _kept
