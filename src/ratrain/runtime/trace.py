"""Per-action timing records and their Chrome/Perfetto trace (one process per rank).

Each rank shows two kinds of track: `actions`, one span per program action from its start to
its return (what the rank's thread did), and `async`, one span per asynchronous operation (a
send, a receive, a gradient sync, the norm reduction) from the action that started it to its
completion, so communication is seen running under compute. Completion is the moment the
backend reports it where it can (gloo collectives, through their futures; the host update
thread's jobs, SU and SN, by their own clock), otherwise the moment the program's wait for it
returned: for a transfer that finished earlier, the span reaches to the wait.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

Event = tuple[int, str, float, float]
"""(step, name, start, end): the executor's 0-based step; times in microseconds from the
tracer's origin."""

STEPS_FROM = 1
"""trace.json's `args.step` counts from this, as metrics.jsonl does (its `otherData` says so;
a trace without it, written before 2026-12-02, counts from 0)."""


class Tracer:
    """Keeps the action records and async spans of the last `keep_steps` steps.

    Times are microseconds from `origin`, taken by every rank right after a barrier, so tracks of
    ranks on one machine line up.
    """

    def __init__(self, keep_steps: int = 3):
        self.origin = time.perf_counter()
        self._steps: deque[tuple[list[Event], list[list]]] = deque(maxlen=keep_steps)
        self._current: tuple[list[Event], list[list]] | None = None
        self._open: dict[str, list] = {}  # async name -> its span, until its wait
        self._step = -1

    def reset_origin(self) -> None:
        self.origin = time.perf_counter()

    def _us(self, t: float) -> float:
        return (t - self.origin) * 1e6

    def begin_step(self, step: int) -> None:
        self._step = step
        self._current = ([], [])
        self._steps.append(self._current)
        self._open.clear()

    def record(self, name: str, t0: float, t1: float) -> None:
        if self._current is not None:
            self._current[0].append((self._step, name, self._us(t0), self._us(t1)))

    def start_async(self, name: str, t0: float, completion=None) -> None:
        """An asynchronous operation `name` started at t0. `completion`, where given, ends the
        span: its `then(fn)` calls fn with the perf_counter time the operation ended (a torch
        Future's: `FutureEnd`; a host job's: runtime/carried_updates.HostJob, which may have
        ended before the trace registers it); otherwise end_async does."""
        if self._current is None:
            return
        span = [self._step, name, self._us(t0), None]
        self._current[1].append(span)
        self._open[name] = span
        if completion is not None:
            completion.then(lambda ended: self._close(span, ended))

    def end_async(self, name: str, t1: float) -> None:
        """The program's wait for `name` returned at t1: the operation is complete by then."""
        span = self._open.pop(name, None)
        if span is not None:
            self._close(span, t1)

    def _close(self, span: list, t: float) -> None:
        if span[3] is None:  # the first of completion and wait wins
            span[3] = self._us(t)

    def events(self) -> list[Event]:
        """Action records, oldest step first."""
        return [e for actions, _ in self._steps for e in actions]

    def async_spans(self) -> list[Event]:
        """Completed async spans, oldest step first."""
        return [tuple(s) for _, spans in self._steps for s in spans if s[3] is not None]


class FutureEnd:
    """A torch Future (a gloo collective's) as a span's completion: it ended when its
    callback runs, on the backend's thread."""

    def __init__(self, future):
        self._future = future

    def then(self, fn) -> None:
        self._future.then(lambda _: fn(time.perf_counter()))


def lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Lane of each (start, end) interval such that intervals in one lane never overlap
    (greedy, by start time): overlapping spans on one track would be drawn as if nested."""
    ends: list[float] = []
    out = [0] * len(intervals)
    for i in sorted(range(len(intervals)), key=lambda i: intervals[i][0]):
        t0, t1 = intervals[i]
        lane = next((k for k, end in enumerate(ends) if end <= t0), len(ends))
        if lane == len(ends):
            ends.append(t1)
        ends[lane] = t1
        out[i] = lane
    return out


def _span(name: str, rank: int, tid: int, step: int, t0: float, t1: float) -> dict:
    return {"ph": "X", "name": name, "cat": name.rstrip("0123456789.") or name, "pid": rank,
            "tid": tid, "ts": round(t0, 3), "dur": round(max(t1 - t0, 0.0), 3),
            "args": {"step": step + STEPS_FROM}}


def _meta(kind: str, pid: int, tid: int, args: dict) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def chrome_trace(events_by_rank: dict[int, list[Event]], labels: dict[int, str],
                 async_by_rank: dict[int, list[Event]] | None = None) -> dict:
    """Trace Event Format: one process per rank; its actions on thread 0, its async spans on
    threads 1, 2, ... (as many as were in flight at once); each span's `args.step` is its
    step as metrics.jsonl counts it (from 1)."""
    out = []
    for rank, events in sorted(events_by_rank.items()):
        out.append(_meta("process_name", rank, 0, {"name": labels.get(rank, f"rank {rank}")}))
        out.append(_meta("process_sort_index", rank, 0, {"sort_index": rank}))
        out.append(_meta("thread_name", rank, 0, {"name": "actions"}))
        out += [_span(name, rank, 0, step, t0, t1) for step, name, t0, t1 in events]
        spans = (async_by_rank or {}).get(rank, [])
        span_lanes = lanes([(t0, t1) for _, _, t0, t1 in spans])
        for lane in sorted(set(span_lanes)):
            out.append(_meta("thread_name", rank, lane + 1, {"name": f"async {lane + 1}"}))
        out += [_span(name, rank, lane + 1, step, t0, t1)
                for (step, name, t0, t1), lane in zip(spans, span_lanes)]
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"steps_from": STEPS_FROM}}


def write_chrome_trace(path: str | Path, events_by_rank, labels, async_by_rank=None) -> None:
    Path(path).write_text(json.dumps(chrome_trace(events_by_rank, labels, async_by_rank)))
