"""Start pp x dp local processes, or join the ones torchrun started.

A failing rank takes every other rank down with it: the parent watches all children, kills the
rest with SIGKILL as soon as one fails (a rank's SIGTERM may be ignored or taken as a request to
stop after its step: _stop), and reports the *first* failure once (later failures of the other ranks are only echoes
of it: closed connections, timeouts).

Ctrl-C reaches the parent (the ranks ignore SIGINT: a terminal sends it to all of them). Without
--checkpoint-on-interrupt the parent stops every rank at once; with it, it passes the SIGINT on
as a request that the ranks honour together at the end of the step (see `stop_requested`), and a
second Ctrl-C stops them at once. SIGTERM (what a scheduler sends before it kills a job) is
taken as a Ctrl-C.

The ranks are forks of the fork server, not children of this process, and the server stays up
while any rank does (each holds its "alive" pipe): a launcher killed outright (SIGKILL, the OOM
killer) would leave them training. On Linux the kernel ends the server with this process, and
each rank with the server, from their first instant (forkserver_signals: PR_SET_PDEATHSIG): a
launcher killed while the server imported torch left it to fork a rank afterwards. Everywhere,
each rank also holds the read end of a pipe whose only write end is here, and ends itself as
`_stop` would when that reads EOF: the kernel closes the write end however this process ends.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import shutil
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from multiprocessing import util as mp_util
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ratrain.errors import Interrupted, RankFailed
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.runtime.worker_errors import failure_of, report_failure

_TRACKER_QUIET = "ignore:resource_tracker:UserWarning"
_LAUNCHER_PID = "RATRAIN_LAUNCHER_PID"  # forkserver_signals' (not imported: it acts on import)

_stop_signal: int | None = None  # the signal that asked this process to stop


class _Terminated(KeyboardInterrupt):
    """SIGTERM (sigterm_as_ctrl_c): a KeyboardInterrupt, so that wherever it lands it is handled
    as Ctrl-C is (but said as SIGTERM's, and the cli's exit is 143)."""

    signum = signal.SIGTERM  # (a plain KeyboardInterrupt has none: Ctrl-C's, SIGINT)


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


@contextmanager
def sigterm_as_ctrl_c():
    """Within: SIGTERM raises _Terminated in the main thread (elsewhere: nothing). For the
    launcher watching its ranks, and a one-process run (until 2026-12-03 it died by the signal,
    silent, its save in flight left as .partial); not a torchrun worker (its agent decides)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    try:
        yield
    finally:
        if main:  # (None: a handler not set from Python; the default is as near as it gets)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What asks a run to stop: Ctrl-C, and a scheduler's warning before it kills a job (SLURM
sends SIGTERM to every process of the job step, torchrun's agent passes it to its workers)."""


def ask_to_stop_on_signals() -> None:
    """From now on SIGINT and SIGTERM ask this process to stop after the current step
    (stop_requested); in a process of its own, a second one stops it at once."""
    global _stop_signal, _alone
    if signal.getsignal(signal.SIGINT) is not _request_stop:  # a request already made stands
        _stop_signal = None
    # A rank gets each stop twice: a terminal or SLURM signals every process, and our launcher
    # or torchrun's agent passes it on. So a rank's second signal is no second Ctrl-C, and the
    # launcher (or the agent) decides when to stop it at once.
    _alone = not under_torchrun()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _request_stop)


_alone = True  # this process is no rank: nobody else would act on a second signal


def _request_stop(signum, frame) -> None:
    global _stop_signal
    if _stop_signal is None:  # the first says why: a Ctrl-C after SIGTERM is still SIGTERM's
        _stop_signal = signum
    elif _alone:  # as the launcher stops its ranks at a second one (_watch)
        raise _Terminated() if _stop_signal == signal.SIGTERM else KeyboardInterrupt()


def stop_requested() -> bool:
    return _stop_signal is not None


def stop_signal() -> int | None:
    """The signal that asked this process to stop (SIGINT, SIGTERM), or None."""
    return _stop_signal


def stopped_how(signum: int) -> str:
    """What a stop signal did, in words ("interrupted": Ctrl-C's)."""
    return "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"


def _child(local_rank: int, world: int, port: int, threads: int, error_dir: Path,
           checkpoint_on_interrupt: bool, where: tuple[str, dict], launcher, fn, args) -> None:
    _end_with(launcher)
    # a fork of the fork server has the server's directory and environment, from when it started:
    # a rank takes the launcher's as they are now, as a spawned process would
    cwd, environ = where
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    # the launcher holds the rendezvous store (_launch): every rank joins it as a client, as
    # under torchrun's agent (process_groups._restart_store)
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="True")
    if checkpoint_on_interrupt:
        ask_to_stop_on_signals()
    else:
        for signum in STOP_SIGNALS:  # the launcher decides: a terminal or a scheduler signals
            signal.signal(signum, signal.SIG_IGN)  # every process, and it stops them all
    torch.set_num_threads(threads)
    code = 0
    try:
        fn(*args)
    except BaseException as e:
        code = report_failure(error_dir, local_rank, e)
    exit_without_teardown(code)


def _end_with(launcher: multiprocessing.connection.Connection) -> None:
    """End this rank once `launcher` (the read end of the launcher's pipe) reads EOF: the
    launcher is gone, and nobody else would stop it. SIGKILL, as `_stop` sends (a rank's SIGTERM
    is ignored or a stop request; a save in flight leaves its .partial directory, which the next
    start removes)."""
    def watch() -> None:
        try:
            while True:
                launcher.recv_bytes()  # (the launcher sends nothing)
        except (EOFError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def exit_without_teardown(code: int) -> None:
    """End a rank's process the way multiprocessing's own workers do: run its finalizers (named
    semaphores), flush, and os._exit, skipping interpreter teardown. On CI a rank of a run that
    had finished died there with SIGABRT ("terminate called without an active exception", no
    Python error): a C++ thread met its end while torch's globals were being destroyed."""
    mp_util._exit_function()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_local(world: int, fn, args: tuple, error_dir: Path, threads: int = 1,
                 checkpoint_on_interrupt: bool = False) -> int | None:
    """Run `fn(*args)` in `world` processes (forks of a fork server that imported torch once,
    each in this process's directory and environment); raise RankFailed if any of them fails,
    Interrupted on Ctrl-C (or SIGTERM) without `checkpoint_on_interrupt`. Returns the signal
    that asked the ranks to stop early (they then saved a checkpoint and ended cleanly), or
    None where none did.

    The ranks report failures into a private temporary directory (the run's disk may be the
    one that filled); the reports are copied to `error_dir` afterwards, where there is room."""
    for stale in Path(error_dir).glob("rank_*.json"):  # from an earlier attempt of a resumed run
        stale.unlink()
    reports = Path(tempfile.mkdtemp(prefix="ratrain-errors-"))
    try:
        return _launch(world, fn, args, reports, threads, checkpoint_on_interrupt)
    finally:
        for report in reports.glob("rank_*.json"):
            try:
                Path(error_dir).mkdir(parents=True, exist_ok=True)
                shutil.copy(report, Path(error_dir) / report.name)
            except OSError:
                pass
        shutil.rmtree(reports, ignore_errors=True)


def _launch(world: int, fn, args: tuple, error_dir: Path, threads: int,
            checkpoint_on_interrupt: bool) -> int | None:
    # We report the first failure ourselves; torch's "Terminating process ..." lines are noise,
    # and so is the resource tracker's warning about the semaphores of a rank that was killed
    # (it takes -W options from this process when the first spawn starts it; it cleans up).
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    if _TRACKER_QUIET not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_QUIET)
    # A fork server imports torch and the rank's code once per launching process; each rank is
    # then a fork of it, not a fresh interpreter importing them again: 2-3 s of a core for
    # torch, and 2 s more for torch._dynamo, which the first optimizer's constructor imports.
    # The server itself never computes, so no thread pool or CUDA context is forked.
    multiprocessing.set_forkserver_preload(["ratrain.runtime.forkserver_signals", "torch",
                                            "torch._dynamo", fn.__module__])
    # The server ignores Ctrl-C and SIGTERM once it has imported forkserver_signals; until then
    # they are blocked, from before its interpreter starts (a Ctrl-C in its first seconds
    # printed its traceback), as multiprocessing starts its resource tracker: that one first,
    # since its start unblocks them.
    multiprocessing.resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # The server ends with the thread that starts it, and tells whether it already has by this
    # pid (forkserver_signals): a launching thread that ends takes it along, and the next
    # launch starts another.
    os.environ[_LAUNCHER_PID] = str(os.getpid())
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        del os.environ[_LAUNCHER_PID]
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    # The rendezvous store is served from here, on the port the OS gives it as it binds. A
    # port found free here and bound later by rank 0 could be taken in between: "address
    # already in use" seen on CI with two test workers launching at once (2026-11-28).
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    watched, alive = multiprocessing.Pipe(duplex=False)  # (the ranks get `watched`: _end_with)
    try:
        ctx = mp.start_processes(
            _child, args=(world, store.port, threads, Path(error_dir), checkpoint_on_interrupt,
                          (os.getcwd(), dict(os.environ)), watched, fn, args),
            nprocs=world, join=False, start_method="forkserver")
        watched.close()
        return _watch(ctx.processes, world, error_dir, checkpoint_on_interrupt)
    finally:
        alive.close()  # ranks still running (this raised before stopping them) end now


def _watch(procs, world: int, error_dir: Path, checkpoint_on_interrupt: bool) -> int | None:
    # SIGTERM as Ctrl-C only while the ranks are watched: before, the default end of this
    # process ends them too (_end_with); after, they are gone or being stopped.
    asked_by = None  # the signal that asked the ranks to stop
    with sigterm_as_ctrl_c():
        while True:
            try:
                failed = _first_to_fail(procs)
                break
            except KeyboardInterrupt as e:
                signum = getattr(e, "signum", signal.SIGINT)
                if asked_by or not checkpoint_on_interrupt:
                    _stop(procs)
                    signum = asked_by or signum
                    raise Interrupted(f"{stopped_how(signum)}: stopped all {world} ranks",
                                      signum=int(signum)) from None
                asked_by = signum
                for p in procs:
                    if p.is_alive():
                        os.kill(p.pid, signal.SIGINT)
    if failed is None:
        return int(asked_by) if asked_by else None
    # Signals seen now were not ours: a rank killed from outside leaves no report, and the
    # others then fail on the closed connection, so its death is the cause.
    killed = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode is not None and p.exitcode < 0]
    _stop(procs)
    if killed:
        rank, code = killed[0]
        raise RankFailed(rank, f"process died ({signal.Signals(-code).name})")
    raise failure_of(error_dir, failed, procs[failed].exitcode)


def _first_to_fail(procs) -> int | None:
    """Wait until a process exits with an error (its index) or all exit cleanly (None)."""
    running = {p.sentinel: i for i, p in enumerate(procs)}
    while running:
        for sentinel in multiprocessing.connection.wait(list(running)):
            i = running.pop(sentinel)
            procs[i].join()
            if procs[i].exitcode != 0:
                return i
    return None


def _stop(procs) -> None:
    """SIGKILL every process still running: a rank's SIGTERM is ignored, or a request to stop
    after its step (--checkpoint-on-interrupt), neither of which stops it now."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join()
