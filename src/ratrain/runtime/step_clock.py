"""Timestamps of a step's actions for the trace, without blocking the host.

On a CPU the host's clock is the truth: an action's span is its handler's. On CUDA the
handlers only queue work, so a span is a pair of CUDA events on the compute stream, turned
into host times (seconds, perf_counter's origin) after the step's end has synchronized.
"""

from __future__ import annotations

import time

import torch


class HostClock:
    def begin(self) -> None:
        pass

    def mark(self) -> float:
        return time.perf_counter()

    def resolve(self, mark: float) -> float:
        return mark

    def settle(self) -> None:
        pass


class CudaClock:
    def __init__(self, device: torch.device):
        self.device = device
        self._origin = None
        self._origin_host = 0.0

    def begin(self) -> None:
        """The previous step's end synchronized, so the stream is idle: its origin event and
        the host clock agree here."""
        self._origin = torch.cuda.Event(enable_timing=True)
        self._origin.record(torch.cuda.current_stream(self.device))
        self._origin_host = time.perf_counter()

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def settle(self) -> None:
        """After the step: every mark has been reached (the step's end is allowed to wait)."""
        torch.cuda.current_stream(self.device).synchronize()

    def resolve(self, mark) -> float:
        return self._origin_host + self._origin.elapsed_time(mark) / 1e3


def clock_for(device: torch.device):
    return CudaClock(device) if device.type == "cuda" else HostClock()
