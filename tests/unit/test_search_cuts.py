"""What the search cuts short. Its time limit cuts the proof that a plan is the best, not the
finding of one: a search with no plan by its limit goes on for the first
(search.FIRST_PLAN_GRACE times the limit at most); an option's search (first_plan_grace=1)
does not. The clock is a counter read once a pop off the queue, so the test does not depend on
this machine's speed. And a layout `partition.too_large` rejects is one no partition fits."""

from __future__ import annotations

import pytest

from ratrain.models.presets import get_preset
from ratrain.planner import partition, search
from ratrain.planner.layouts import PlanRequest, layouts
from ratrain.sim.profile import load_profile


class Ticks:
    """search's clock: one second more at each reading."""

    def __init__(self):
        self.now = -1.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Ticks:
    ticks = Ticks()
    monkeypatch.setattr(search.time, "perf_counter", ticks)
    return ticks


def _search(clock: Ticks, limit: float, grace: float = search.FIRST_PLAN_GRACE):
    clock.now = -1.0
    return search.search(PlanRequest(model=get_preset("small"), profile=load_profile("cpu-local"),
                                     devices=4, global_batch=8, seq_len=256, time_limit_s=limit,
                                     top=2), first_plan_grace=grace)


def test_a_search_with_no_plan_by_its_limit_goes_on_for_the_first(clock, monkeypatch):
    fitting = []  # the clock when each plan that fits was simulated
    evaluate = search.evaluate

    def noted(request, candidate):
        evaluate(request, candidate)
        if candidate.excess(request) <= 0:
            fitting.append(clock.now)
    monkeypatch.setattr(search, "evaluate", noted)
    unlimited = _search(clock, 1e9)
    assert unlimited.complete and fitting and fitting[0] >= 2
    limit = fitting[0] - 1  # passed just before the first plan
    cut = _search(clock, limit, grace=1)  # an option's search
    assert not cut.best and not cut.complete
    fitting.clear()
    found = _search(clock, limit)
    assert found.best and not found.complete and len(fitting) == 1  # stopped at its first
    assert found.late and not cut.late and not unlimited.late
    assert found.cut.startswith("none fitted by the") and unlimited.cut == ""
    assert cut.cut == "time limit: the best found, not proven the best"
    assert found.best[0].step_time >= unlimited.best[0].step_time
    # a limit that leaves time for more: it stops there, as before
    fitting.clear()
    within = _search(clock, limit + 3)
    assert len(fitting) >= 1 and max(fitting) <= limit + 3 < within.seconds


@pytest.mark.parametrize("model, devices, budget, profile", [
    ("small", 4, 400e6, "cpu-local"), ("small", 8, 200e6, "cpu-local"),
    ("tiny", 4, 40e6, "cpu-local"), ("tiny-llama3", 2, 40e6, "cpu-local"),
    ("small", 4, 200e6, "h100-80g-ib")])
def test_a_layout_too_large_by_its_state_and_views_has_no_partition_that_fits(
        model, devices, budget, profile):
    """too_large is a necessary condition only: every layout it rejects, the partitions' own
    search (stage_cost's estimates, with no time bound) finds none for; and it rejects some
    where others fit."""
    request = PlanRequest(model=get_preset(model), profile=load_profile(profile),
                          devices=devices, global_batch=8, seq_len=256, budget=budget)
    tables = search.UnitTables(request)
    rejected = fitting = 0
    for layout in layouts(request):
        per_stage = tables(layout)
        fits = partition.fits(per_stage, layout.activation)
        if partition.too_large(per_stage):
            rejected += 1
            assert not fits, layout
        fitting += fits
    assert rejected and fitting


def test_the_search_says_what_it_tried_as_it_goes():
    heard = []
    found = search.search(PlanRequest(model=get_preset("small"), profile=load_profile("cpu-local"),
                                      devices=4, global_batch=8, seq_len=256, budget=200e6),
                          progress=heard.append)
    assert found.best and found.complete
    assert heard.count("plan") + heard.count("over") == found.simulated
    # each layout once, and again (twice at most) where a plan of it was over the budget
    assert heard.count("plan") >= len(found.best)
    assert 0 < heard.count("layout") <= found.layouts + 2 * heard.count("over")
