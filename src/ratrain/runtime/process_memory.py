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
    through /proc/self/clear_refs); None elsewhere."""

    def __init__(self) -> None:
        self.base: int | None = None

    def start(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to now
            self.base = _status_bytes("VmRSS")
        except OSError:
            self.base = None

    def peak(self) -> int | None:
        if self.base is None:
            return None
        return max(0, _status_bytes("VmHWM") - self.base)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def available_host_bytes(cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory the host can give without swapping: Linux's MemAvailable, or less inside a
    memory-limited cgroup (a container's, a batch job's): its limit less its working set (usage
    less inactive file cache, as the kubelet counts it). None where neither can be read."""
    found = [b for b in (_meminfo_available(), _cgroup_room(cgroup)) if b is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# (limit, usage, stat's inactive file) of cgroup v2, then v1
_CGROUP_FILES = (("memory.max", "memory.current", "inactive_file"),
                 ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                  "total_inactive_file"))


def _cgroup_room(root: Path) -> int | None:
    for limit_file, usage_file, inactive in _CGROUP_FILES:
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text())
            stat = (root / limit_file).with_name("memory.stat").read_text().split()
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # no limit (v1 writes a page-rounded 2^63)
            return None
        cache = dict(zip(stat[::2], stat[1::2])).get(inactive, "0")
        return max(0, int(limit) - (usage - int(cache)))
    return None
