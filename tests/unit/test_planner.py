"""The planner: bounds that hold, estimates near the simulator, and a search that returns what
simulating every plan of a small space returns."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import subprocess
import sys

import pytest

from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.planner import account, search
from ratrain.planner.budget import parse_bytes
from ratrain.planner.device_units import keep_on_device
from ratrain.planner.partition import Partition
from ratrain.planner.bounds import lower_bound
from ratrain.planner.stage_cost import StageChoice, _fits, estimate
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate

TINY = get_preset("tiny")


def _request(budget=None, devices=2, policy="ratrain", profile="cpu-local", **kw):
    return search.PlanRequest(model=kw.pop("model", TINY), profile=load_profile(profile),
                              devices=devices, global_batch=kw.pop("global_batch", 8),
                              seq_len=kw.pop("seq_len", 256), dtype=kw.pop("dtype", "float32"),
                              budget=budget, policy=policy, **kw)


@pytest.mark.parametrize("text, expected", [
    ("20GB", 20 * 10**9), ("20e9", 20 * 10**9), ("18GiB", 18 * 2**30), ("512 MiB", 512 * 2**20),
    ("1000", 1000), (" 1.5gb ", 1_500_000_000), (4096, 4096),
])
def test_budgets_as_users_write_them(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "20 GBs", "-5GB", "0", "1e400", "", "GB"])
def test_a_budget_that_is_not_one_is_named(text):
    with pytest.raises(UserError, match="--memory-budget"):
        parse_bytes(text)


def test_a_budget_past_any_number_is_not_called_too_small():
    with pytest.raises(UserError, match="not a finite number of bytes"):
        parse_bytes("1e400")
    assert account.decimal_bytes(20) == "20 B" and account.decimal_bytes(900) == "0.9 kB"


_EVERY_PLAN: dict[str, list[search.Candidate]] = {}


@pytest.fixture(scope="module", autouse=True)
def _forget_every_plan():
    """Millions of objects: kept past this file they made every full garbage collection of the
    xdist worker that ran it take seconds (test_host_arena's gc.collect() 25 s)."""
    yield
    _EVERY_PLAN.clear()


def _every_plan(request: search.PlanRequest) -> list[search.Candidate]:
    """Every layout x every partition x every activation choice of every stage, simulated;
    once per space: requests that differ only in their budget (or how many plans they list)
    share one (what fits is each test's to judge, with its own request)."""
    key = repr(dataclasses.replace(request, budget=None, top=1))
    if key not in _EVERY_PLAN:
        _EVERY_PLAN[key] = _simulate_every_plan(request)
    return _EVERY_PLAN[key]


def _simulate_every_plan(request: search.PlanRequest) -> list[search.Candidate]:
    n = request.model.n_layers + 2
    tables = search.UnitTables(request)
    out = []
    for layout in search.layouts(request):
        per_stage = tables(layout)
        for cuts in itertools.combinations(range(1, n), layout.pp - 1):
            edges = [0, *cuts, n]
            options = []
            for s in range(layout.pp):
                table = per_stage[s]
                blocks = table.blocks(edges[s], edges[s + 1])
                if layout.activation == "mixed":
                    stage = [StageChoice(recompute=k) for k in range(blocks + 1)]
                else:
                    stage = [{"keep": StageChoice(),
                              "recompute": StageChoice(recompute=blocks)}[layout.activation]]
                options.append([(edges[s], edges[s + 1],
                                 estimate(table, edges[s], edges[s + 1], s, layout.pp, c))
                                for c in stage])
            for part in itertools.product(*options):
                part: Partition = list(part)
                c = search.Candidate(layout, part, lower_bound([e for _, _, e in part], layout.n_micro)
                                     / request.fastest_compute(layout))
                out.append(search.evaluate(request, c))
    return out


@pytest.mark.parametrize("budget, devices, policy", [
    (None, 2, "ratrain"), (45e6, 2, "ratrain"), (60e6, 2, "ratrain"), (60e6, 2, "baseline"),
    (40e6, 4, "ratrain"), (80e6, 4, "baseline"),
])
def test_search_returns_what_simulating_every_plan_returns(budget, devices, policy):
    request = _request(budget, devices, policy, top=1)
    every = _every_plan(request)
    assert any(c.layout.lifecycle.shard_state for c in every)  # dp >= 2: sharded state too
    fits = [c for c in every if c.excess(request) <= 0]
    found = search.search(request)
    if not fits:
        assert not found.best
        return
    fastest = min(c.step_time for c in fits)
    assert found.best, "the search found nothing where some plan fits"
    assert found.best[0].step_time == pytest.approx(fastest, rel=1e-9)
    assert found.simulated < len(every)  # it pruned


@pytest.mark.parametrize("policy, budget", [("ratrain", 38e6), ("baseline", 43e6)])
def test_the_search_shards_where_that_is_fastest_as_simulating_every_plan_does(policy, budget):
    """tiny in float16 on 4 mt3000 devices under 38-43 MB: the search returns what simulating
    every plan finds. For the baseline the fastest plan that fits shards its state (its
    gradient sync a reduce-scatter, its views all-gathered; ZeRO-1 style) over 2 replicas of a
    2-stage pipeline; ratrain's fastest sharded plan frees each full-size gradient once
    reduce-scattered ("transient"), which lets it shard over all 4 replicas with one stage and
    one micro-batch each, but a host-homed plan with carried updates is faster still. For the
    baseline a ZB-H1 on 4 stages with at most one BW deferred per stage simulates faster and
    fits, but its last stage's estimate is over the limit: the search returns the fastest plan
    whose estimates fit, the sharded one. (The budgets were 36 and 40 MB before the compute's
    working bytes counted, 2026-11-28: 2.5 MB more at the sharded plan's peak.)"""
    request = _request(budget, 4, policy, top=1, profile="mt3000", dtype="float16",
                       micro_batch_sizes=(2,))
    every = _every_plan(request)
    tables = search.UnitTables(request)
    fits = [c for c in every if c.excess(request) <= 0]
    estimated = [c for c in fits if all(_fits(t, est, request.limit) for t, (_, _, est)
                                        in zip(tables(c.layout), c.partition))]
    fastest = min(estimated, key=lambda c: c.step_time)
    life = fastest.layout.lifecycle
    sharded = min((c for c in estimated if c.layout.lifecycle.shard_state),
                  key=lambda c: c.step_time)
    if policy == "baseline":
        assert life.shard_state
        assert (fastest.layout.pp, fastest.layout.dp, life.grad_lifetime) == (2, 2, "step")
        overall = min(fits, key=lambda c: c.step_time)
        L = overall.layout
        assert (L.pp, L.dp, L.weight_grad, L.lifecycle.shard_state) == (4, 1, "bubble:1", False)
        assert overall.step_time < fastest.step_time
        assert not any(c.layout.weight_grad == "bubble" and c.layout.pp == 4 for c in fits)
    else:
        # Carried updates (mt3000's host tier is apart from the device: state homed there
        # updates beside the compute) make a host-homed 2 x 2 plan the fastest, 4.5% ahead of
        # the fastest sharded one (2026-11-26); before them the sharded plan was the fastest.
        assert fastest is min(fits, key=lambda c: c.step_time)
        assert (life.state_home, fastest.plan.update) == ("host", "carried")
        assert fastest.step_time < sharded.step_time
        L = sharded.layout
        assert (L.pp, L.dp, L.lifecycle.grad_lifetime) == (1, 4, "transient")
        step = [c for c in every if c.excess(request) <= 0 and c.layout.lifecycle.shard_state
                and c.layout.lifecycle.grad_lifetime == "step"]
        assert all(c.layout.dp == 2 for c in step) and step  # over 4, "step" does not fit
    found = search.search(request)
    # the search's best, then as many of its units' state on the device as fit (device_units)
    fastest = keep_on_device(request, fastest)
    assert found.best[0].step_time == pytest.approx(fastest.step_time, rel=1e-9)
    assert found.best[0].device_units == fastest.device_units
    assert found.best[0].layout.lifecycle == life
    assert found.best[0].plan.shard_state == life.shard_state
    assert found.best[0].plan.grad_lifetime == life.grad_lifetime
    assert found.simulated < len(every)


@pytest.mark.parametrize("devices, seq_len, budget, lifetimes", [
    (8, 64, 25e6, {"transient"}),  # step needs 28.6 MB at least (pp=1 dp=8), transient 18.0
    # simulated, with the compute's working bytes: step 42.7, transient 33.5, micro-batch 33.7;
    # transient fits with zbh1 grouped, whose one stage runs whole backwards unit-major and
    # keeps no seeds between halves. The budgets were 39 and 52 MB before the working bytes
    # counted (2026-11-28): the estimates of the plans that fit are 9% over their simulation
    (4, 256, 41e6, {"transient", "micro-batch"}),
    (2, 64, 53e6, {"transient", "micro-batch"}),  # step 50.2, transient 40.8
])
def test_where_no_step_plan_fits_a_shorter_gradient_lifetime_does(devices, seq_len, budget,
                                                                     lifetimes):
    """tiny in fp32 on one stage (--pp 1): sharding over the replicas leaves the full-size
    fp32 gradient of every unit as the largest state. No plan whose gradients live the step
    fits these budgets, of all the plans simulated; the search returns one that frees them
    early, and its simulated peak fits every stage. It is the fastest of the plans whose
    estimated stages fit too (what the search can choose: the fastest of all is 1-2% over
    the limit by its estimate in the first and third case, and 6% faster)."""
    request = _request(budget, devices, top=1, seq_len=seq_len, pipeline_degrees=(1,))
    every = _every_plan(request)
    fits = [c for c in every if c.excess(request) <= 0]
    assert fits
    assert not [c for c in fits if c.layout.lifecycle.grad_lifetime == "step"]
    assert {c.layout.lifecycle.grad_lifetime for c in fits} == lifetimes
    tables = search.UnitTables(request)
    estimated = [c for c in fits if all(_fits(t, est, request.limit) for t, (_, _, est)
                                        in zip(tables(c.layout), c.partition))]
    found = search.search(request)
    best = found.best[0]
    assert best.layout.lifecycle.grad_lifetime in lifetimes
    assert best.plan.grad_lifetime == best.layout.lifecycle.grad_lifetime
    assert best.step_time == pytest.approx(min(c.step_time for c in estimated), rel=1e-9)
    assert best.step_time <= 1.07 * min(c.step_time for c in fits)
    assert all(r.device_peak <= request.limit for r in best.result.ranks)
    assert max(best.stage_bytes) <= request.limit
    best.plan.validate()


def _simulated(profile: str, dtype: str, pp: int, dp: int, n_micro: int, schedule: str,
               weight_grad: str | None, lifetime: str, activation: str, window: int):
    from ratrain.schedule.plan import build_plan
    from ratrain.sim.simulator import simulate

    hw = load_profile(profile)
    plan = build_plan(TINY.n_layers, pp, dp, n_micro, schedule=schedule, weight_grad=weight_grad,
                      activation=activation, view_window=window, shard_state=True,
                      grad_lifetime=lifetime)
    result = simulate(plan, TINY, hw, micro_batch_size=1, seq_len=256, dtype=dtype)
    return result.step_time, [r.device_peak + hw.device.process_overhead(r.ledger_growth)
                              for r in result.ranks]


@pytest.mark.parametrize("pp, n_micro, schedule, weight_grad, pruned, instead", [
    (1, 1, "1f1b", None, "micro-batch", "transient"),
    (1, 2, "zbh1", "grouped", "micro-batch", "transient"),
    (2, 4, "zbh1", "grouped", "micro-batch", "transient"),
])
def test_a_gradient_lifetime_the_search_leaves_out_never_beats_the_one_it_keeps(
        pp, n_micro, schedule, weight_grad, pruned, instead):
    """layouts.lifetime_helps: where it leaves a lifetime out, the kept one is as fast and no
    stage peaks higher (simulated, with the process's overhead), on both kinds of profile."""
    from ratrain.planner.layouts import lifetime_helps

    assert not lifetime_helps(pruned, n_micro, pp, weight_grad)
    assert lifetime_helps(instead, n_micro, pp, weight_grad)
    for profile, dtype in (("cpu-local", "float32"), ("mt3000", "float16")):
        for dp, activation, window in itertools.product((2, 4), ("keep", "recompute"), (0, 1)):
            args = (profile, dtype, pp, dp, n_micro, schedule, weight_grad)
            time_left_out, peaks_left_out = _simulated(*args, pruned, activation, window)
            time_kept, peaks_kept = _simulated(*args, instead, activation, window)
            assert time_kept <= time_left_out * (1 + 1e-9)
            assert all(k <= p for k, p in zip(peaks_kept, peaks_left_out)), (args, activation)


def test_the_search_keeps_the_lifetimes_that_can_help():
    """Not left out: "transient", anywhere; "micro-batch" with more micro-batches. ZB-H1 with
    BWs in the bubble, and 1F1B with the compute's working bytes: "transient" peaks lower on a
    stage than "step" (by the head's buffer on tiny's last stage)."""
    from ratrain.planner.layouts import lifetime_helps

    assert lifetime_helps("transient", 1, 1, None) and lifetime_helps("transient", 3, 3, None)
    assert lifetime_helps("transient", 4, 2, "grouped")
    # 1F1B, more micro-batches than stages: the peak with the compute's working bytes comes
    # in the last micro-batch's backward, after the head's gradient was reduced and freed
    assert lifetime_helps("transient", 2, 1, None)
    one_stage = ("cpu-local", "float32", 1, 2, 2, "1f1b", None)
    step = _simulated(*one_stage, "step", "recompute", 0)
    transient = _simulated(*one_stage, "transient", "recompute", 0)
    assert transient[1][0] < step[1][0] and transient[0] <= step[0] * 1.05
    assert lifetime_helps("micro-batch", 2, 1, None)
    assert lifetime_helps("micro-batch", 3, 2, "bubble")
    layout = ("cpu-local", "float32", 2, 2, 3, "zbh1", "bubble")
    step = _simulated(*layout, "step", "keep", 0)
    transient = _simulated(*layout, "transient", "keep", 0)
    assert lifetime_helps("transient", 3, 2, "bubble")
    assert transient[1][1] < step[1][1]


def test_every_plan_the_search_returns_is_one_training_runs_with_its_lifetime():
    """Plans of every gradient lifetime among the best of a small search: each passes the rule
    training applies (runnable.refusal, with its lifetime) and the plan's checks, and its
    programs are its lifetime's (RS per micro-batch only for "micro-batch")."""
    from ratrain.planner.layouts import refusal
    from ratrain.schedule.ir import Op

    request = _request(None, 4, top=400, seq_len=64)
    found = search.search(request)
    seen = set()
    for c in found.best:
        L, life = c.layout, c.layout.lifecycle
        assert refusal(request, L.pp, L.dp, L.micro_batch_size, life) is None
        assert c.plan.grad_lifetime == life.grad_lifetime
        c.plan.validate()
        reduces = any(a.op is Op.GRAD_REDUCE for program in c.plan.programs for a in program)
        assert reduces == (life.grad_lifetime == "micro-batch")
        seen.add(life.grad_lifetime if life.shard_state else None)
    assert seen == {None, "step", "transient", "micro-batch"}
    baseline = search.search(dataclasses.replace(request, policy="baseline"))
    assert {c.layout.lifecycle.grad_lifetime for c in baseline.best} == {"step"}


@pytest.fixture(scope="module")
def every_plan_on_two_profiles():
    return [(request, _every_plan(request)) for request in (
        _request(devices=4), _request(60e6, 4, "baseline"),
        _request(devices=2, profile="mt3000", dtype="float16"))]


def test_the_bound_never_exceeds_the_simulated_step(every_plan_on_two_profiles):
    """Neither the bound a partition is queued with nor the tighter one it gets when first
    popped (`refine`: its 1F1B order walked stage by stage), sharded plans included."""
    checked = sharded = 0
    for request, plans in every_plan_on_two_profiles:
        tables = search.UnitTables(request)
        for c in plans:
            assert c.bound <= c.step_time * (1 + 1e-9), (c.layout, c.partition)
            refined = search.refine(request, tables, c)
            assert c.bound <= refined <= c.step_time * (1 + 1e-9), (c.layout, c.partition)
            checked += 1
            sharded += c.layout.lifecycle.shard_state
    assert checked > 500 and sharded > 50


def test_estimated_stage_memory_is_near_the_simulated_peak(every_plan_on_two_profiles):
    """Never more than 5% under the simulated peak (and the search re-plans a layout whose
    simulated plan overfills); over it by 6% in the median. The estimate is conservative: it
    adds a recomputation's transient and the gradient buffers to the peak of the micro-batches
    in flight, where in the program they sometimes come after a release (up to +45% on the
    smallest stages here, where those transients weigh most); and under ZB-H1 it holds a BI's
    seeds both in the BI's working bytes and among the deferred BWs' (2026-11-28: a median of
    3.5% over under 1F1B, 7.1% under ZB-H1; 5% in all before BI's working bytes counted)."""
    errors = []
    for request, plans in every_plan_on_two_profiles:
        for c in plans:
            for (_, _, est), simulated in zip(c.partition, c.result.ranks):
                errors.append((est.bytes - simulated.device_peak) / simulated.device_peak)
    assert min(errors) > -0.05
    assert statistics.median(errors) < 0.06
    assert len(errors) > 1000


def test_nothing_fits_gives_the_closest_plan_and_what_would_fit():
    request = _request(30e6)
    assert not search.search(request).best
    text = account.account(request)
    lines = text.splitlines()
    assert lines[0].startswith("no plan fits 30.00 MB per device (27.00 MB after the 10% margin)")
    assert "closest: pp=" in lines[1] and "over (states" in lines[1]
    assert any("budget of" in line for line in lines)
    assert any("devices would fit" in line for line in lines)


@pytest.mark.parametrize("budget", [1e6, 41e6])
def test_the_budget_the_account_names_finds_a_plan(budget):
    """The search admits a plan by its estimate, a little above its simulation: a budget that
    held only the simulated peak (40.99 MB here) found nothing, nor did 41 MB, whose closest
    plan fitted as simulated and was "-0.3 kB over"."""
    import re

    text = account.account(_request(budget))
    assert "-" not in re.search(r"needs [^(]*", text.splitlines()[1])[0]
    named = float(re.search(r"a budget of ([0-9.]+) MB per device would fit", text)[1]) * 1e6
    assert search.search(_request(named)).best
    assert not search.search(_request(0.99 * named)).best  # and not far above what it needs


def test_the_closest_plans_kinds_are_what_its_device_holds_not_its_host_state():
    """With the state on a GPU's host, the kinds named are those of the device's own peak: they
    and the process's overhead add up to what the stage needs (they once named 108 GB of host
    state for a stage that needed 3.7 GB of the GPU)."""
    import re

    request = search.PlanRequest(
        model=get_preset("llama2-7b"),
        profile=load_profile("bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml"),
        devices=1, global_batch=16, seq_len=4096, dtype="bfloat16", budget=3e9)
    line = account.account(request).splitlines()[1]
    assert "state on the host" in line, line
    needs = float(re.search(r"needs ([0-9.]+) GB", line)[1])
    named = re.search(r"over \((.*)\)$", line)[1]
    parts = [float(x) * (1e-3 if unit == "MB" else 1.0)
             for x, unit in re.findall(r" ([0-9.]+) (GB|MB)", named)]
    assert len(parts) >= 3 and sum(parts) == pytest.approx(needs, abs=0.03), line


def test_where_the_host_tier_refuses_host_state_the_account_says_how_much_it_needs():
    """llama3.1-8b on one GPU of the H200 profile with 120 GB of host memory: its state, 16
    bytes a parameter, is 128 GB, over the host tier's 108 GB after the margin; the closest
    plan keeps its first 5 units' (the embedding's and 4 blocks', 22.4 GB) on the device for
    the rest to fit the host, which overfills the device, and the account says why."""
    profile = load_profile("bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml")
    profile = dataclasses.replace(profile, device=dataclasses.replace(
        profile.device, host_memory_bytes=120e9))
    request = search.PlanRequest(model=get_preset("llama3.1-8b"), profile=profile, devices=1,
                                 global_batch=16, seq_len=4096, dtype="bfloat16", budget=20e9)
    text = account.account(request)
    assert "state on the host (5 units on the device)" in text.splitlines()[1]
    assert ("state on the host (--state-home host) would hold 128.48 GB of host memory on one "
            "stage") in text, text
    assert "allows 108.00 GB per device, so the first 5 units keep theirs on the device" in text
    roomy = dataclasses.replace(request, profile=dataclasses.replace(
        profile, device=dataclasses.replace(profile.device, host_memory_bytes=200e9)))
    assert search.search(roomy).best  # with the room, a host-homed plan fits


@pytest.mark.parametrize("policy, budget, needle", [
    ("ratrain", 15e6, "the full-size fp32 gradients are already freed early (gradient lifetime "
                      "transient: each freed once reduce-scattered): stage 0 holds 3.16 MB of "
                      "them at its peak, instead of 13.71 MB for the whole step"),
    ("baseline", 25e6, "the full-size fp32 gradients take 13.71 MB on stage 0 for the whole step; "
                       "--policy ratrain frees each once reduce-scattered (gradient lifetimes "
                       "transient, micro-batch): it fits"),
])
def test_nothing_fits_says_what_the_gradient_lifetimes_did_or_would_do(policy, budget, needle):
    """tiny in fp32 over 8 replicas of one stage, the closest plan sharded: ratrain's frees its
    full-size gradients early already (one block's, 3.16 MB, at its peak); the baseline's
    holds all six units' for the step, which ratrain's lifetimes would free, and then fit."""
    request = _request(budget, 8, policy, seq_len=64, pipeline_degrees=(1,))
    text = account.account(request)
    assert "closest: pp=1 dp=8" in text
    lifetime = " (gradient lifetime transient)" if policy == "ratrain" else ":"
    assert f"state on the device, sharded{lifetime}" in text
    assert needle in text.splitlines()[-1]


def test_more_devices_than_units_is_said_to_be_no_help():
    text = account.account(_request(10e6, devices=8))
    assert "more devices would not help" in text


def test_the_planner_walks_the_order_the_1f1b_builder_gives():
    """One source of 1F1B's order (schedule/builders.py): the programs are built from
    `one_f_one_b_order`, and the planner's micro-batches in flight (memory) and walk (bounds)
    read it too."""
    from ratrain.planner.lifecycle import Lifecycle
    from ratrain.planner.unit_table import UnitTable
    from ratrain.schedule.builders import (one_f_one_b, one_f_one_b_in_flight,
                                           one_f_one_b_order, partition_units)

    for pp in range(1, 7):
        for m in sorted({pp, pp + 1, 2 * pp + 3}):
            stages = partition_units(pp + 2, pp)
            for s, (program, units) in enumerate(zip(one_f_one_b(stages, m), stages)):
                steps = [(a.op == program[0].op, a.mb) for a in program[::len(units)]]
                assert tuple(steps) == one_f_one_b_order(s, pp, m)
                first_backward = next(i for i, (forward, _) in enumerate(steps) if not forward)
                assert one_f_one_b_in_flight(s, pp, m) == first_backward == min(pp - s, m)
    table = UnitTable(TINY, load_profile("cpu-local"), 1, 256, "float32", 5,
                      Lifecycle("device", None, "ratrain"), True)
    assert [table.in_flight(s, 4) for s in range(4)] == [4, 3, 2, 1]


def test_the_planner_runs_without_torch():
    code = ("import sys, ratrain.planner.search, ratrain.planner.account, ratrain.sim.simulator; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_llama2_7b_on_1024_mt3000_fits_and_ratrain_is_no_slower_than_baseline():
    request = _request(20e9, 1024, model=get_preset("llama2-7b"), profile="mt3000",
                       global_batch=1024, seq_len=4096, dtype="float16", top=1)
    found = search.search(request)
    assert found.complete and found.best
    assert max(found.best[0].stage_bytes) <= 20e9 * 0.9
    baseline = search.search(dataclasses.replace(request, policy="baseline"))
    assert found.best[0].step_time <= baseline.best[0].step_time
    # one micro-batch per replica: each full-size gradient freed after its reduce-scatter,
    # about two units' alive at a time, so one stage over all 1024 replicas fits
    best = found.best[0]
    assert (best.layout.pp, best.layout.dp, best.layout.lifecycle.grad_lifetime) == (
        1, 1024, "transient")
    assert best.result.tokens_per_s > 85_000


def test_llama2_70b_on_1024_mt3000_fits_with_sharded_state_freed_early_and_not_otherwise():
    """Unsharded, one block's fp32 masters, gradients and AdamW moments plus its fp16 view
    (15.4 GB) leave too little of the 18 GB for the micro-batches in flight (issue 9). Sharded
    over the replicas, ratrain's fastest plan frees each block's full-size fp32 gradient once
    reduced (a lifetime shorter than the step) and fits every stage (about 14 s on the 2-core
    development VM, twice that beside the other tests' worker). The baseline holds those
    gradients for the step: with a block's backward's working bytes counted (0.94 GB of the
    MLP's gradients, 2026-11-28) its closest plan, one block a stage on 64, is 0.56 GB over,
    and its account says so and that ratrain's policy fits (it fitted before they counted)."""
    common = dict(model=get_preset("llama2-70b"), profile="mt3000", global_batch=1024,
                  seq_len=4096, dtype="float16", top=1, time_limit_s=120)
    found = search.search(_request(20e9, 1024, "ratrain", **common))
    assert found.best
    best = found.best[0]
    assert max(best.stage_bytes) <= 20e9 * 0.9
    assert all(r.device_peak <= 20e9 * 0.9 for r in best.result.ranks)
    assert best.layout.lifecycle.shard_state and best.layout.dp >= 2
    assert best.layout.devices <= 1024
    assert best.layout.lifecycle.grad_lifetime in ("transient", "micro-batch")
    baseline = _request(20e9, 1024, "baseline", **common)
    assert not search.search(baseline).best
    text = account.account(baseline)
    assert "compute's working bytes" in text.splitlines()[1]
    assert "--policy ratrain frees each once reduce-scattered" in text and "it fits" in text


def _two_groups(ratio: float = 2.0):
    """Two devices: one `ratio` times as fast as the other, with less memory."""
    from ratrain.sim.profile import DeviceGroup

    base = load_profile("h100-80g-ib")
    slow = dataclasses.replace(base.device, name="slow", memory_bytes=80e9)
    fast = dataclasses.replace(
        base.device, name="fast", memory_bytes=40e9,
        compute={k: dataclasses.replace(v, peak_flops=v.peak_flops * ratio)
                 for k, v in base.device.compute.items()})
    return dataclasses.replace(base, name="two-groups", device=fast,
                               groups=[DeviceGroup("fast", 1, fast), DeviceGroup("slow", 1, slow)])


def test_a_heterogeneous_pipeline_gives_the_fast_device_more_layers():
    from ratrain.config import ModelConfig
    from ratrain.schedule.plan import build_plan
    from ratrain.sim.simulator import simulate

    model = ModelConfig(name="deep", dim=1024, n_layers=12, n_heads=8, n_kv_heads=8, ffn_dim=2752,
                        vocab_size=32000, max_seq_len=2048)
    request = search.PlanRequest(model, _two_groups(), devices=2, global_batch=16, seq_len=1024,
                                 dtype="bfloat16", pipeline_degrees=(2,), top=1)
    best = search.search(request).best[0]
    assert best.layout.groups == (0, 1)
    blocks = [sum(1 for u in range(a, b) if 0 < u <= model.n_layers) for a, b, _ in best.partition]
    assert blocks[0] > 1.5 * blocks[1], blocks  # about 2:1, the head weighing on the slow stage
    # Balanced as the simulator sees it. Not to the last percent: in 1F1B the first stage's
    # extra work hides partly in the last stage's wait, and [11, 3] units ran 0.4% faster
    # than the evenly busy [10, 4].
    busy = [r.compute for r in best.result.ranks]
    assert max(busy) / min(busy) < 1.4, busy
    even = build_plan(model.n_layers, 2, 1, best.layout.n_micro, clip=True,
                      view_window=best.layout.lifecycle.view_window,
                      state_home=best.layout.lifecycle.state_home)
    even_busy = [r.compute for r in simulate(even, model, request.profile,
                                             micro_batch_size=best.layout.micro_batch_size,
                                             seq_len=1024, dtype="bfloat16").ranks]
    assert max(even_busy) / min(even_busy) > 1.8, even_busy
    assert best.step_time < simulate(even, model, request.profile,
                                     micro_batch_size=best.layout.micro_batch_size, seq_len=1024,
                                     dtype="bfloat16").step_time


def test_a_stage_never_spans_two_device_groups():
    from ratrain.schedule.grid import RankGrid

    profile = _two_groups()
    request = search.PlanRequest(TINY, profile, devices=2, global_batch=8, seq_len=256)
    found = search.layouts(request)
    assert {(lay.pp, lay.dp) for lay in found} == {(1, 1), (2, 1)}  # 1 x 2 would mix groups
    for lay in found:
        grid = RankGrid(lay.pp, lay.dp, lay.rank_order)
        for s, g in enumerate(lay.groups):
            assert {profile.group_of_rank(r) for r in grid.replica_ranks(s)} == {g}


def test_over_a_slow_link_between_nodes_the_search_shards_within_each_node():
    """llama2-7b on 16 A100s, two nodes of 8 joined by 10 GbE, one stage (--pp 1): sharded
    over all 16 replicas every reduce-scatter crosses the slow link; hybrid sharding (within
    each node's 8, replicated across the two) sends only each slice's all-reduce across it.
    The search finds that plan, and its estimate is what the simulator makes of the plan built
    with the shard group."""
    from ratrain.planner import layouts as layouts_module

    request = _request(None, 16, model=get_preset("llama2-7b"), profile="a100-40g-10gbe",
                       global_batch=32, seq_len=4096, dtype="float16", top=1,
                       pipeline_degrees=(1,))
    found = search.search(request)
    best = found.best[0]
    assert best.layout.dp == 16 and best.layout.lifecycle.shard_group == 8
    assert best.plan.shard_group == 8
    assert "sharded in 8s" in best.layout.lifecycle.label()
    again = simulate(best.plan, request.model, request.profile, seq_len=request.seq_len,
                     micro_batch_size=best.layout.micro_batch_size, dtype=request.dtype)
    assert again.step_time == pytest.approx(best.step_time, rel=1e-9)
    assert max(r.device_peak for r in again.ranks) <= request.limit

    # without hybrid sharding the fastest plan is far slower: sharded over all 16, or 8
    # replicas within one node
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layouts_module, "_shard_groups", lambda r: (None,))
        flat = search.search(request).best[0]
    assert flat.layout.lifecycle.shard_group is None
    assert flat.step_time > 1.2 * best.step_time


def test_hybrid_sharding_is_searched_only_where_the_replicas_span_nodes():
    """mt3000 (nodes of 4): a shard group of 4 for dp = 8, 12, ...; never for dp <= 4, nor
    for the baseline, nor where every device is in one node."""
    request = _request(None, 8, profile="mt3000", dtype="float16", global_batch=8, seq_len=64)
    groups = {(L.dp, L.lifecycle.shard_group) for L in search.layouts(request)
              if L.lifecycle.shard_state}
    assert (8, 4) in groups and (8, None) in groups
    assert not {(dp, g) for dp, g in groups if g is not None and dp <= 4}
    baseline = dataclasses.replace(request, policy="baseline")
    assert all(L.lifecycle.shard_group is None for L in search.layouts(baseline))
    one_node = _request(None, 8, global_batch=8, seq_len=64)  # cpu-local: one node of 64
    assert all(L.lifecycle.shard_group is None for L in search.layouts(one_node))
