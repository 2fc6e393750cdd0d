"""The cost of every IR action of one stage on a hardware profile: how it runs (its kind), how
long it takes, and what it does to the memory ledger.

`DURATIONS` has one entry per op of the registry (schedule/ops.py; checked at import); `OPS`
pairs it with the op's kind, derived from its spec (`kind_of`), which tells the simulator which
resource the action uses:

    compute     runs on the rank's own thread/stream: the walker waits for it (F, B, BI, BW, R, U, and
                on a device without a host link, the copies P, O, L: a CPU copies in place)
    copy        started on the copy engine; a later wait (WP, WL) waits for it
    send, recv  one side of a point-to-point transfer (SA/RA, SG/RG), matched with the peer
    sync        the data-parallel all-reduce of one unit (GS), over the stage's replicas (with
                --sync diloco's islands, the island's; OS u: the outer delta's, or its slice's
                across the islands)
    pair        the sum of a weight tied across stages (TS): an all-reduce of its fp32 gradient
                between the first and the last stage, once both have issued it
    norm        the all-reduce of the squared norm over the pipeline (N)
    wait        waits for the start it names (WSA, WRA, WSG, WRG, WGS, WTS, WN, WP, WL, WRS, WOS);
                then the walker runs the wait's own work, where it has some (WRS's add, WOS's
                outer step; with --sync diloco's islands WOS first all-gathers the island's
                sums, blocking, on the rank's links: OpCost.blocking)
    step_end    the loss reduction: blocks until every stage reached it (E); over the replicas
                too, unless --sync diloco (with islands: over the island)
    host        started on the rank's host update thread (SU, SN); SU's wait (WU) is in the next
                step's program. On a machine whose ranks share their cores with the compute (a
                CPU profile) the walker runs it, as it would run U: no overlap is claimed there
    free        no time (X: dropping a view)

Sharded state (the plan's `shard_state`, ZeRO-style): each of the dp replicas holds a slice of
S = ceil(N / dp) of a unit's N parameters (unit_costs.shard; N_pad = dp S). It changes what
four ops do; replica 0 is the one simulated:

    P u    an all-gather, not a copy: kind "sync" (on the replicas' links, shared with the
           syncs): cast the fp32 slice into its slot of the view ((4 + elt) S bytes at memory
           bandwidth), then a ring all-gather of the elt N_pad-byte view (StageCosts.gather).
           Its entry is in `SHARDED_OPS`, which `ops_for` lays over `OPS` for a sharded stage.
    GS u   a ring reduce-scatter of the 4 N_pad-byte gradient: (dp-1)/dp of it over the link
           plus (dp-1) latencies (links.ring_half), not the all-reduce's 2(dp-1)/dp
           (StageCosts.grad_sync, which the planner's closed forms read too). On CPU devices
           the all-reduce's: gloo reduce-scatters by all-reducing the full buffer
           (`Device.reduce_scatter_all_reduces`)
    U u    updates S parameters, not N (StageCosts.update_params)
    RS u.m (gradient lifetime "micro-batch") one micro-batch's reduce-scatter, priced as GS; its
           wait WRS adds the reduced slice to the shard's gradient (12 S bytes)
    GX u   (hybrid sharding: the state sharded over groups of `shard_group` replicas, S = N_pad /
           shard_group) a ring all-reduce of the 4 S-byte slice gradient over the dp /
           shard_group replicas that hold the same slice, on their ring (`cross_ring`); P, GS, RS
           and N's scalar run over the shard group's ring (`shard_ring`)
    N      the local norm reads 4 S bytes a unit; before the pipeline's reduction the squared
           norm is summed over the replicas: a blocking all-reduce of one fp32 scalar
           (StageCosts.norm_replicas; the simulator's "norm" kind runs it on the replicas' links)

The ledger (`unit_state_owners`, `view_bytes`): masters 4 S, gradients 4 (N_pad + S) (the full
accumulation buffer and the shard's; with a gradient lifetime shorter than the step, 4 S, or
8 S with the reduction's output, and the full 4 N_pad as the `grad_full` storage of B or BW
until WGS or WRS), AdamW 8 x (real elements of the slice) + 4 x (pieces:
the parameter tensors the slice intersects), the view elt N_pad.

Memory effects are the registry's, the same the executor applies to real tensors; here
`StageCosts.storages` sizes each named storage in closed form (sim/unit_costs.py), so a
simulated peak equals the executor's ledger kind by kind by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ratrain.schedule.ir import Action
from ratrain.schedule.ops import SPECS, Op, OpClass, OpSpec, Peer, peer_offset
from ratrain.sim.links import ring
from ratrain.sim.outer_sync import outer_gather_time, outer_step_time, outer_sync_time
from ratrain.sim.stage_costs import (  # noqa: F401  (the cost model's vocabulary, re-exported)
    UPDATE_BYTES_PER_PARAM, StageCosts,
)

__all__ = ["BLOCKING", "DURATIONS", "OPS", "SHARDED_OPS", "OpCost", "StageCosts",
           "UPDATE_BYTES_PER_PARAM", "kind_of", "ops_for"]  # (the re-export, named for pyflakes)

@dataclass(frozen=True)
class OpCost:
    """How the simulator runs an op on a stage: its kind (module docstring) and duration."""

    kind: str
    duration: Callable[[StageCosts, Action], float]
    # a wait's blocking collective on the rank's links once what it waits for is done, before
    # its duration's work on the walker (WOS u with islands: the island's all-gather)
    blocking: Callable[[StageCosts, Action], float] | None = None


def _zero(c: StageCosts, a: Action) -> float:
    return 0.0


def _forward_time(c: StageCosts, a: Action) -> float:
    return c.forward(a.unit, with_grad=c.s.activation.get(a.unit, "keep") != "recompute")


def _saved_copy(c: StageCosts, a: Action) -> float:
    return c.copy_time(sum(n for _, n in c.saved_storages(a.unit, a.mb)))


def _p2p_time(c: StageCosts, a: Action) -> float:
    link = c.s.p2p_next if peer_offset(a.op) > 0 else c.s.p2p_prev
    return link.time(c.act_bytes())


def _step_end_time(c: StageCosts, a: Action) -> float:
    """E: the loss's sum and count reduced over the pipeline, and over the replicas that sum
    their gradients (a training step's: --sync diloco's inner step keeps its loss on its
    replica, or with islands, on its island; runtime/lifecycle.step_end)."""
    return ring(c.s.pipeline, 8, c.s.pp) + ring(c.s.sync_ring, 8, c.s.sync_replicas)


def _tied_sync_time(c: StageCosts, a: Action) -> float:
    """TS: the tied weight's fp32 gradient all-reduced by the two stages holding a copy."""
    return ring(c.s.tied, 4 * c.s.model.vocab_size * c.s.model.dim, 2)


DURATIONS: dict[Op, Callable[[StageCosts, Action], float]] = {
    Op.FORWARD: _forward_time,
    Op.BACKWARD: lambda c, a: c.backward(a.unit, a.mb),
    Op.BACKWARD_INPUT: lambda c, a: c.backward_input(a.unit),
    Op.BACKWARD_WEIGHT: lambda c, a: c.backward_weight(a.unit, a.mb),
    Op.RECOMPUTE: lambda c, a: c.forward(a.unit),
    Op.SEND_ACT: _p2p_time,
    Op.WAIT_SEND_ACT: _zero,
    Op.RECV_ACT: _p2p_time,
    Op.WAIT_RECV_ACT: _zero,
    Op.SEND_GRAD: _p2p_time,
    Op.WAIT_SEND_GRAD: _zero,
    Op.RECV_GRAD: _p2p_time,
    Op.WAIT_RECV_GRAD: _zero,
    Op.GRAD_SYNC: lambda c, a: c.grad_sync(a.unit),
    Op.WAIT_GRAD_SYNC: _zero,
    Op.GRAD_REDUCE: lambda c, a: c.grad_sync(a.unit),
    Op.WAIT_GRAD_REDUCE: lambda c, a: c.reduced_add(a.unit),
    Op.CROSS_SYNC: lambda c, a: c.cross_sync(a.unit),
    Op.WAIT_CROSS_SYNC: _zero,
    Op.GRAD_NORM: lambda c, a: ring(c.s.pipeline, 4, c.s.pp),
    Op.WAIT_GRAD_NORM: _zero,
    Op.UPDATE: lambda c, a: c.update(a.unit),
    Op.START_UPDATE: lambda c, a: c.update(a.unit),
    Op.WAIT_UPDATE: _zero,
    Op.START_NORM: lambda c, a: c.unit_norm(a.unit),
    Op.WAIT_NORM: _zero,
    Op.OFFLOAD: _saved_copy,
    Op.RELOAD: _saved_copy,
    Op.WAIT_RELOAD: _zero,
    Op.PREFETCH: lambda c, a: c.view_time(a.unit),
    Op.WAIT_PREFETCH: _zero,
    Op.RELEASE: _zero,
    Op.STEP_END: _step_end_time,
    Op.TIED_SYNC: _tied_sync_time,
    Op.WAIT_TIED_SYNC: _zero,
    Op.OUTER_SYNC: lambda c, a: outer_sync_time(c, a.unit),
    Op.WAIT_OUTER_SYNC: lambda c, a: outer_step_time(c, a.unit),
}
"""One duration per op of the registry (checked at import)."""

if set(DURATIONS) != set(Op):
    raise ImportError(f"sim/cost_model.py: no duration for {sorted(o.name for o in set(Op) - set(DURATIONS))}")


def kind_of(spec: OpSpec) -> str:
    """The simulator's kind of an op (module docstring), from its spec."""
    if spec.waits:
        return "wait"
    if spec.cls is OpClass.P2P:
        return "send" if spec.sends else "recv"
    if spec.cls is OpClass.COLLECTIVE:
        if Peer.TIED in spec.peers:
            return "pair"
        if not spec.pipeline_collective:
            return "sync"
        return "norm" if spec.starts else "step_end"
    return {OpClass.COMPUTE: "compute", OpClass.COPY: "copy", OpClass.STATE: "free",
            OpClass.HOST: "host"}[spec.cls]


BLOCKING: dict[Op, Callable[[StageCosts, Action], float]] = {
    Op.WAIT_OUTER_SYNC: lambda c, a: outer_gather_time(c, a.unit),
}
"""The waits that run a collective of their own before their work (OpCost.blocking)."""

OPS: dict[Op, OpCost] = {op: OpCost(kind_of(spec), DURATIONS[op], BLOCKING.get(op))
                         for op, spec in SPECS.items()}

SHARDED_OPS: dict[Op, OpCost] = {
    Op.PREFETCH: OpCost("sync", lambda c, a: c.gather(a.unit)),  # an all-gather
}
"""The entries that sharded state replaces (its kind changes); GS, U and N keep theirs and
price the shard through StageCosts (module docstring)."""


def ops_for(shard_state: bool) -> dict[Op, OpCost]:
    """The op table of a stage: OPS, with SHARDED_OPS over it where the state is sharded."""
    return {**OPS, **SHARDED_OPS} if shard_state else OPS
