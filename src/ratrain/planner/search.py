"""The planner's search: the fastest plan that fits the memory budget, by simulated step time.

Best-first branch and bound. A layout (pipeline and data-parallel degrees, micro-batch size,
rank order, where state lives, whether it is sharded over the replicas, how views are made, the
schedule and where a split schedule's weight gradients go) has a lower bound on its step time
that no partition can beat (bounds.pipeline_bound); expanding it gives its partitions, each with
the activation choice per stage that fits and a tighter bound (bounds.lower_bound); a
partition popped off the queue the first time gets a tighter bound still (`refine`: its
schedule's order walked stage by stage, bounds.pipeline_path) and goes back in the queue where that
is higher; popped again, it is built into a plan and simulated. The search stops when the
next bound cannot beat the K-th fastest plan found, so pruning never loses the best plan: it
returns what simulating every candidate would. Only layouts that training can run enter the
queue (runnable.py: the rule `ratrain train` applies), so no plan it returns is refused.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from ratrain.planner.bounds import lower_bound, pipeline_bound, pipeline_path, stage_deferrals
from ratrain.planner.candidate import Candidate, evaluate
from ratrain.planner.device_units import keep_on_device
from ratrain.planner.layouts import Layout, PlanRequest, layouts, needs_device_grad_sum
from ratrain.planner.partition import Partition, candidates, too_large
from ratrain.planner.unit_table import UnitTable
from ratrain.sim.links import Link, ring
from ratrain.sim.placement import hybrid_links, stage_links, state_model


FIRST_PLAN_GRACE = 4
"""A search with no plan by its time limit goes on for the first, up to this many times the
limit: llama2-70b on 64 A100s of the preset found its first at 30 s of a 25 s limit, after
expanding 24,000 layouts (most of them too large for any partition), and said "raise
--time-limit"."""


@dataclass
class SearchResult:
    request: PlanRequest
    best: list[Candidate]  # fastest first, at most `top`
    layouts: int  # considered
    simulated: int
    over_budget: list[Candidate]  # simulated, estimated to fit, but over the budget
    seconds: float
    complete: bool  # False: the time limit cut the search before the bound proved the best
    late: bool = False  # no plan by the time limit: it went on for the first (FIRST_PLAN_GRACE)

    @property
    def cut(self) -> str:
        """What the time limit did to the search, in words; "" where it proved the best."""
        if self.late:
            return (f"none fitted by the {self.request.time_limit_s:g} s time limit: the first "
                    f"found, not proven the best")
        return "" if self.complete else "time limit: the best found, not proven the best"


class UnitTables:
    """Unit tables, one per stage of a layout, shared by every layout of one shape, lifecycle
    and device group."""

    def __init__(self, request: PlanRequest):
        self.request = request
        self._cache: dict[tuple, UnitTable] = {}
        self._least: dict[tuple, float] = {}  # _least_work's, per _tables_key
        self._rho: dict[tuple, float] = {}  # _own_micro's, per _tables_key
        self._bounds: dict[tuple, float] = {}  # layout_bound's, per _tables_key and pp

    def __call__(self, layout: Layout) -> list[UnitTable]:
        by_group = {g: self.table(layout, g) for g in set(layout.groups)}
        return [by_group[g] for g in layout.groups]

    def table(self, layout: Layout, group: int) -> UnitTable:
        r = self.request
        model = state_model(r.model, layout.pp)  # a tied head's copy at pp > 1
        key = (layout.micro_batch_size, layout.n_micro, layout.dp, layout.lifecycle, group,
               model.tie_embeddings)
        if key not in self._cache:
            profile = r.profile.for_group(group)
            self._cache[key] = UnitTable(
                model, profile, layout.micro_batch_size, r.seq_len, r.dtype, layout.n_micro,
                layout.lifecycle, r.clip, r.limit_of(group), r.host_limit_of(group), layout.dp,
                sums_on_device=needs_device_grad_sum(r, layout.lifecycle.state_home, layout.dp))
        scheduled = (*key, layout.schedule, layout.weight_grad)
        if scheduled not in self._cache:
            self._cache[scheduled] = self._cache[key].scheduled(layout.schedule, layout.weight_grad)
        return self._cache[scheduled]

    def _tables_key(self, layout: Layout) -> tuple:
        """What the tables of a layout's groups depend on (as `table` keys them), without
        making them: the bounds ask for them hundreds of thousands of times a search."""
        tied = self.request.model.tie_embeddings and layout.pp == 1
        return (layout.micro_batch_size, layout.n_micro, layout.dp, layout.lifecycle,
                tuple(sorted(set(layout.groups))), tied, layout.schedule, layout.weight_grad)

    def layout_bound(self, layout: Layout) -> float:
        """No partition of the layout steps sooner than this (bounds.pipeline_bound): the same
        for every layout of one set of tables and pipeline depth (rank orders, for one, differ
        in their links, which the bound leaves out)."""
        tables_key = self._tables_key(layout)
        key = (tables_key, layout.pp)
        if key not in self._bounds:
            work = self._least_work(tables_key, layout)
            self._bounds[key] = (
                pipeline_bound(work, layout.n_micro, layout.pp) if layout.weight_grad is None
                else pipeline_bound(self._least_work(tables_key, layout, chained=True),
                                    layout.n_micro, layout.pp, work,
                                    self._own_micro(tables_key, layout)))
        return self._bounds[key] / self.request.fastest_compute(layout)

    def _distinct_tables(self, layout: Layout) -> list[UnitTable]:
        """One table per kind of device the layout's stages run on."""
        return [self.table(layout, g) for g in sorted(set(layout.groups))]

    def _least_work(self, tables_key: tuple, layout: Layout, chained: bool = False) -> float:
        """One micro-batch's forward and backward through the model, each unit on the fastest
        device of the layout's groups; `chained`: without the weight halves of a split
        backward (what the pipeline's critical path chains)."""
        key = (tables_key, chained)
        if key not in self._least:
            tables = self._distinct_tables(layout)
            self._least[key] = sum(
                min(t.forward[u] + t.backward[u] - (t.weight[u] if chained else 0.0)
                    for t in tables) for u in range(tables[0].n_units))
        return self._least[key]

    def _own_micro(self, tables_key: tuple, layout: Layout) -> float:
        """pipeline_bound's c for a split layout: m, and the BWs each stage runs before its
        last BI (all but its deferrals, at most max(stage_deferrals)) at rho, the least ratio
        of a unit's BW to its forward and BI over the layout's devices."""
        m = layout.n_micro
        before = m - stage_deferrals(layout.weight_grad, layout.pp, m)[-1]  # the most
        if not before:
            return float(m)
        if tables_key not in self._rho:
            tables = self._distinct_tables(layout)
            chained = [min(t.forward[u] + t.backward[u] - t.weight[u] for t in tables)
                       for u in range(tables[0].n_units)]
            weight = [min(t.weight[u] for t in tables) for u in range(tables[0].n_units)]
            self._rho[tables_key] = min(w / x for w, x in zip(weight, chained) if x > 0)
        return m + before * self._rho[tables_key]


def check(candidate: Candidate) -> None:
    """Run the schedule checks on the plan of a kept candidate (the search builds unchecked)."""
    candidate.plan.validate()


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


def search(request: PlanRequest, exhaustive: bool = False,
           first_plan_grace: float = FIRST_PLAN_GRACE,
           progress: Callable[[str], None] | None = None) -> SearchResult:
    """The `top` fastest plans that fit, fastest first (exhaustive: simulate every candidate,
    no pruning, no time limit; for checking the pruning). With none by the time limit, it goes
    on for the first up to `first_plan_grace` times the limit (1: an option's search, which
    may find none). `progress` hears "layout" at each layout expanded, "plan" at each plan
    simulated that fits and "over" at one that does not."""
    started = time.perf_counter()
    tables = UnitTables(request)
    queue: list = []
    order = itertools.count()
    all_layouts = layouts(request)
    for layout in all_layouts:
        heapq.heappush(queue, (tables.layout_bound(layout), next(order), "layout", (layout, 0.0)))
    best: list[Candidate] = []
    over: list[Candidate] = []
    tightened: dict[Layout, int] = {}
    seen: set = set()
    simulated, complete, late = 0, True, False
    while queue:
        bound, _, kind, payload = heapq.heappop(queue)
        if not exhaustive and len(best) >= request.top and bound >= best[-1].step_time:
            break
        elapsed = time.perf_counter() - started
        if not exhaustive and elapsed > request.time_limit_s:
            if best or elapsed > request.time_limit_s * first_plan_grace:
                complete = False
                break
            late = True
        if kind == "layout":
            layout, slack = payload
            if progress:
                progress("layout")
            for c in expand(request, tables, layout, slack):
                heapq.heappush(queue, (c.bound, next(order), "candidate", (c, slack)))
            continue
        candidate, slack = payload
        if candidate.key in seen:  # a tightened layout gives some partitions again
            continue
        if not exhaustive and not candidate.refined:
            candidate.refined = True
            tighter = refine(request, tables, candidate)
            if tighter > bound:
                candidate.bound = tighter
                heapq.heappush(queue, (tighter, next(order), "candidate", (candidate, slack)))
                continue
        seen.add(candidate.key)
        evaluate(request, candidate)
        simulated += 1
        excess = candidate.excess(request)
        if progress:
            progress("over" if excess > 0 else "plan")
        if excess > 0:
            over.append(candidate)
            # The estimate was short of the simulated peak: ask the layout again for stages
            # smaller by the difference (twice at most).
            layout = candidate.layout
            if tightened.get(layout, 0) < 2:
                tightened[layout] = tightened.get(layout, 0) + 1
                heapq.heappush(queue, (candidate.bound, next(order), "layout",
                                       (layout, slack + excess)))
            continue
        best.append(candidate)
        best.sort(key=lambda c: c.step_time)
        del best[request.top if not exhaustive else len(best):]
    best[:request.top] = sorted((keep_on_device(request, c) for c in best[:request.top]),
                                key=lambda c: c.step_time)
    return SearchResult(request, best, len(all_layouts), simulated, over,
                        time.perf_counter() - started, complete, late)
