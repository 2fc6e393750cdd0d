"""What a simulation predicts: per stage (replicas are identical) its timeline, compute, exposed
communication and memory; for the step, its time, throughput and bubble, as a summary and in
the executor's trace format."""

from __future__ import annotations

from dataclasses import dataclass, field

from ratrain.schedule.ir import Action


@dataclass
class RankTimeline:
    stage: int
    end: float = 0.0
    compute: float = 0.0  # seconds the walker computed
    exposed: float = 0.0  # seconds the walker waited on a transfer or collective in progress
    actions: list[tuple[Action, float, float]] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # async: start to end
    memory: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes held)
    peak: int = 0
    at_peak: dict[str, int] = field(default_factory=dict)
    held_before_training: int = 0  # masters and gradients: allocated before the first step
    device_peak: int = 0  # the peak of what lives on the compute device (not in the host tier)
    host_peak: int = 0  # the peak of what lives in a host tier apart from the device
    at_device_peak: dict[str, int] = field(default_factory=dict)  # on the device, at its peak

    def peak_with_process(self, device) -> float:
        """The device peak with what the process grows beyond the ledger (the profile's
        `device.process_overhead`): what a stage is held to against a device's memory, by
        `ratrain simulate`'s table, the schedule choice and the planner alike."""
        return self.device_peak + device.process_overhead(self.ledger_growth)

    @property
    def ledger_growth(self) -> int:
        """What the ledger adds from before the first step to its peak (optimizer state
        included)."""
        return self.peak - self.held_before_training

    def rss_growth(self, device) -> float:
        """The predicted peak RSS growth of the rank over its size before the first step (as
        metrics.jsonl measures it): the ledger's growth, with the compute's working bytes where
        the device is the process's own memory (a CPU: its device peak is the higher), plus
        what a process grows beyond them (the profile's overhead, `device.process_overhead`)."""
        growth = max(self.peak, self.device_peak) - self.held_before_training
        return growth + device.process_overhead(self.ledger_growth)

    @property
    def bubble(self) -> float:
        """Fraction of the step the walker did not compute."""
        return 1.0 - self.compute / self.end if self.end else 0.0


@dataclass
class SimResult:
    step_time: float
    tokens_per_step: int
    ranks: list[RankTimeline]  # one per stage (replicas are identical)
    device: object = None  # the profile's Device: its process overhead

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def bubble(self) -> float:
        return sum(r.bubble for r in self.ranks) / len(self.ranks)

    def summary(self) -> dict:
        return {
            "step_time_s": self.step_time, "tokens_per_s": self.tokens_per_s,
            "bubble": self.bubble,
            "stages": [{"stage": r.stage, "bubble": r.bubble, "exposed_comm_s": r.exposed,
                        "compute_s": r.compute, "peak_bytes": r.peak, "peak_by_kind": r.at_peak,
                        "device_peak_bytes": r.device_peak, "host_peak_bytes": r.host_peak,
                        "device_peak_by_kind": r.at_device_peak,
                        "rss_growth_bytes": r.rss_growth(self.device)}
                       for r in self.ranks],
        }

    def trace_events(self) -> tuple[dict, dict]:
        """(actions, async spans) per stage in the executor's trace format (trace.py)."""
        us = 1e6
        actions = {r.stage: [(0, str(a), t0 * us, t1 * us) for a, t0, t1 in r.actions] for r in self.ranks}
        spans = {r.stage: [(0, n, t0 * us, t1 * us) for n, t0, t1 in r.spans] for r in self.ranks}
        return actions, spans
