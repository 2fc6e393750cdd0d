"""Per-action timing records and their Chrome/Perfetto trace (one track per rank)."""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path


class Tracer:
    """Keeps the (step, action, start, end) records of the last `keep_steps` steps.

    Times are microseconds from `origin`, taken by every rank right after a barrier, so tracks of
    ranks on one machine line up.
    """

    def __init__(self, keep_steps: int = 3):
        self.origin = time.perf_counter()
        self._steps: deque[list[tuple[int, str, float, float]]] = deque(maxlen=keep_steps)
        self._current: list[tuple[int, str, float, float]] | None = None
        self._step = -1

    def reset_origin(self) -> None:
        self.origin = time.perf_counter()

    def begin_step(self, step: int) -> None:
        self._step = step
        self._current = []
        self._steps.append(self._current)

    def record(self, name: str, t0: float, t1: float) -> None:
        if self._current is not None:
            self._current.append(
                (self._step, name, (t0 - self.origin) * 1e6, (t1 - self.origin) * 1e6)
            )

    def events(self) -> list[tuple[int, str, float, float]]:
        return [e for step in self._steps for e in step]


def chrome_trace(events_by_rank: dict[int, list[tuple[int, str, float, float]]], labels: dict[int, str]) -> dict:
    """Trace Event Format: one process per rank, complete ('X') events for each action."""
    out = []
    for rank, events in sorted(events_by_rank.items()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": labels.get(rank, f"rank {rank}")}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        for step, name, t0, t1 in events:
            out.append({"ph": "X", "name": name, "cat": name.rstrip("0123456789.") or name,
                        "pid": rank, "tid": 0, "ts": round(t0, 3), "dur": round(max(t1 - t0, 0.0), 3),
                        "args": {"step": step}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str | Path, events_by_rank, labels) -> None:
    Path(path).write_text(json.dumps(chrome_trace(events_by_rank, labels)))
