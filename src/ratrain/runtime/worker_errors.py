"""What a failed rank of launch_local leaves for the launcher: a record of its error in the
launch's error directory (rank_N.json), read back to say the first failure in one line. A rank
whose record cannot be written (a full disk) says its error on its own stderr instead, and
exits with UNRECORDED, so that the launcher points at it rather than at an exit code."""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from ratrain.errors import RankFailed, RunFailure, UserError

UNRECORDED = 3  # a rank's exit code: it failed, and said so on stderr for want of a record


def record_failure(error_dir: Path, rank: int, exc: BaseException) -> None:
    """Leave the exception where the launcher will find it, with when it happened; whole or not
    at all (a full disk must not leave half a report)."""
    error_dir.mkdir(parents=True, exist_ok=True)
    tmp = error_dir / f"rank_{rank}.json.tmp"
    tmp.write_text(json.dumps({
        "rank": rank,
        "time": getattr(exc, "failed_at", None) or time.time(),  # (checkpoint's: before cleanup)
        "type": type(exc).__name__,
        "message": str(exc),
        "user_error": isinstance(exc, UserError),
        "clear": isinstance(exc, (UserError, RunFailure)),  # its message says it all
        "traceback": "".join(traceback.format_exception(exc)),
    }))
    tmp.rename(error_dir / f"rank_{rank}.json")


def report_failure(error_dir: Path, rank: int, exc: BaseException) -> int:
    """record_failure, or where that fails, the error on stderr (with its traceback, unless its
    message says it all: the record that would have kept it is not there); the exit code the
    rank ends with. Until 2026-12-03 a rank that could not write its record said nothing, and
    the launcher only "process died (exit code 1)"."""
    try:
        record_failure(error_dir, rank, exc)
        return 1
    except OSError as e:
        clear = isinstance(exc, (UserError, RunFailure))
        said = str(exc) if clear else f"{type(exc).__name__}: {exc}"
        try:
            if not clear:
                sys.stderr.write("".join(traceback.format_exception(exc)))
            print(f"rank {rank} failed: {said} (its error could not be recorded in "
                  f"{error_dir}: {e.strerror or e})", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # (no stderr: a closed one)
            pass
        return UNRECORDED


def failure_of(error_dir: Path, rank: int, exitcode: int) -> RankFailed:
    """The run's failure, where rank `rank` was the first to exit with `exitcode` (not a signal):
    the earliest record, or what its exit code tells."""
    if exitcode == UNRECORDED:  # its error is on stderr; a record of another is only an echo
        return RankFailed(rank, "its error is said above (its record could not be written)")
    return first_failure(error_dir, rank, f"process died (exit code {exitcode})")


def first_failure(error_dir: Path, rank: int, fallback: str) -> RankFailed:
    reports = []
    for path in Path(error_dir).glob("rank_*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    if not reports:
        return RankFailed(rank, fallback)
    first = min(reports, key=lambda r: r["time"])
    message = first["message"] if first.get("clear") else f"{first['type']}: {first['message']}"
    return RankFailed(first["rank"], message, first["user_error"])
