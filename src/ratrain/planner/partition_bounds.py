"""A partition's bounds for the search (search.py): `expand` gives a layout's partitions that
fit, each queued with its closed-form bound (bounds.lower_bound), and `refine` tightens one
when first popped (bounds.pipeline_path on the links its rank order gives). Both stay below
the simulated step (tests/unit/test_planner.py), so pruning by them never loses the best."""

from __future__ import annotations

from ratrain.planner.bounds import lower_bound, pipeline_path, stage_deferrals
from ratrain.planner.candidate import Candidate
from ratrain.planner.layouts import Layout, PlanRequest
from ratrain.planner.partition import Partition, candidates, too_large
from ratrain.planner.unit_table import UnitTable
from ratrain.planner.unit_tables import UnitTables
from ratrain.sim.links import Link, ring
from ratrain.sim.placement import hybrid_links, stage_links


def expand(request: PlanRequest, tables: UnitTables, layout: Layout, slack: float) -> list[Candidate]:
    """The layout's partitions whose estimated stages fit their devices less `slack` bytes,
    with their bounds."""
    per_stage = tables(layout)
    if too_large(per_stage, slack):
        return []
    out = []
    for part in candidates(per_stage, layout.activation, slack):
        stages = [e for _, _, e in part]
        out.append(Candidate(layout, part, lower_bound(
            stages, layout.n_micro, _tail(request, per_stage[0], layout, part),
            _lead(request, per_stage, layout, part),
            _collectives(request, per_stage, layout, part),
            stage_deferrals(layout.weight_grad, layout.pp, layout.n_micro))
            / request.fastest_compute(layout)))
    return out


def _links(request: PlanRequest) -> tuple[Link, Link]:
    return request.profile.intra_node.collective, request.profile.inter_node.collective


def _tail(request: PlanRequest, table: UnitTable, layout: Layout, part: Partition,
          links: tuple[Link, ...] | None = None) -> float:
    """What stage 0 must still do after its last backward: synchronize the gradients still
    unsynchronized (ratrain: its first unit's, the last it backwards; baseline: every one) over
    the fastest of `links` (default: of the profile's), then update (after the global norm,
    every unit; sharded, the norm first sums over the replicas). A gradient lifetime shorter
    than the step changes none of it: "transient" starts the same sync there, "micro-batch"
    the last micro-batch's reduce-scatter, of the same full-size gradient (its m - 1 others
    may all have run before; `_collectives` counts them)."""
    links = links or _links(request)
    first = part[0]
    units = range(first[0], first[1])
    synced = units if layout.lifecycle.policy == "baseline" else units[:1]
    # sharded, over the replicas the state is sharded over (hybrid: the shard group's)
    over = table.costs.s.shard_replicas if layout.lifecycle.shard_state else layout.dp
    sync = 0.0
    if layout.dp > 1 and not request.outer_sync:  # (an outer sync's plans sum none each step)
        sync = sum(min(table.costs.grad_sync(u, link, over) for link in links)
                   for u in synced)
    update = first[2].update_s if request.clip else table.update[units[0]]
    if request.clip and layout.lifecycle.shard_state:
        update += min(ring(link, 4, over) for link in links)
    return sync + update


def _lead(request: PlanRequest, tables: list[UnitTable], layout: Layout,
          part: Partition) -> list[float] | None:
    """Sharded: what each stage waits for before its first forward, the all-gather of its
    first unit's view (over the fastest link the profile has); None otherwise."""
    if not layout.lifecycle.shard_state:
        return None
    return [min(table.gather(a, link) for link in _links(request))
            for table, (a, _, _) in zip(tables, part)]


def syncs_per_unit(layout: Layout) -> int:
    """The gradient syncs each unit starts in a step: none without replicas, one (GS), or one
    per micro-batch (RS, gradient lifetime "micro-batch")."""
    if layout.dp < 2:
        return 0
    return layout.n_micro if layout.lifecycle.grad_lifetime == "micro-batch" else 1


def _collectives(request: PlanRequest, tables: list[UnitTable], layout: Layout, part: Partition,
                 rings: list[tuple[Link, Link | None]] | None = None) -> list[float] | None:
    """Sharded: each stage's collectives over its replicas, which the simulator runs one after
    the other on the stage's links: every unit's syncs (`syncs_per_unit`), at least one
    all-gather of its view, and with hybrid sharding each unit's all-reduce across the shard
    groups; on the stage's (shard ring, cross ring) (`rings`) or the fastest of the profile's
    links. None otherwise (the syncs of unsharded state are all-reduces of the same size and
    are left to `_tail`)."""
    if not layout.lifecycle.shard_state:
        return None
    syncs = syncs_per_unit(layout)
    hybrid = layout.lifecycle.shard_group is not None
    out = []
    for s, (table, (a, b, _)) in enumerate(zip(tables, part)):
        links = [rings[s]] if rings else [(link, link) for link in _links(request)]
        out.append(min(table.collectives(a, b, shard, syncs)
                       + (table.cross_syncs(a, b, cross) if hybrid else 0.0)
                       for shard, cross in links))
    return out


def _stage_rings(request: PlanRequest, layout: Layout) -> list[tuple[Link, Link | None]]:
    """Each stage's (ring of the replicas its state is sharded over, ring across the shard
    groups: hybrid sharding's, else None)."""
    _, rings, _ = stage_links(layout.pp, layout.dp, layout.rank_order, request.profile)
    group = layout.lifecycle.shard_group
    if group is None:
        return [(ring, None) for ring in rings]
    out = []
    for s in range(layout.pp):
        links = hybrid_links(s, layout.pp, layout.dp, layout.rank_order, group, request.profile)
        out.append((links["shard_ring"], links["cross_ring"]))
    return out


def refine(request: PlanRequest, tables: UnitTables, candidate: Candidate) -> float:
    """A tighter lower bound on the candidate's step than the one it was queued with: its
    schedule's order walked stage by stage (bounds.pipeline_path) on the links its rank order gives,
    then stage 0's last sync and updates."""
    layout, part = candidate.layout, candidate.partition
    per_stage = tables(layout)
    hops, _, _ = stage_links(layout.pp, layout.dp, layout.rank_order, request.profile)
    sharded_rings = _stage_rings(request, layout)
    lead = ([t.gather(a, shard) for t, (a, _, _), (shard, _) in zip(per_stage, part, sharded_rings)]
            if layout.lifecycle.shard_state else [0.0] * layout.pp)
    act = per_stage[0].act
    path = pipeline_path([e for _, _, e in part], layout.n_micro, lead,
                         [link.time(act) for link in hops],
                         _tail(request, per_stage[0], layout, part, (sharded_rings[0][0],)),
                         layout.weight_grad) / request.fastest_compute(layout)
    busy = _collectives(request, per_stage, layout, part, sharded_rings) or [0.0]
    return max(candidate.bound, path, max(busy))
