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

from ratrain.planner.candidate import Candidate, evaluate
from ratrain.planner.device_units import keep_on_device
from ratrain.planner.layouts import Layout, PlanRequest, layouts
from ratrain.planner.partition_bounds import expand, refine
from ratrain.planner.unit_tables import UnitTables

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



def check(candidate: Candidate) -> None:
    """Run the schedule checks on the plan of a kept candidate (the search builds unchecked)."""
    candidate.plan.validate()


def search(request: PlanRequest, exhaustive: bool = False,
           first_plan_grace: float = FIRST_PLAN_GRACE,
           progress: Callable[[str], None] | None = None) -> SearchResult:
    """The `top` fastest plans that fit, fastest first (exhaustive: simulate every candidate,
    no pruning, no time limit; for checking the pruning). With none by the time limit, it goes
    on for the first up to `first_plan_grace` times the limit (1: an option's search, which
    may find none). `progress` hears "layout" at each layout expanded, "plan" at each plan
    simulated that fits and "over" at one that does not.

    A layout whose plan simulated over the budget is asked again for stages smaller by what
    its estimates fell short (`Candidate.shortfall`), and its partitions queued before that
    wait in `doubted` until the queue has nothing better: llama2-70b on 8 GPUs of 20 GB
    simulated 17 partitions of one layout, each 0.03 GB over, before its first plan. They are
    still simulated before the search ends where their bound could beat the plans found, so
    the search returns what it did."""
    started = time.perf_counter()
    tables = UnitTables(request)
    queue: list = []
    doubted: list = []  # (bound, order, candidate, slack): expanded before the layout was tightened
    order = itertools.count()
    all_layouts = layouts(request)
    for layout in all_layouts:
        heapq.heappush(queue, (tables.layout_bound(layout), next(order), "layout", (layout, 0.0)))
    best: list[Candidate] = []
    over: list[Candidate] = []
    tightened: dict[Layout, tuple[int, float]] = {}  # times re-asked, and its latest slack
    seen: set = set()
    simulated, complete, late = 0, True, False

    def beaten(bound: float) -> bool:  # no plan of this bound can enter the best
        return not exhaustive and len(best) >= request.top and bound >= best[-1].step_time

    while queue or doubted:
        if not queue or (doubted and beaten(queue[0][0])):
            bound, _, candidate, slack = heapq.heappop(doubted)
            kind, payload, doubt = "candidate", (candidate, slack), False
        else:
            bound, _, kind, payload = heapq.heappop(queue)
            doubt = not exhaustive
        if beaten(bound):
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
        if doubt and slack < tightened.get(candidate.layout, (0, 0.0))[1]:
            heapq.heappush(doubted, (bound, next(order), candidate, slack))
            continue
        seen.add(candidate.key)
        evaluate(request, candidate)
        simulated += 1
        excess = candidate.excess(request)
        if progress:
            progress("over" if excess > 0 else "plan")
        if excess > 0:
            over.append(candidate)
            _tighten(queue, order, tightened, candidate, slack,
                     max(slack + excess, candidate.shortfall(request)))
            continue
        best.append(candidate)
        best.sort(key=lambda c: c.step_time)
        del best[request.top if not exhaustive else len(best):]
    best[:request.top] = sorted((keep_on_device(request, c) for c in best[:request.top]),
                                key=lambda c: c.step_time)
    return SearchResult(request, best, len(all_layouts), simulated, over,
                        time.perf_counter() - started, complete, late)


def _tighten(queue: list, order, tightened: dict, candidate: Candidate, slack: float,
             wanted: float) -> None:
    """Queue the over-budget candidate's layout again with `wanted` bytes of slack (twice at
    most): its stages' estimates fell short of the simulated peak, so ask for smaller ones."""
    layout = candidate.layout
    times, latest = tightened.get(layout, (0, 0.0))
    if times >= 2 or wanted <= latest:
        return
    tightened[layout] = (times + 1, wanted)
    heapq.heappush(queue, (candidate.bound, next(order), "layout", (layout, wanted)))
