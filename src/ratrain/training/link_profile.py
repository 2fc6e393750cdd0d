"""`--schedule auto` on the links a multi-node run has: before the plan exists, the ranks join
the process group, probe the links the layout will use (runtime/link_probe.py), and the choice
simulates on the default profile with those links (sim/link_fit.py); rank 0 says the figures and
that the schedule was chosen on them, and, where the per-step gradient sync is worth avoiding,
what `--sync diloco:H` would need (sim/low_comm.py), without switching it on: it changes the
algorithm.

Only where there is a choice to make on links nothing else describes: under torchrun (or a
launcher like it) across more than one node (LOCAL_WORLD_SIZE < WORLD_SIZE), with the schedule
`auto`, no --profile and no plan file. A single process or one node's ranks skip it: their
links are the default profile's loopback."""

from __future__ import annotations

import os
from typing import Callable

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.runtime.launch import under_torchrun
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.plan import PipelinePlan
from ratrain.setup.choice import default_profile


def nodes_of(cfg: RunConfig) -> int | None:
    """Devices per node where the run's ranks span several nodes; None otherwise."""
    if not under_torchrun():
        return None
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return local if world > 1 and local < world else None


def wants_probe(cfg: RunConfig) -> bool:
    p = cfg.parallel
    return (p.schedule == AUTO_SCHEDULE and not p.plan_file and not cfg.train.profile
            and nodes_of(cfg) is not None)


def probed_profile(cfg: RunConfig, device_name: str | None, say: Callable[[str], None] | None):
    """The default profile with the links measured now (collective: every rank calls it)."""
    from ratrain.runtime.link_probe import probe
    from ratrain.runtime.process_groups import join_world
    from ratrain.sim.link_fit import measured_profile
    from ratrain.sim.profile import load_profile

    p = cfg.parallel
    grid = RankGrid(p.pp, p.dp, p.rank_order)
    _, device = join_world(p.backend, p.comm_timeout_s)
    found = probe(grid, device)
    base = load_profile(default_profile(device_name))
    profile, words = measured_profile(base, grid, nodes_of(cfg), found.sizes, found.rings,
                                      found.hops)
    if say:
        say(f"links measured at the start ({found.seconds:.1f} s, no --profile given): "
            f"{words}; --schedule auto simulates on {profile.name}")
    return profile


def low_comm_hint(cfg: RunConfig, plan: PipelinePlan, profile) -> str | None:
    """What --sync diloco would buy this synchronous plan on `profile`, where its per-step
    sync is worth avoiding; None elsewhere."""
    from ratrain.sim import low_comm
    from ratrain.sim.simulator import simulate

    t = cfg.train
    shape = {"micro_batch_size": t.micro_batch_size, "seq_len": t.seq_len, "dtype": t.dtype}
    low = low_comm.price(plan, cfg.model, profile,
                         simulate(plan, cfg.model, profile, **shape).step_time, **shape)
    if low is None or not low.worth_it:
        return None
    return ("low-communication mode (not switched on): "
            + low_comm.advice(low, t.global_batch * t.seq_len))
