"""What a process holds: its peak memory (CUDA or resident set) and the resident set's growth
over a moment, the measure of what training itself added."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """Peak CUDA memory allocated on a GPU; the process's peak resident set size on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


class RssGrowth:
    """The process's peak resident set size since `start()`, over its size at `start()`: what
    training itself added, without torch's own hundreds of MB. Linux only (the peak is reset
    through /proc/self/clear_refs); None elsewhere.

    The peak is the largest VmHWM `peak()` has read, as VmHWM itself can fall: the kernel
    records the high-water mark only when the resident set is about to shrink, from its per-CPU
    counters (since Linux 6.2), which lag the exact count, and VmHWM is the larger of that record
    and the exact resident set now. A reading taken at the top is the exact peak, a later one
    the lagging record: 62 pages less one step later in a tiny run on 2 CPUs (the lag grows
    with the CPUs). A peak between two readings can be short by that lag."""

    def __init__(self) -> None:
        self.base: int | None = None
        self._highest = 0

    def start(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to now
            self.base = _status_bytes("VmRSS")
        except OSError:
            self.base = None
        self._highest = 0

    def peak(self) -> int | None:
        if self.base is None:
            return None
        self._highest = max(self._highest, _status_bytes("VmHWM") - self.base)
        return self._highest


def resident_bytes() -> int | None:
    """This process's resident set now (Linux's VmRSS); None where it cannot be read."""
    try:
        return _status_bytes("VmRSS")
    except (OSError, ValueError, IndexError):
        return None


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")
