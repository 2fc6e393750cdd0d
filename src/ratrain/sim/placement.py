"""Where a plan's stages and their traffic land: each stage's device group and the links its
transfers and collectives cross under the plan's rank order (ranks fill nodes of
`devices_per_node`, and a profile's device groups, in rank order). The simulator costs stages
with it; the planner bounds layouts with the same links."""

from __future__ import annotations

from dataclasses import replace

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.ir import Op
from ratrain.schedule.outer_sync import parse_sync
from ratrain.schedule.plan import PipelinePlan
from ratrain.schedule.unit_major import fold_roles
from ratrain.sim.links import Link
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.stage_setup import StageSetup


def stage_setups(plan: PipelinePlan, model: ModelConfig, profile: HardwareProfile, *,
                 micro_batch_size: int, seq_len: int, dtype: str) -> list[StageSetup]:
    """Per stage: its units, choices, device and the links its traffic crosses under the plan's
    rank order (ranks fill nodes of `devices_per_node`, and a profile's device groups, in rank
    order)."""
    groups = stage_groups(plan.pp, plan.dp, plan.rank_order, profile)
    if groups is None:
        raise UserError(f"profile {profile.name}: under rank order {plan.rank_order}, some stage's "
                        f"replicas fall on devices of different groups; every stage must be on one")
    hops, rings, pipeline = stage_links(plan.pp, plan.dp, plan.rank_order, profile)
    unit_activation = plan.unit_activation
    model = state_model(model, plan.pp)
    tied = tied_link(plan.pp, plan.dp, plan.rank_order, profile) if plan.tied_ends else None
    setups = []
    for s, (units, program) in enumerate(zip(plan.stage_units, plan.programs)):
        setups.append(StageSetup(
            profile=profile.for_group(groups[s]), model=model, micro_batch_size=micro_batch_size, seq_len=seq_len,
            dtype=dtype, n_micro=plan.n_micro, units=units,
            activation={u: unit_activation[u] for u in units},
            view_units=frozenset(a.unit for a in program if a.op is Op.PREFETCH),
            state_home=plan.state_home, dp=plan.dp, pp=plan.pp,
            p2p_prev=hops[s - 1] if s > 0 else None, p2p_next=hops[s] if s < plan.pp - 1 else None,
            replicas=rings[s], pipeline=pipeline,
            clip=plan.clip, shard_state=plan.shard_state, grad_lifetime=plan.grad_lifetime,
            shard_group=plan.shard_group, sync=plan.sync,
            fold_roles=fold_roles(program, plan.summed_on_device),
            micro_batch_group=plan.micro_batch_group,
            host_norms=frozenset(a.unit for a in program if a.op is Op.START_NORM),
            device_units=frozenset(plan.device_units).intersection(units),
            tied=tied if s in plan.tied_ends else None, host_grad_dtype=plan.host_grad_dtype,
            **hybrid_links(s, plan.pp, plan.dp, plan.rank_order, plan.shard_group, profile),
            **island_links(s, plan.pp, plan.dp, plan.rank_order, plan.sync, profile),
        ))
    return setups


def hybrid_links(stage: int, pp: int, dp: int, rank_order: str, shard_group: int | None,
                 profile: HardwareProfile) -> dict[str, Link]:
    """Hybrid sharding: the ring of replica 0's shard group (its neighbouring replicas) and
    that of the replicas holding the same slice in the other groups; none without it."""
    if shard_group is None:
        return {}
    group, cross = _group_links(stage, pp, dp, rank_order, shard_group, profile)
    return {"shard_ring": group, "cross_ring": cross}


def island_links(stage: int, pp: int, dp: int, rank_order: str, sync: str,
                 profile: HardwareProfile) -> dict[str, Link]:
    """--sync diloco's islands (schedule/outer_sync.py): the ring of replica 0's island (its
    dp / K neighbouring replicas) and that of the replicas in its place in the other islands
    (the runtime's Groups.island and Groups.across); none without islands."""
    outer = parse_sync(sync)
    if outer is None or not outer.islands:
        return {}
    island, across = _group_links(stage, pp, dp, rank_order, outer.island_size(dp), profile)
    return {"island_ring": island, "across_ring": across}


def _group_links(stage: int, pp: int, dp: int, rank_order: str, size: int,
                 profile: HardwareProfile) -> tuple[Link, Link]:
    """The ring of the stage's first `size` neighbouring replicas and the ring of replica 0
    and its counterparts in the other groups of `size` (ranks[::size])."""
    ranks = RankGrid(pp, dp, rank_order).replica_ranks(stage)
    return (_link(profile, ranks[:size]).collective, _link(profile, ranks[::size]).collective)


def stage_groups(pp: int, dp: int, rank_order: str, profile: HardwareProfile) -> list[int] | None:
    """The device group of each stage (all 0 without groups); None when some stage's replicas
    fall on devices of different groups, or there are more ranks than devices."""
    if not profile.groups:
        return [0] * pp
    if pp * dp > profile.device_count:
        return None
    grid = RankGrid(pp, dp, rank_order)
    out = []
    for s in range(pp):
        groups = {profile.group_of_rank(r) for r in grid.replica_ranks(s)}
        if len(groups) > 1:
            return None
        out.append(groups.pop())
    return out


def stage_links(pp: int, dp: int, rank_order: str,
                profile: HardwareProfile) -> tuple[list[Link], list[Link], Link]:
    """The links a layout's traffic crosses: between stages s and s + 1 (point to point, one
    per hop), each stage's replicas' ring, and one replica's pipeline ring (collectives); each
    the profile's intra-node link where its ranks share a node, else its inter-node one."""
    grid = RankGrid(pp, dp, rank_order)
    hops = [_link(profile, [grid.rank(s, 0), grid.rank(s + 1, 0)]).p2p for s in range(pp - 1)]
    rings = [_link(profile, grid.replica_ranks(s)).collective for s in range(pp)]
    return hops, rings, _link(profile, grid.pipeline_ranks(0)).collective


def tied_link(pp: int, dp: int, rank_order: str, profile: HardwareProfile) -> Link:
    """The ring of replica 0's first and last stage (tied embeddings across stages)."""
    grid = RankGrid(pp, dp, rank_order)
    return _link(profile, [grid.rank(0, 0), grid.rank(pp - 1, 0)]).collective


def _link(profile: HardwareProfile, ranks):
    """The profile's links among `ranks`: its intra-node ones where they share a node, else
    its inter-node ones."""
    return profile.link(len({r // profile.devices_per_node for r in ranks}) == 1)


def state_model(model: ModelConfig, pp: int) -> ModelConfig:
    """The model as a layout of `pp` stages holds its units' parameters: with tied embeddings
    across stages the head keeps a copy of the weight (schedule/tied_sync.py), as an untied
    head holds its own."""
    return replace(model, tie_embeddings=False) if model.tie_embeddings and pp > 1 else model
