"""What `--sync diloco` would buy a synchronous plan whose replicas wait on their gradient sync
every step: the same plan without that sync (its inner step), and the smallest period H, with
and without streaming fragments, at which the outer sync adds little to the mean step
(sim/outer_period.py prices each). The planner offers it beside its plans and a run's start
names it; neither switches it on, since it changes the algorithm (the loss per token is no
longer the synchronous run's).

Where each stage's replicas span K nodes, several to a node, hierarchical DiLoCo
(`:islands=K`, an island a node's replicas) is weighed too: its inner steps still sum the
gradients every step, within the node, and only the outer sync crosses between nodes. Its
workers are K islands, not dp replicas, so its loss is the closer to the synchronous run's:
where it hides its syncs it is the option named. Pure Python."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ratrain.byte_units import decimal_bytes
from ratrain.config import ModelConfig
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.outer_sync import EVERY_STEP, grad_sync_replicas, outer_refusal
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim.outer_period import outer_bytes_per_replica, outer_period
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.result import SimResult

PERIODS = (5, 10, 20, 50, 100, 200, 500, 1000)
"""The H weighed, smallest first (DiLoCo's paper uses 500; smaller H stays closer to the
synchronous loss, so the smallest that hides the sync is the one to offer)."""
FRAGMENTS = (None, 2, 4)
"""DiLoCo (every unit at once), and Streaming DiLoCo in 2 and 4 fragments."""
HIDDEN = 0.05
"""An H hides the outer sync where the period's mean step is within this of the inner step
(the plan's step without a per-step sum: with islands, their sums within the node must hide
as well)."""
EXPOSED = 0.10
"""The per-step sync is worth avoiding where it adds at least this to the inner step: below
it, the low-communication mode would change the algorithm for little."""


@dataclass
class Option:
    sync: str  # the --sync value: diloco:H, diloco:H:F, either with :islands=K
    every: int
    fragments: int | None
    mean_step_s: float  # over a period of H steps
    hidden: bool  # within HIDDEN of the inner step (False: the largest H weighed, not hidden)
    bytes_per_period: int  # one replica's outer deltas per H steps (islands: its slices)
    results: list[SimResult]  # the inner step and each fragment's: their peaks are the memory
    islands: int | None = None  # K: hierarchical DiLoCo, an island a node's replicas


@dataclass
class LowComm:
    step_s: float  # the synchronous plan's step
    inner_s: float  # the same plan without a gradient sync per step
    options: list[Option]  # per fragment count: the smallest H that hides the outer sync

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.inner_s

    @property
    def worth_it(self) -> bool:
        return self.exposed_s >= EXPOSED * self.inner_s

    @property
    def best(self) -> Option | None:
        """Of the hiding options, islands first (fewer, bigger workers: the loss closer to
        the synchronous run's), then the smallest H, then the fewest fragments; else the
        fastest."""
        hidden = [o for o in self.options if o.hidden]
        if hidden:
            return min(hidden, key=lambda o: (o.islands is None, o.every, o.fragments or 1))
        return min(self.options, key=lambda o: o.mean_step_s, default=None)


def diloco_plan(plan: PipelinePlan, sync: str) -> PipelinePlan:
    """`plan`'s layout, schedule and memory choices with `sync` instead of a per-step sync
    (updates inline: carried updates are for the synchronous sync; sharded state, sharded
    within each island; gradients summed on the device before the host, within each island:
    plain DiLoCo sums none)."""
    return build_plan(plan.n_layers, plan.pp, plan.dp, plan.n_micro, schedule=plan.schedule,
                      shard_state=plan.shard_state,
                      policy=plan.policy, units_per_stage=[len(r) for r in plan.stage_units],
                      clip=plan.clip, rank_order=plan.rank_order, view_window=plan.view_window,
                      state_home=plan.state_home, unit_activation=plan.unit_activation,
                      check=False, weight_grad=plan.weight_grad, grad_lifetime=plan.grad_lifetime,
                      micro_batch_group=plan.micro_batch_group, sync=sync, update="inline",
                      device_grad_sum=plan.device_grad_sum and grad_sync_replicas(sync, plan.dp) > 1,
                      tie_embeddings=plan.tie_embeddings)


def price(plan: PipelinePlan, model: ModelConfig, profile: HardwareProfile, step_s: float,
          steps: int | None = None, **shape) -> LowComm | None:
    """The low-communication options of a synchronous `plan` whose simulated step is `step_s`
    (`shape`: simulate's micro_batch_size, seq_len, dtype) for a run of `steps` (an H that
    leaves it fewer than two outer syncs is not weighed: DiLoCo's replicas would meet only
    at the end; None: any); None where --sync diloco cannot run it (one replica, the baseline
    policy, sharded state without islands), it syncs no gradients, or the run is too short.
    A sharded plan is weighed with islands only (each island's state sharded over its
    replicas), and its options hide against the islands' own inner step."""
    n_units = plan.stage_units[-1].stop
    periods = [h for h in PERIODS if steps is None or 2 * h <= steps]
    if not periods:
        return None
    islands = islands_of(plan, profile)
    kinds = (islands,) if plan.shard_state else (None, islands) if islands else (None,)
    tail = f":islands={islands}" if plan.shard_state and islands else ""
    if plan.sync != EVERY_STEP or plan.shard_state and not islands or outer_refusal(
            f"diloco:{PERIODS[-1]}{tail}", plan.dp, plan.policy, plan.shard_state, n_units):
        return None
    inner_s, options = None, []
    for k in kinds:
        for fragments in FRAGMENTS:
            if fragments and fragments > n_units:
                continue
            tail = (f":{fragments}" if fragments else "") + (f":islands={k}" if k else "")
            # the synced steps' costs do not depend on H: one period prices every H
            period = outer_period(diloco_plan(plan, f"diloco:{PERIODS[-1]}{tail}"), model,
                                  profile, **shape)
            if k is None or plan.shard_state and inner_s is None:
                # (the islands' inner step sums within nodes: measured against the plain one)
                inner_s = period.inner.step_time
            for every in periods:
                if fragments and fragments > every:
                    continue
                mean = dataclasses.replace(period, every=every).mean_step_time
                hidden = mean <= (1 + HIDDEN) * inner_s
                if hidden or every == periods[-1]:
                    sync = f"diloco:{every}{tail}"
                    options.append(Option(sync, every, fragments, mean, hidden, sum(
                        outer_bytes_per_replica(diloco_plan(plan, sync), model)),
                        [period.inner, *period.synced], k))
                    break
    return LowComm(step_s, inner_s, options) if inner_s is not None else None


def islands_of(plan: PipelinePlan, profile: HardwareProfile) -> int | None:
    """K for `:islands=K`, where it keeps each island's per-step sum within a node: the nodes
    each stage's replicas span under the plan's rank order (ranks fill nodes of
    `devices_per_node`), where 1 < K < dp, K divides dp and each island of dp / K neighbouring
    replicas is on one node; None elsewhere, and where host-homed gradients would be summed
    every step by devices whose collectives cannot reach the host without being summed on the
    device first (the plan's device_grad_sum, which diloco_plan keeps for islands)."""
    devices = [profile.device] + [g.device for g in profile.groups]
    if plan.state_home == "host" and not plan.device_grad_sum and any(
            d.host_link is not None and not d.host_collectives for d in devices):
        return None
    grid, per_node = RankGrid(plan.pp, plan.dp, plan.rank_order), profile.devices_per_node
    spans = set()
    for s in range(plan.pp):
        ranks = grid.replica_ranks(s)
        spans.add(len({r // per_node for r in ranks}))
    k = spans.pop() if len(spans) == 1 else 0
    if not 1 < k < plan.dp or plan.dp % k:
        return None
    size = plan.dp // k
    for s in range(plan.pp):
        ranks = grid.replica_ranks(s)
        if any(len({r // per_node for r in ranks[i:i + size]}) > 1
               for i in range(0, plan.dp, size)):
            return None
    return k


def advice(low: LowComm, tokens_per_step: int) -> str:
    """One line: what the per-step sync costs and what --sync would hide it, marked as
    changing the algorithm."""
    best = low.best
    others = [o for o in low.options if o.hidden and o is not best]
    also = (" (or " + ", ".join(f"--sync {o.sync}" for o in others) + ")" if others else "")
    # not hidden: faster than the synchronous plan still, but its outer sync shows in the step
    what = "hides it" if best.hidden else (
        f"is the fastest H weighed, though it does not hide the outer sync (its mean step "
        f"{best.mean_step_s:.3g} s is {best.mean_step_s / low.inner_s - 1:.0%} above the "
        f"{low.inner_s:.3g} s step without a sync; hidden is within {HIDDEN:.0%})")
    return (f"the per-step gradient sync adds {low.exposed_s:.3g} s to a {low.inner_s:.3g} s "
            f"step; --sync {best.sync}{also} {what}: {tokens_per_step / best.mean_step_s:,.0f} "
            f"tokens/s predicted against {tokens_per_step / low.step_s:,.0f} "
            f"({low.step_s / best.mean_step_s:.2f}x), {decimal_bytes(best.bytes_per_period)} per "
            f"replica every {best.every} steps. It changes the ALGORITHM ({_algorithm(best)}; "
            f"the loss per token is not the synchronous run's; "
            f"over a few thousand steps, average with --outer-lr 1 --outer-momentum 0: "
            f"docs/low_bandwidth.md), so it is never chosen for you")


def _algorithm(option: Option) -> str:
    if option.islands:
        return (f"hierarchical DiLoCo: {option.islands} islands, each a node's replicas summing "
                f"their gradients every step, step alone between outer syncs")
    return "DiLoCo: each replica steps alone between outer syncs"
