"""One run at a time in a run directory, and in a --checkpoint-dir: two processes training into
one run directory interleaved its metrics.jsonl, and the second's keep-K removed the first's
checkpoints under it (which then failed with "no manifest.json"); two runs of other run
directories given one --checkpoint-dir wrote their checkpoints among each other's. The process
that writes the run's files (the launcher; under torchrun rank 0) holds an flock on DIR/.lock
for the run's lifetime. The kernel releases it when the process dies, however it dies, so a
crashed run never blocks the next; flock also holds across the nodes of a shared filesystem
that supports it (NFS maps it to its locks).

A --checkpoint-dir also keeps the run whose checkpoints it holds (DIR/.ratrain-run, written
once the run's checks have passed): a resume of another run from them is refused
(run_dir.refuse_another_runs_checkpoints)."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from ratrain.errors import UserError

NAME = ".lock"
OWNER = ".ratrain-run"

# by resolved directory: a process may open its own run directory again (a resume in the same
# process, as tests and notebooks do), and a second flock of its own would refuse it
_held: dict[Path, int] = {}


NEW_RUN_WAY_OUT = "wait for it to end, or choose another --run-dir"
RESUME_WAY_OUT = "wait for it to end"  # a resume goes on in its own directory, no other


def lock_run_dir(run_dir: Path, way_out: str = NEW_RUN_WAY_OUT) -> None:
    """Hold `run_dir`'s lock, where the directory exists, until release_run_dirs() or this
    process ends; a UserError naming the directory (and the holder's process id) where another
    process holds it, ending with `way_out`. Under torchrun only rank 0 takes it: the others
    write no run files, and on a shared filesystem rank 0 of the same run already holds it."""
    _lock(Path(run_dir), "run directory", way_out, "")


def lock_checkpoint_dir(directory: Path, run_dir: Path) -> None:
    """Hold the --checkpoint-dir `directory`'s lock for the run in `run_dir`, as lock_run_dir;
    the refusal names the run that holds it."""
    _lock(Path(directory), "checkpoint directory",
          "wait for it to end, or choose another --checkpoint-dir",
          f" for run {Path(run_dir).resolve()}")


def _lock(directory: Path, what: str, way_out: str, holder_note: str) -> None:
    if int(os.environ.get("RANK", 0)) != 0 or not directory.is_dir():
        return
    key = directory.resolve()
    if key in _held:  # its own again, perhaps for the run directory made since
        _say_holder(_held[key], holder_note)
        return
    try:
        fd = os.open(key / NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # an unwritable directory: the checks before the run say so in a line
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
        os.close(fd)
        raise UserError(f"{what} {directory} is in use by another run"
                        + (f" (process {holder}, which holds {key / NAME})" if holder else "")
                        + f"; {way_out}") from None
    except OSError as e:  # a filesystem without locks: the run goes on unguarded, as before
        os.close(fd)
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        return
    _say_holder(fd, holder_note)
    _held[key] = fd


def _say_holder(fd: int, note: str) -> None:
    """Write who holds the lock into its file, for a refused run to name."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}{note}".encode(), 0)


def claim_checkpoint_dir(directory: Path, run_dir: Path) -> None:
    """Record `run_dir` as the run whose checkpoints `directory` holds (rank 0 only)."""
    if int(os.environ.get("RANK", 0)) == 0:
        (Path(directory) / OWNER).write_text(f"{Path(run_dir).resolve()}\n")


def checkpoint_dir_owner(directory: Path) -> Path | None:
    """The run directory whose checkpoints `directory` holds, as recorded (None: no record, as
    in a directory of a ratrain before 2026-12-02)."""
    try:
        return Path((Path(directory) / OWNER).read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None


def refuse_another_runs_checkpoints(run_dir: Path, where: Path) -> None:
    """A --checkpoint-dir whose record names another run, whose directory is there still,
    holds that run's checkpoints: resumed from, this run would go on from that run's weights
    (and keep-K remove its checkpoints)."""
    owner = checkpoint_dir_owner(where)
    if owner is None or owner == Path(run_dir).resolve() or not (owner / "config.yaml").is_file():
        return
    raise UserError(f"checkpoint directory {where} holds the checkpoints of another run "
                    f"({owner}): continue that run with --resume {owner}, or give this run "
                    "its own --checkpoint-dir")


def release_run_dirs() -> None:
    """Release every directory this process holds (its runs have ended)."""
    while _held:
        os.close(_held.popitem()[1])
