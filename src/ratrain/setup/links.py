"""A multi-node run's links as its start measured them (runtime/link_probe.py, through
training/link_profile.py), and what the setup stage makes of them: the profile `--schedule auto`
simulates on (the default profile with those links: sim/link_fit.py), and, where the per-step
gradient sync is worth avoiding, what `--sync diloco:H` would need (sim/low_comm.py), said but
not switched on: it changes the algorithm. Pure Python: the figures come as plain data."""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.config import RunConfig
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.plan import PipelinePlan


@dataclass(frozen=True)
class MeasuredLinks:
    """What the link probe measured, every rank alike (the slowest rank's figures)."""

    devices_per_node: int
    sizes: tuple[int, ...]  # bytes
    rings: tuple[tuple[float, ...], ...]  # per stage: its replicas' all-reduce, s per size
    hops: tuple[tuple[float, ...], ...]  # per hop s -> s + 1: one send, s per size
    seconds: float  # what the probe took


def measured_profile(cfg: RunConfig, links: MeasuredLinks, base):
    """The profile `base` (a HardwareProfile) with `links` in their classes; and what was
    measured, in words."""
    from ratrain.sim import link_fit

    p = cfg.parallel
    profile, words = link_fit.measured_profile(
        base, RankGrid(p.pp, p.dp, p.rank_order), links.devices_per_node,
        list(links.sizes), [list(r) for r in links.rings], [list(h) for h in links.hops])
    return profile, (f"links measured at the start ({links.seconds:.1f} s, no --profile "
                     f"given): {words}; --schedule auto simulates on {profile.name}")


def low_comm_hint(cfg: RunConfig, plan: PipelinePlan, profile,
                  threads_per_rank: int = 1) -> str | None:
    """What --sync diloco would buy this synchronous plan on `profile` with its ranks on
    `threads_per_rank` CPU threads, where its per-step sync is worth avoiding; None
    elsewhere."""
    from ratrain.sim import low_comm
    from ratrain.sim.simulator import simulate

    t = cfg.train
    shape = {"micro_batch_size": t.micro_batch_size, "seq_len": t.seq_len, "dtype": t.dtype,
             "threads_per_rank": threads_per_rank}
    low = low_comm.price(plan, cfg.model, profile,
                         simulate(plan, cfg.model, profile, **shape).step_time, t.steps, **shape)
    if low is None or not low.worth_it:
        return None
    return ("low-communication mode (not switched on): "
            + low_comm.advice(low, t.global_batch * t.seq_len))
