"""The rank's host update thread: carried updates (SU u) run there, in the order started, while
the walker goes on; WU u, in the next step, waits for unit u's (schedule/carried_updates.py).
So do the units' parts of the global norm (SN u, waited by WSN u before N).

One thread, so the updates run in the order the program started them (the order the next step
reads the units) and each AdamW keeps the host's cores to itself: torch's fused CPU AdamW and
the fp32 arithmetic around it are parallel inside one call, and release the GIL while they run.
A failed update raises at its wait, or at `finish`, in the walker's thread. Each start returns
its job (`HostJob`) for the trace, whose span then ends when the job did, not at its wait.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ratrain.runtime.optim import set_lr


class HostJob:
    """A job on the update thread as the trace's completion (runtime/trace.py): `then(fn)`
    calls fn with the perf_counter time the job ended."""

    def __init__(self, future: Future, ended: list[float]):
        self._future, self._ended = future, ended

    def then(self, fn) -> None:
        self._future.add_done_callback(lambda _: fn(self._ended[0]))

    def result(self):
        return self._future.result()


class HostUpdates:
    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, HostJob] = {}
        self._record: dict[int, object] = {}
        self._norms: dict[int, HostJob] = {}

    def start(self, unit: int, state, lr: float, grad_factor, found_inf) -> HostJob | None:
        """Start unit `unit`'s update with this step's learning rate and coefficients."""
        if state.update_grad is None:  # no parameters: nothing to update
            return None
        state.finish_fold()
        ready = None
        if state.home.type == "cpu" and any(_on_gpu(t) for t in (grad_factor, found_inf)):
            # copied now, behind the norm on the compute stream: a blocking copy made later by
            # the thread would wait for whatever the walker has queued by then
            grad_factor, found_inf = (t.to("cpu", non_blocking=True) if _on_gpu(t) else t
                                      for t in (grad_factor, found_inf))
            ready = torch.cuda.Event()
            ready.record()
        job = self._pending[unit] = self._submit(_update, state, lr, grad_factor, found_inf,
                                                 ready)
        self._record[unit] = state
        return job

    def start_norm(self, unit: int, state) -> HostJob:
        """Start finishing unit `unit`'s gradient (its last fold's add) and taking its squared
        norm (SN): the same computation N would make, on this thread."""
        job = self._norms[unit] = self._submit(state.sq_norm)
        return job

    def _submit(self, fn, *args) -> HostJob:
        ended = [0.0]

        def run():
            try:
                return fn(*args)
            finally:
                ended[0] = time.perf_counter()
        return HostJob(self._thread().submit(run), ended)

    def wait_norm(self, unit: int):
        """Unit `unit`'s squared norm (WSN), None for a unit without parameters."""
        return self._norms.pop(unit).result()

    def wait(self, unit: int) -> None:
        """Unit `unit`'s update has completed (or none was started: the first step)."""
        pending = self._pending.pop(unit, None)
        if pending is not None:
            pending.result()
            self._record.pop(unit).record_optimizer()

    def finish(self) -> None:
        """Every update started has completed: before anything outside the programs reads the
        masters (evaluation, a checkpoint; at the end of the run, the interpreter joins the
        thread)."""
        for unit in list(self._pending):
            self.wait(unit)

    def _thread(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratrain-update")
        return self._pool


def _on_gpu(t) -> bool:
    return torch.is_tensor(t) and t.is_cuda


def _update(state, lr: float, grad_factor, found_inf, ready) -> None:
    if ready is not None:
        ready.synchronize()
    set_lr([state.optimizer], lr)
    state.step_masters(grad_factor, found_inf)
