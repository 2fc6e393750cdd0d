"""Saving a checkpoint while training goes on (torch DCP's async_save is the model).

The training thread takes the state: each unit's weights and AdamW state copied to host memory
(`take`; 12 bytes a parameter of the rank's units, held until the files are written). A
background thread then writes the files (`write_part`) and marks the rank's part done with a
small file in the partial directory; the main rank's thread waits for every rank's mark, writes
the manifest, last, and publishes the checkpoint with one rename (`publish`). Where the nodes'
checkpoint directories are their own disks, each directory's lowest rank does so for the ranks
that see it (training/shared_dir.py). Completion goes through the filesystem, not a
collective: gloo is not safe for a collective issued beside the training thread's. At most one
save is in flight (`Saver`): the next save, and the end of the run, wait for it. A run that
dies mid-save leaves a partial directory that no run reads; the checkpoint before it stays the
newest that verifies.

Where host memory is short of a unit's copy, that unit is written at once, in the training
thread (the save is then partly synchronous); `Saver(background=False)` writes every unit so.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ratrain.checkpoint import (CheckpointWriteError, _partial, _write_failed, checkpoint_dir,
                                finalize, save_units)
from ratrain.host_memory import available_host_bytes

SLOW_WRITES_ENV = "RATRAIN_TEST_ONLY_SLOW_CHECKPOINT_WRITES_S"
"""Test only: seconds the writer sleeps after each unit's files, so that a test can kill a run
while a save is in flight (a cancel ends the sleep: the hook slows the save, not its abandon)."""

HOST_RESERVE_BYTES = 2 << 30
"""Host memory a snapshot leaves free (for the rest of the process and the page cache)."""

_MARK = "rank_{:05d}.json"


@dataclass
class Taken:
    """One rank's part of a save, as the training thread left it: units copied to host memory
    (to be written), and the files of units it wrote itself (no room for a copy, or no
    background saving)."""

    copied: list[tuple[int, dict]] = field(default_factory=list)
    files: dict[str, dict] = field(default_factory=dict)
    written_now: int = 0  # units written in the training thread
    replica: int = 0  # whose files (store.weights_file): --sync diloco's replicas save their own
    outer: bool = True  # whether it writes the --sync diloco outer states (one replica a directory)
    copy_bytes: int = 0  # host memory the copies hold until they are written


def take(run_dir, step: int, states, writes: bool, copy: bool, replica: int = 0,
         outer: bool = True) -> Taken:
    """In the training thread: go through `states` ((unit, state) pairs; with sharded state each
    is a gather every replica joins). A rank that `writes` copies each unit (`copy`, where host
    memory has room) or writes it now; one that does not (another replica holds the same
    units) only joins the gathers."""
    taken = Taken(replica=replica, outer=outer)
    for unit, state in states:
        if not writes:
            continue
        need = _bytes(state)
        if copy and _host_has_room(need):
            taken.copied.append((unit, snapshot(state)))
            taken.copy_bytes += need
        else:
            taken.files.update(_write(run_dir, step, unit, state, taken))
            taken.written_now += 1
    return taken


def snapshot(obj):
    """`obj` with every tensor copied to host memory, into storage of its own."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    return obj


def write_part(run_dir, step: int, rank: int, taken: Taken, rng_state: dict,
               cancelled: threading.Event | None = None, loss_scale: dict | None = None) -> None:
    """Write the copied units, then mark this rank's part done (its files' entries, its
    generators' states and, where the replicas scale apart, its loss scale: for the manifest)."""
    files = dict(taken.files)
    for unit, state in taken.copied:
        if cancelled is not None and cancelled.is_set():
            return
        files.update(_write(run_dir, step, unit, state, taken, cancelled))
    partial = _partial(run_dir, step)
    try:
        partial.mkdir(parents=True, exist_ok=True)
        tmp = partial / (_MARK.format(rank) + ".tmp")
        own = {"loss_scale": loss_scale} if loss_scale is not None else {}
        tmp.write_text(json.dumps({"files": files, "rng": rng_state, **own}))
        tmp.rename(partial / _MARK.format(rank))  # whole or absent, as the main rank reads it
    except OSError as e:  # a full disk, as a unit's write would report it
        raise _write_failed(run_dir, step, e) from None


def publish(run_dir, step: int, ranks, meta: dict, keep: int, timeout_s: float,
            cancelled: threading.Event | None = None) -> Path | None:
    """On the main rank (of the directory's `ranks`: every rank, unless each node keeps its
    own part, training/shared_dir.py), after its own part: wait for the `ranks`' marks, then
    write the manifest and rename the directory (checkpoint.finalize). None if cancelled
    meanwhile."""
    partial = _partial(run_dir, step)
    ranks = list(ranks)
    marks = [partial / _MARK.format(r) for r in ranks]
    deadline = time.monotonic() + timeout_s
    while not all(m.is_file() for m in marks):
        if cancelled is not None and cancelled.is_set():
            return None
        if not partial.is_dir():  # a rank whose write failed removed it (its report says why)
            raise CheckpointWriteError(f"checkpoint step_{step:06d} was not published: another "
                                       "rank's write failed and removed it", time.time())
        if time.monotonic() > deadline:
            late = ", ".join(str(r) for r, m in zip(ranks, marks) if not m.is_file())
            raise CheckpointWriteError(f"checkpoint step_{step:06d} was not published: rank(s) "
                                       f"{late} did not write their part within {timeout_s:.0f} s",
                                       time.time())
        time.sleep(0.02)
    parts = [json.loads(m.read_text()) for m in marks]
    for m in marks:
        m.unlink()
    files = {name: entry for part in parts for name, entry in part["files"].items()}
    rng = {str(r): part["rng"] for r, part in zip(ranks, parts)}
    scales = {str(r): part["loss_scale"] for r, part in zip(ranks, parts) if "loss_scale" in part}
    own = {"loss_scale_per_rank": scales} if scales else {}
    return finalize(run_dir, step, {**meta, "rng": rng, **own}, files, keep)


def wait_published(run_dir, step: int, timeout_s: float) -> None:
    """On a rank other than the main one, whose own part of the save of `step` is written:
    wait until the main rank has published it, or given it up (its partial directory gone)."""
    final, deadline = checkpoint_dir(run_dir, step), time.monotonic() + timeout_s
    while not final.is_dir() and _partial(run_dir, step).is_dir() and time.monotonic() < deadline:
        time.sleep(0.02)


class Saver:
    """One rank's saves: at most one in flight, on a background thread; with `background`
    False each is done before `submit` returns. A save's failure is raised in the training
    thread by the next `check` or `wait`."""

    def __init__(self, background: bool):
        self.background = background
        self.cancelled = threading.Event()  # a run that fails stops its save between units
        # per save: its step; the training thread's seconds taking the state (taken_s) and
        # waiting for the save to end (waited_s, at the next save or the end); the writer's
        self.times: list[dict] = []
        # set by the writer as it ends: not Thread.join, which a Ctrl-C interrupting it leaves
        # (Python 3.11) taking the thread for stopped while it writes on, so that a later join
        # returned at once and the writer outlived the run (its partial directory published
        # empty, the interpreter's exit aborted: exit 134)
        self._ended: threading.Event | None = None
        self._error: BaseException | None = None

    def submit(self, step: int, taken_s: float, job) -> None:
        """Run `job` (the writes, and on the main rank the publication) for the save of `step`,
        whose state the training thread took in `taken_s` seconds."""
        self.wait()
        entry = {"step": step, "taken_s": taken_s, "waited_s": 0.0}
        self.times.append(entry)

        ended = threading.Event()

        def run() -> None:
            nonlocal job
            t0 = time.perf_counter()
            _yield_to_training()
            try:
                job()
            except BaseException as e:  # noqa: BLE001 -- raised in the training thread
                self._error = e
            finally:
                entry["written_s"] = time.perf_counter() - t0
                # the snapshot freed here, before the training thread may go on to exit: tensors
                # freed by this daemon thread as the interpreter ended aborted it (exit 134)
                job = None
                ended.set()

        if not self.background:
            run()
            self._raise()
            return
        self._ended = ended
        threading.Thread(target=run, name=f"checkpoint step {step}", daemon=True).start()

    def in_flight(self) -> bool:
        return self._ended is not None and not self._ended.is_set()

    def check(self) -> None:
        """Raise a finished save's failure, without waiting for one in flight."""
        if self._ended is not None and self._ended.is_set():
            self.wait()

    def wait(self) -> None:
        """Wait for the save in flight; raise its failure."""
        if self._ended is not None:
            t0 = time.perf_counter()
            self._ended.wait()
            self._ended = None
            self.times[-1]["waited_s"] = time.perf_counter() - t0
        self._raise()

    def stop(self, say, let_finish: bool, quiet_s: float = 1.0) -> int | None:
        """After a stop request (Ctrl-C, SIGTERM: no failure), the save in flight: with
        `let_finish` it is waited for, since its state is taken and only its files are left to
        write (a run stopped in its end-of-run save lost every step until 2026-12-04), and
        `say(step)` where that takes longer than `quiet_s`; a second request (the
        KeyboardInterrupt it raises in the wait), or no `let_finish`, drops it (abandon).
        Returns the step of the save dropped, or None; raises the save's own failure."""
        step = self.times[-1]["step"] if self.in_flight() else None
        if step is not None and let_finish:
            try:
                if not self._ended.wait(quiet_s):
                    say(step)
                self.wait()
                return None
            except KeyboardInterrupt:
                pass
        self.abandon()
        return step

    def abandon(self) -> None:
        """After the run failed (or a second stop request came): cancel the save in flight and
        wait until it has stopped (between units, unpublished, or published whole); its own
        failure is dropped, the run's is said. A save still writing as the caller removed the
        partial directory published an empty step_N (seen on Ctrl-C, 2026-12-03), and one still
        in torch at the interpreter's exit aborted it (exit 134)."""
        self.cancelled.set()
        if self._ended is not None:
            self._ended.wait()
            self._ended = None
        self._error = None

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


def _write(run_dir, step: int, unit: int, state: dict, taken: Taken,
           cancelled: threading.Event | None = None) -> dict[str, dict]:
    files = save_units(run_dir, step, [(unit, state)], taken.replica, taken.outer)
    slow = float(os.environ.get(SLOW_WRITES_ENV, 0) or 0)
    if slow > 0:
        (cancelled or threading.Event()).wait(slow)
    return files


def _yield_to_training() -> None:
    """Lower this (the writer's) thread's CPU priority, so that where the cores are all busy
    the training thread runs first (Linux's nice is per thread; elsewhere nothing changes)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def _bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(v) for v in obj)
    return 0


def _host_has_room(need: int) -> bool:
    """Whether the host's available memory holds `need` bytes more and the reserve; True where
    it cannot be read."""
    available = available_host_bytes()
    return available is None or need + HOST_RESERVE_BYTES <= available
