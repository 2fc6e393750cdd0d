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
from ratrain.planner.partition import Partition
from ratrain.planner.bounds import lower_bound
from ratrain.planner.stage_cost import StageChoice
from ratrain.sim.profile import load_profile

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


def _every_plan(request: search.PlanRequest) -> list[search.Candidate]:
    """Every layout x every partition x every activation choice of every stage, simulated."""
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
                                 table.estimate(edges[s], edges[s + 1], s, layout.pp, c))
                                for c in stage])
            for part in itertools.product(*options):
                part: Partition = list(part)
                c = search.Candidate(layout, part, lower_bound([e for _, _, e in part], layout.n_micro))
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


@pytest.mark.parametrize("policy", ["ratrain", "baseline"])
def test_the_search_shards_where_that_is_fastest_as_simulating_every_plan_does(policy):
    """tiny in float16 on 4 mt3000 devices under 40 MB: the fastest plan that fits shards its
    state over 2 replicas (its gradient sync a reduce-scatter, its views all-gathered), for
    the baseline (ZeRO-1 style) as for ratrain."""
    request = _request(40e6, 4, policy, top=1, profile="mt3000", dtype="float16",
                       micro_batch_sizes=(2,))
    every = _every_plan(request)
    fastest = min((c for c in every if c.excess(request) <= 0), key=lambda c: c.step_time)
    assert fastest.layout.lifecycle.shard_state and fastest.layout.dp == 2
    found = search.search(request)
    assert found.best[0].step_time == pytest.approx(fastest.step_time, rel=1e-9)
    assert found.best[0].layout.lifecycle.shard_state
    assert found.best[0].plan.shard_state
    assert found.simulated < len(every)


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
    simulated plan overfills); over it by 5% in the median. The estimate is conservative: it
    adds a recomputation's transient and the gradient buffers to the peak of the micro-batches
    in flight, where in the program they sometimes come after a release (up to +45% on the
    smallest stages here, where those transients weigh most)."""
    errors = []
    for request, plans in every_plan_on_two_profiles:
        for c in plans:
            for (_, _, est), simulated in zip(c.partition, c.result.ranks):
                errors.append((est.bytes - simulated.device_peak) / simulated.device_peak)
    assert min(errors) > -0.05
    assert statistics.median(errors) < 0.05
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


def test_more_devices_than_units_is_said_to_be_no_help():
    text = account.account(_request(10e6, devices=8))
    assert "more devices would not help" in text


def test_the_planner_walks_the_order_the_1f1b_builder_gives():
    """One source of 1F1B's order (schedule/builders.py): the programs are built from
    `one_f_one_b_order`, and the planner's micro-batches in flight (memory) and walk (bounds)
    read it too."""
    from ratrain.planner.stage_cost import Lifecycle, UnitTable
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


def test_llama2_70b_on_1024_mt3000_fits_with_sharded_state_for_both_policies():
    """Unsharded, one block's fp32 masters, gradients and AdamW moments plus its fp16 view
    (15.4 GB) leave too little of the 18 GB for the micro-batches in flight (issue 9); sharded
    over the replicas, both policies find a plan that fits every stage (about 14 s and 8 s on
    the 2-core development VM; the time limit bounds it elsewhere)."""
    for policy in ("ratrain", "baseline"):
        request = _request(20e9, 1024, policy, model=get_preset("llama2-70b"), profile="mt3000",
                           global_batch=1024, seq_len=4096, dtype="float16", top=1,
                           time_limit_s=25)
        found = search.search(request)
        assert found.best, policy
        best = found.best[0]
        assert max(best.stage_bytes) <= 20e9 * 0.9
        assert all(r.device_peak <= 20e9 * 0.9 for r in best.result.ranks)
        assert best.layout.lifecycle.shard_state and best.layout.dp >= 2
        assert best.layout.devices <= 1024


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
    from ratrain.runtime.grid import RankGrid

    profile = _two_groups()
    request = search.PlanRequest(TINY, profile, devices=2, global_batch=8, seq_len=256)
    found = search.layouts(request)
    assert {(lay.pp, lay.dp) for lay in found} == {(1, 1), (2, 1)}  # 1 x 2 would mix groups
    for lay in found:
        grid = RankGrid(lay.pp, lay.dp, lay.rank_order)
        for s, g in enumerate(lay.groups):
            assert {profile.group_of_rank(r) for r in grid.replica_ranks(s)} == {g}
