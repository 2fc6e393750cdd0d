"""The planner's search: the fastest plan that fits the memory budget, by simulated step time.

Best-first branch and bound. A layout (pipeline and data-parallel degrees, micro-batch size,
rank order, where state lives, whether it is sharded over the replicas, how views are made) has
a lower bound on its step time that no partition can beat (stage_cost.pipeline_bound);
expanding it gives its partitions, each with
the activation choice per stage that fits and a tighter bound (stage_cost.lower_bound); a
partition popped off the queue the first time gets a tighter bound still (`refine`: its 1F1B
order walked stage by stage, stage_cost.pipeline_path) and goes back in the queue where that
is higher; popped again, it is built into a plan and simulated. The search stops when the
next bound cannot beat the K-th fastest plan found, so pruning never loses the best plan: it
returns what simulating every candidate would. Only layouts that training can run enter the
queue (runnable.py: the rule `ratrain train` applies), so no plan it returns is refused.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from ratrain import runnable
from ratrain.config import ModelConfig
from ratrain.layout import has_views
from ratrain.planner.partition import Partition, candidates
from ratrain.planner.stage_cost import (Lifecycle, UnitTable, lower_bound, pipeline_bound,
                                        pipeline_path)
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim.cost_model import ring
from ratrain.sim.placement import stage_groups, stage_links
from ratrain.sim.profile import HardwareProfile, Link
from ratrain.sim.result import SimResult
from ratrain.sim.simulator import simulate

DEFAULT_MARGIN = 0.10
"""Fraction of the budget kept free for what no ledger sees: allocator fragmentation and
caching, communication libraries' buffers."""


@dataclass(frozen=True)
class PlanRequest:
    model: ModelConfig
    profile: HardwareProfile
    devices: int
    global_batch: int
    seq_len: int
    dtype: str = "float32"
    budget: float | None = None  # bytes per device; None: the profile's memory
    margin: float = DEFAULT_MARGIN
    policy: str = "ratrain"
    clip: bool = True
    top: int = 5
    micro_batch_sizes: tuple[int, ...] | None = None  # None: every one that divides the batch
    pipeline_degrees: tuple[int, ...] | None = None  # None: 1 .. units
    time_limit_s: float = 60.0

    def device(self, group: int = 0):
        return self.profile.for_group(group).device

    def budget_of(self, group: int = 0) -> float:
        """Bytes per device of the group: its memory, or the budget asked for where lower."""
        memory = self.device(group).memory_bytes
        return memory if self.budget is None else min(self.budget, memory)

    @property
    def budget_bytes(self) -> float:
        return self.budget_of(0)

    def limit_of(self, group: int = 0) -> float:
        """What the simulated device peak of a stage on the group, plus the process's own
        overhead beyond the ledger (a measured profile's), may reach."""
        return self.budget_of(group) * (1.0 - self.margin)

    def host_limit_of(self, group: int = 0) -> float:
        host = self.device(group).host_memory_bytes
        return float("inf") if host is None else host * (1.0 - self.margin)

    @property
    def limit(self) -> float:
        return self.limit_of(0)

    @property
    def host_limit(self) -> float:
        return self.host_limit_of(0)


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    micro_batch_size: int
    n_micro: int
    rank_order: str
    lifecycle: Lifecycle
    activation: str  # "mixed" (per stage, per unit: ratrain) or one uniform choice (baseline)
    groups: tuple[int, ...] = ()  # the device group of each stage (heterogeneous profiles)

    @property
    def devices(self) -> int:
        return self.pp * self.dp


@dataclass
class Candidate:
    layout: Layout
    partition: Partition
    bound: float
    plan: PipelinePlan | None = None
    result: SimResult | None = None
    stage_bytes: list[float] = field(default_factory=list)  # simulated device peak + overhead
    host_bytes: list[float] = field(default_factory=list)  # simulated host-tier peak
    refined: bool = False  # `bound` is `refine`'s

    @property
    def step_time(self) -> float:
        return self.result.step_time if self.result else float("inf")

    @property
    def key(self) -> tuple:
        return self.layout, tuple((a, b, est.choice) for a, b, est in self.partition)

    def excess(self, request: PlanRequest) -> float:
        """Bytes by which the worst stage overfills its device (or its host tier)."""
        if not self.stage_bytes:
            return float("inf")
        return max(max(b - request.limit_of(g), h - request.host_limit_of(g))
                   for b, h, g in zip(self.stage_bytes, self.host_bytes, self.layout.groups))

    def choices(self, n_units: int) -> list[str]:
        return [est.choice.label(range(a, b), n_units) for a, b, est in self.partition]


@dataclass
class SearchResult:
    request: PlanRequest
    best: list[Candidate]  # fastest first, at most `top`
    layouts: int  # considered
    simulated: int
    over_budget: list[Candidate]  # simulated, estimated to fit, but over the budget
    seconds: float
    complete: bool  # False: the time limit cut the search before the bound proved the best


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _host_is_separate(request: PlanRequest) -> bool:
    """The profile's devices have a host tier apart from their memory (a GPU's: layout.has_views)."""
    return request.profile.device.host_link is not None


def lifecycles(request: PlanRequest) -> list[Lifecycle]:
    """State homes and view windows worth trying on this profile and dtype; views only where
    they differ from the masters (layout.has_views). Sharded state (on the device, with views,
    the gathered weights: always there) for layouts of dp >= 2 (`layouts` leaves it out of the
    others). The baseline is GPU-style: state on the device, views resident; sharded too, as
    DeepSpeed's ZeRO-1 with its pipeline engine."""
    host_tier = _host_is_separate(request)
    windows = (0, 1) if request.policy == "ratrain" else (0,)
    out = []
    for home in ("device", "host") if host_tier else ("device",):
        if request.policy == "baseline" and home == "host":
            continue
        if not has_views(request.dtype, home, host_tier):
            out.append(Lifecycle(home, None, request.policy))
            continue
        for window in windows:
            out.append(Lifecycle(home, window, request.policy))
    if has_views(request.dtype, "device", host_tier, shard_state=True):
        out.extend(Lifecycle("device", window, request.policy, shard_state=True)
                   for window in windows)
    return out


def refusal(request: PlanRequest, pp: int, dp: int, micro_batch_size: int,
            life: Lifecycle) -> str | None:
    """Why training would refuse this layout (runnable.refusal: the rule `ratrain train`
    applies), or None."""
    return runnable.refusal(
        n_layers=request.model.n_layers, pp=pp, dp=dp, global_batch=request.global_batch,
        micro_batch_size=micro_batch_size, policy=life.policy, dtype=request.dtype,
        clip=request.clip, state_home=life.state_home, shard_state=life.shard_state,
        view_window=life.view_window, tie_embeddings=request.model.tie_embeddings,
        host_is_separate=_host_is_separate(request),
        host_collectives=request.profile.device.host_collectives)


def layouts(request: PlanRequest, refused: list[str] | None = None) -> list[Layout]:
    """Every layout on at most `devices` devices that training can run (`refusal`): pp x dp x
    micro-batch size dividing the global batch into at least pp micro-batches per replica,
    sharded state only over dp >= 2, state on the host only where collectives can reach it.
    `refused`, where given, collects the reasons of those left out."""
    n_units = request.model.n_layers + 2
    g = request.global_batch
    activations = ("mixed",) if request.policy == "ratrain" else ("keep", "recompute")
    out = []
    for pp in request.pipeline_degrees or range(1, min(n_units, request.devices) + 1):
        for dp in _divisors(g):
            if pp * dp > request.devices:
                break
            for mbs in request.micro_batch_sizes or _divisors(g // dp):
                orders = ("pp-dp", "dp-pp") if pp > 1 and dp > 1 else ("pp-dp",)
                for life in lifecycles(request):
                    reason = refusal(request, pp, dp, mbs, life)
                    if reason:
                        if refused is not None:
                            refused.append(reason)
                        continue
                    for order, act in itertools.product(orders, activations):
                        groups = stage_groups(pp, dp, order, request.profile)
                        if groups is not None:
                            out.append(Layout(pp, dp, mbs, g // (dp * mbs), order, life, act,
                                              tuple(groups)))
    return out


class UnitTables:
    """Unit tables, one per stage of a layout, shared by every layout of one shape, lifecycle
    and device group."""

    def __init__(self, request: PlanRequest):
        self.request = request
        self._cache: dict[tuple, UnitTable] = {}

    def __call__(self, layout: Layout) -> list[UnitTable]:
        return [self.table(layout, g) for g in layout.groups]

    def table(self, layout: Layout, group: int) -> UnitTable:
        key = (layout.micro_batch_size, layout.n_micro, layout.dp, layout.lifecycle, group)
        if key not in self._cache:
            r = self.request
            profile = r.profile.for_group(group)
            self._cache[key] = UnitTable(
                r.model, profile, layout.micro_batch_size, r.seq_len, r.dtype, layout.n_micro,
                layout.lifecycle, r.clip, r.limit_of(group), r.host_limit_of(group), layout.dp)
        return self._cache[key]

    def least_work(self, layout: Layout) -> float:
        """One micro-batch's forward and backward through the model, each unit on the fastest
        device of the layout's groups."""
        tables = [self.table(layout, g) for g in set(layout.groups)]
        return sum(min(t.forward[u] + t.backward[u] for t in tables)
                   for u in range(tables[0].n_units))


def build(request: PlanRequest, candidate: Candidate) -> PipelinePlan:
    layout, n_units = candidate.layout, request.model.n_layers + 2
    unit_activation = {}
    for a, b, est in candidate.partition:
        unit_activation.update(est.choice.per_unit(range(a, b), n_units))
    activation = "keep" if layout.activation == "mixed" else layout.activation
    return build_plan(request.model.n_layers, layout.pp, layout.dp, layout.n_micro,
                      policy=layout.lifecycle.policy, activation=activation,
                      units_per_stage=[b - a for a, b, _ in candidate.partition], clip=request.clip,
                      rank_order=layout.rank_order, view_window=layout.lifecycle.view_window,
                      state_home=layout.lifecycle.state_home,
                      unit_activation=unit_activation if layout.activation == "mixed" else None,
                      check=False, shard_state=layout.lifecycle.shard_state)


def evaluate(request: PlanRequest, candidate: Candidate) -> Candidate:
    """Build the candidate's plan and simulate it."""
    candidate.plan = build(request, candidate)
    candidate.result = simulate(candidate.plan, request.model, request.profile,
                                micro_batch_size=candidate.layout.micro_batch_size,
                                seq_len=request.seq_len, dtype=request.dtype)
    devices = [request.device(g) for g in candidate.layout.groups]
    candidate.stage_bytes = [r.device_peak + d.process_overhead(r.ledger_growth)
                             for r, d in zip(candidate.result.ranks, devices)]
    candidate.host_bytes = [r.host_peak for r in candidate.result.ranks]
    return candidate


def check(candidate: Candidate) -> None:
    """Run the schedule checks on the plan of a kept candidate (the search builds unchecked)."""
    candidate.plan.validate()


def expand(request: PlanRequest, tables: UnitTables, layout: Layout, slack: float) -> list[Candidate]:
    """The layout's partitions whose estimated stages fit their devices less `slack` bytes,
    with their bounds."""
    per_stage = tables(layout)
    out = []
    for part in candidates(per_stage, layout.activation, slack):
        stages = [e for _, _, e in part]
        out.append(Candidate(layout, part, lower_bound(
            stages, layout.n_micro, _tail(request, per_stage[0], layout, part),
            _lead(request, per_stage, layout, part))))
    return out


def _links(request: PlanRequest) -> tuple[Link, Link]:
    return request.profile.intra_node.collective, request.profile.inter_node.collective


def _tail(request: PlanRequest, table: UnitTable, layout: Layout, part: Partition,
          links: tuple[Link, ...] | None = None) -> float:
    """What stage 0 must still do after its last backward: synchronize the gradients still
    unsynchronized (ratrain: its first unit's, the last it backwards; baseline: every one) over
    the fastest of `links` (default: of the profile's), then update (after the global norm,
    every unit; sharded, the norm first sums over the replicas)."""
    links = links or _links(request)
    first = part[0]
    units = range(first[0], first[1])
    synced = units if layout.lifecycle.policy == "baseline" else units[:1]
    sync = 0.0
    if layout.dp > 1:
        sync = sum(min(table.costs.grad_sync(u, link, layout.dp) for link in links)
                   for u in synced)
    update = first[2].update_s if request.clip else table.update[units[0]]
    if request.clip and layout.lifecycle.shard_state:
        update += min(ring(link, 4, layout.dp) for link in links)
    return sync + update


def _lead(request: PlanRequest, tables: list[UnitTable], layout: Layout,
          part: Partition) -> list[float] | None:
    """Sharded: what each stage waits for before its first forward, the all-gather of its
    first unit's view (over the fastest link the profile has); None otherwise."""
    if not layout.lifecycle.shard_state:
        return None
    return [min(table.costs.gather(a, link) for link in _links(request))
            for table, (a, _, _) in zip(tables, part)]


def refine(request: PlanRequest, tables: UnitTables, candidate: Candidate) -> float:
    """A tighter lower bound on the candidate's step than the one it was queued with: its 1F1B
    order walked stage by stage (stage_cost.pipeline_path) on the links its rank order gives,
    then stage 0's last sync and updates."""
    layout, part = candidate.layout, candidate.partition
    per_stage = tables(layout)
    hops, rings, _ = stage_links(layout.pp, layout.dp, layout.rank_order, request.profile)
    lead = ([t.costs.gather(a, link) for t, (a, _, _), link in zip(per_stage, part, rings)]
            if layout.lifecycle.shard_state else [0.0] * layout.pp)
    act = per_stage[0].act
    path = pipeline_path([e for _, _, e in part], layout.n_micro, lead,
                         [link.time(act) for link in hops],
                         _tail(request, per_stage[0], layout, part, (rings[0],)))
    return max(candidate.bound, path)


def search(request: PlanRequest, exhaustive: bool = False) -> SearchResult:
    """The `top` fastest plans that fit, fastest first (exhaustive: simulate every candidate,
    no pruning, no time limit; for checking the pruning)."""
    started = time.perf_counter()
    tables = UnitTables(request)
    queue: list = []
    order = itertools.count()
    all_layouts = layouts(request)
    for layout in all_layouts:
        bound = pipeline_bound(tables.least_work(layout), layout.n_micro, layout.pp)
        heapq.heappush(queue, (bound, next(order), "layout", (layout, 0.0)))
    best: list[Candidate] = []
    over: list[Candidate] = []
    tightened: dict[Layout, int] = {}
    seen: set = set()
    simulated, complete = 0, True
    while queue:
        bound, _, kind, payload = heapq.heappop(queue)
        if not exhaustive and len(best) >= request.top and bound >= best[-1].step_time:
            break
        if not exhaustive and time.perf_counter() - started > request.time_limit_s:
            complete = False
            break
        if kind == "layout":
            layout, slack = payload
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
    return SearchResult(request, best, len(all_layouts), simulated, over,
                        time.perf_counter() - started, complete)
