"""One run at a time in a run directory: two processes training into one interleaved its
metrics.jsonl, and the second's keep-K removed the first's checkpoints under it (which then
failed with "no manifest.json"). The process that writes the run's files (the launcher; under
torchrun rank 0) holds an flock on RUN/.lock for the run's lifetime. The kernel releases it
when the process dies, however it dies, so a crashed run never blocks the next; flock also
holds across the nodes of a shared filesystem that supports it (NFS maps it to its locks)."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from ratrain.errors import UserError

NAME = ".lock"

# by resolved directory: a process may open its own run directory again (a resume in the same
# process, as tests and notebooks do), and a second flock of its own would refuse it
_held: dict[Path, int] = {}


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir`'s lock, where the directory exists, until release_run_dirs() or this
    process ends; a UserError naming the directory (and the holder's process id) where another
    process holds it. Under torchrun
    only rank 0 takes it: the others write no run files, and on a shared filesystem rank 0
    of the same run already holds it."""
    if int(os.environ.get("RANK", 0)) != 0 or not Path(run_dir).is_dir():
        return
    key = Path(run_dir).resolve()
    if key in _held:
        return
    fd = os.open(key / NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
        os.close(fd)
        raise UserError(f"run directory {run_dir} is in use by another run"
                        + (f" (process {holder}, which holds {key / NAME})" if holder
                           else "") + "; wait for it to end, or choose another --run-dir") from None
    except OSError as e:  # a filesystem without locks: the run goes on unguarded, as before
        os.close(fd)
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}".encode(), 0)
    _held[key] = fd


def release_run_dirs() -> None:
    """Release every run directory this process holds (its runs have ended)."""
    while _held:
        os.close(_held.popitem()[1])
