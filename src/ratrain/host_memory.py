"""What memory the host can give a run: read from Linux's /proc and, inside a container or a
batch job, its memory cgroup. Pure Python, below everything: the checkpoint saver weighs its
snapshot against it, and the setup stage a run's predicted bytes (training/prepare.py)."""

from __future__ import annotations

from pathlib import Path


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
