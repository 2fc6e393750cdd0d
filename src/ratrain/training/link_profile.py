"""`--schedule auto` on the links a multi-node run has: before the plan exists, the ranks join
the process group and probe the links the layout will use (runtime/link_probe.py); the figures
go to the setup stage in its Machine, which simulates on the default profile with those links,
says so, and says what `--sync diloco:H` would need without switching it on
(setup/links.py).

Only where there is a choice to make on links nothing else describes: under torchrun (or a
launcher like it) across more than one node (LOCAL_WORLD_SIZE < WORLD_SIZE), with the schedule
`auto`, no --profile and no plan file. A single process or one node's ranks skip it: their
links are the default profile's loopback."""

from __future__ import annotations

import os

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.schedule.grid import RankGrid
from ratrain.setup.links import MeasuredLinks


def nodes_of(cfg: RunConfig) -> int | None:
    """Devices per node where the run's ranks span several nodes; None otherwise."""
    if not under_torchrun():
        return None
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return local if world > 1 and local < world else None


def wants_probe(cfg: RunConfig) -> bool:
    """Whether to probe: also not where torchrun started other than pp x dp processes (the
    probe's layout would name ranks that do not exist; the setup stage's rule says what is
    wrong instead)."""
    p = cfg.parallel
    return (p.schedule == AUTO_SCHEDULE and not p.plan_file and not cfg.train.profile
            and nodes_of(cfg) is not None and int(os.environ["WORLD_SIZE"]) == p.pp * p.dp)


def measure(cfg: RunConfig) -> MeasuredLinks:
    """The links the layout will use, measured now (collective: every rank calls it)."""
    from ratrain.runtime.link_probe import probe
    from ratrain.runtime.process_groups import join_world
    from ratrain.training.agreed_config import agreed_config

    p, nodes = cfg.parallel, nodes_of(cfg)
    _, device = join_world(p.backend, p.comm_timeout_s)
    agreed_config(cfg)  # the probe's layout is the settings' (a --pp of one node's hung here)
    found = probe(RankGrid(p.pp, p.dp, p.rank_order), device)
    return MeasuredLinks(nodes, tuple(found.sizes), tuple(map(tuple, found.rings)),
                         tuple(map(tuple, found.hops)), found.seconds)
