"""A --sync diloco run over one period of H inner steps: the steps without an outer sync run
the plan's inner programs (no gradient crosses the replica link), and each fragment's step adds
its OS/WOS (schedule/outer_sync.step_programs). The simulator prices each distinct step once;
the period's mean step time is what a run's throughput follows. Pure Python."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ratrain.config import ModelConfig
from ratrain.schedule.outer_sync import parse_sync, step_programs
from ratrain.schedule.plan import PipelinePlan
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.result import SimResult
from ratrain.sim.simulator import simulate
from ratrain.sim import unit_costs as uc


@dataclass
class OuterPeriod:
    inner: SimResult  # a step without an outer sync
    synced: list[SimResult]  # one step per fragment, with its outer sync
    every: int  # H

    @property
    def mean_step_time(self) -> float:
        """The mean over the H steps of a period (each fragment syncs once in it)."""
        plain = self.every - len(self.synced)
        return (plain * self.inner.step_time + sum(r.step_time for r in self.synced)) / self.every

    @property
    def exposed_sync_s(self) -> list[float]:
        """What each fragment's outer sync adds to its step (the part no compute hides)."""
        return [r.step_time - self.inner.step_time for r in self.synced]


def outer_period(plan: PipelinePlan, model: ModelConfig, profile: HardwareProfile,
                 **shape) -> OuterPeriod:
    """`plan`'s period (plan.sync must be diloco); `shape`: simulate's micro_batch_size,
    seq_len, dtype."""
    outer = parse_sync(plan.sync)
    if outer is None:
        raise ValueError(f"plan syncs every step ({plan.sync!r}): no outer period")
    inner = simulate(plan, model, profile, **shape)
    synced = [simulate(dataclasses.replace(plan, programs=step_programs(plan, step)), model,
                       profile, **shape) for step in outer.synced_steps()]
    return OuterPeriod(inner, synced, outer.every)


def outer_bytes_per_replica(plan: PipelinePlan, model: ModelConfig) -> list[int]:
    """Bytes each fragment's deltas put on one replica's link between the workers per sync (a
    ring all-reduce over n sends 2 (n - 1) / n of them), fragment by fragment; their sum is
    every H steps' traffic. With islands of I replicas, each replica's slice (1/I of each
    unit's delta, padded) over the K islands; the all-gather of the sums within the island
    stays on the island's link and is not counted."""
    outer = parse_sync(plan.sync)
    n_units = plan.stage_units[-1].stop
    island, workers = outer.island_size(plan.dp), outer.workers(plan.dp)
    sizes = [0] * (outer.fragments or 1)
    for u in range(n_units):
        carried = -(-uc.param_count(model, u) // island)  # the replica's slice, padded
        sizes[outer.fragment_of(u, n_units)] += outer.delta_bytes * carried
    return [round(2 * (workers - 1) / workers * n) for n in sizes]
