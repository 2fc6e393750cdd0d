"""Start pp x dp local processes, or join the ones torchrun started.

A failing rank takes every other rank down with it: the parent watches all children, terminates
the rest as soon as one fails, and reports the *first* failure once (later failures of the other
ranks are only echoes of it: closed connections, timeouts).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing import util as mp_util
from pathlib import Path

import torch
import torch.multiprocessing as mp

from ratrain.errors import UserError


class RankFailed(Exception):
    def __init__(self, rank: int, message: str, user_error: bool = False):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank
        self.user_error = user_error


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_failure(error_dir: Path, rank: int, exc: BaseException) -> None:
    """Leave the exception where the launcher will find it, with when it happened."""
    error_dir.mkdir(parents=True, exist_ok=True)
    (error_dir / f"rank_{rank}.json").write_text(json.dumps({
        "rank": rank,
        "time": time.time(),
        "type": type(exc).__name__,
        "message": str(exc),
        "user_error": isinstance(exc, UserError),
        "traceback": "".join(traceback.format_exception(exc)),
    }))


def _child(local_rank: int, world: int, port: int, threads: int, error_dir: Path, fn, args) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    code = 0
    try:
        fn(*args)
    except BaseException as e:
        record_failure(error_dir, local_rank, e)
        code = 1
    exit_without_teardown(code)


def exit_without_teardown(code: int) -> None:
    """End a rank's process the way multiprocessing's own workers do: run its finalizers (named
    semaphores), flush, and os._exit, skipping interpreter teardown. On CI a rank of a run that
    had finished died there with SIGABRT ("terminate called without an active exception", no
    Python error): a C++ thread met its end while torch's globals were being destroyed."""
    mp_util._exit_function()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_local(world: int, fn, args: tuple, error_dir: Path, threads: int = 1) -> None:
    """Run `fn(*args)` in `world` spawned processes; raise RankFailed if any of them fails."""
    for stale in Path(error_dir).glob("rank_*.json"):  # from an earlier attempt of a resumed run
        stale.unlink()
    # We report the first failure ourselves; torch's "Terminating process ..." lines are noise.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    ctx = mp.start_processes(_child, args=(world, _free_port(), threads, Path(error_dir), fn, args),
                             nprocs=world, join=False, start_method="spawn")
    try:
        while not ctx.join():
            pass
    except mp.ProcessExitedException as e:
        sig = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        raise _first_failure(ctx, error_dir, e.error_index, f"process died ({sig})") from None


def _first_failure(ctx, error_dir: Path, rank: int, fallback: str) -> RankFailed:
    # A rank killed from outside leaves no report; the others then fail on the closed connection.
    # Their reports are echoes, so a death by a signal the launcher did not send comes first.
    for i, proc in enumerate(ctx.processes):
        code = proc.exitcode
        if code is not None and code < 0 and -code != signal.SIGTERM:
            return RankFailed(i, f"process died ({signal.Signals(-code).name})")
    reports = [json.loads(p.read_text()) for p in Path(error_dir).glob("rank_*.json")]
    if not reports:
        return RankFailed(rank, fallback)
    first = min(reports, key=lambda r: r["time"])
    message = first["message"] if first["user_error"] else f"{first['type']}: {first['message']}"
    return RankFailed(first["rank"], message, first["user_error"])
