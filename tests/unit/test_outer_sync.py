"""--sync diloco in the schedule and the simulator: its form and refusals, which fragment syncs
at which step, where the pass places OS/WOS, the checks that hold them, and what the simulator
makes of them."""

from __future__ import annotations

import dataclasses

import pytest

from ratrain.models.presets import get_preset
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.outer_sync import OuterSync, parse_sync, step_programs
from ratrain.schedule.plan import build_plan
from ratrain.schedule.checks import validate
from ratrain.sim.outer_period import outer_bytes_per_replica, outer_period
from ratrain.sim.profile import Link, load_profile
from ratrain.sim.simulator import simulate

from .cli_runner import run_cli


def test_the_form_and_its_refusals():
    assert parse_sync("step") is None
    assert parse_sync("diloco:500") == OuterSync(500)
    assert parse_sync("diloco:8:4:bf16") == OuterSync(8, 4, "bfloat16")
    for bad, says in [("diloco:0", "H >= 1"), ("diloco:2:3", "F <= H"), ("diloco", "diloco:H"),
                      ("local:4", "diloco:H"), ("diloco:4:x", "diloco:H")]:
        with pytest.raises(ScheduleError, match=says):
            parse_sync(bad)


def test_islands_sum_their_gradients_every_step_and_are_the_workers():
    sync = parse_sync("diloco:8:4:bf16:islands=2")
    assert sync == OuterSync(8, 4, "bfloat16", islands=2)
    assert (sync.island_size(8), sync.workers(8)) == (4, 2)
    assert (OuterSync(8).island_size(8), OuterSync(8).workers(8)) == (1, 8)
    assert parse_sync("diloco:8:islands=2:bf16") == parse_sync("diloco:8:bf16:islands=2")
    for bad in ("diloco:8:islands=1", "diloco:8:islands=", "diloco:islands=2",
                "diloco:8:islands=x", "diloco:8:islands=2:islands=2", "diloco:8:bf16:bf16"):
        with pytest.raises(ScheduleError, match="islands=K|diloco:H"):
            parse_sync(bad)
    plan = build_plan(2, 2, 4, 2, sync="diloco:2:islands=2")
    assert plan.grad_sync_dp == 2
    for program, units in zip(step_programs(plan, 1), plan.stage_units):
        for u in units:  # the island's sum, then the update, then the outer delta
            ops = [a.op for a in program if a.unit == u and a.op in (
                Op.GRAD_SYNC, Op.WAIT_GRAD_SYNC, Op.UPDATE, Op.OUTER_SYNC, Op.WAIT_OUTER_SYNC)]
            assert ops == [Op.GRAD_SYNC, Op.WAIT_GRAD_SYNC, Op.UPDATE, Op.OUTER_SYNC,
                           Op.WAIT_OUTER_SYNC], (u, ops)


@pytest.mark.parametrize("args, says", [
    (["--dp", "1", "--sync", "diloco:4"], "needs --dp >= 2"),
    (["--dp", "4", "--sync", "diloco:4:islands=3"], "do not divide --dp 4"),
    (["--dp", "2", "--sync", "diloco:0"], "H >= 1"),
    (["--dp", "2", "--sync", "diloco:4", "--shard-state"], "--shard-state"),
    (["--dp", "2", "--sync", "diloco:4", "--policy", "baseline"], "--policy ratrain"),
    (["--dp", "2", "--sync", "diloco:4", "--outer-momentum", "1"], "outer_momentum"),
])
def test_bad_settings_get_one_line_and_exit_2(monkeypatch, capsys, args, says):
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--global-batch", "8",
                           "--schedule", "1f1b", *args)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_fragments_sync_in_turn_spread_over_the_period():
    diloco = parse_sync("diloco:3")
    assert [s for s in range(9) if diloco.fragment_due(s) is not None] == [2, 5, 8]
    streaming = parse_sync("diloco:4:2")
    due = {s: streaming.fragment_due(s) for s in range(12) if streaming.fragment_due(s) is not None}
    assert due == {4: 0, 6: 1, 8: 0, 10: 1}  # each every H steps, H / F apart, after H steps
    assert [streaming.fragment_of(u, 6) for u in range(6)] == [0, 0, 0, 1, 1, 1]


def test_diloco_places_the_sync_after_each_update_and_its_waits_before_the_end():
    plan = build_plan(2, 2, 2, 2, clip=True, sync="diloco:2")
    assert not any(a.op is Op.GRAD_SYNC for p in plan.programs for a in p)  # no per-step sync
    assert step_programs(plan, 0) is plan.programs  # nothing due
    for program, units in zip(step_programs(plan, 1), plan.stage_units):
        for u in units:
            at = program.index(Action(Op.UPDATE, u))
            assert program[at + 1] == Action(Op.OUTER_SYNC, u)
        assert program[-1 - len(units):-1] == [Action(Op.WAIT_OUTER_SYNC, u)
                                                for u in reversed(units)]


def test_streaming_starts_the_sync_first_and_merges_after_the_update():
    plan = build_plan(2, 2, 2, 2, sync="diloco:2:2")
    programs = step_programs(plan, 2)  # fragment 0: units 0 and 1, both on stage 0
    assert programs[1] == plan.programs[1]
    first = programs[0]
    assert first[:2] == [Action(Op.OUTER_SYNC, 1), Action(Op.OUTER_SYNC, 0)]
    for u in (0, 1):
        assert first[first.index(Action(Op.UPDATE, u)) + 1] == Action(Op.WAIT_OUTER_SYNC, u)


def test_the_checks_refuse_a_merge_before_the_update():
    plan = build_plan(2, 1, 2, 2, sync="diloco:2")
    program = list(step_programs(plan, 1)[0])
    wait = program.pop(program.index(Action(Op.WAIT_OUTER_SYNC, 2)))
    program.insert(program.index(Action(Op.UPDATE, 2)), wait)
    with pytest.raises(ScheduleError, match="WOS2"):
        validate([program], plan.stage_units, 2, dp=1)


def _slow_link_profile(bits_per_s: float):
    p = load_profile("cpu-local")
    slow = Link(bandwidth=bits_per_s / 8, latency=1e-3)
    for links in (p.intra_node, p.inter_node):
        links.collective = slow
    return p


def test_the_simulator_prices_the_outer_sync_and_streaming_hides_it():
    model, shape = get_preset("tiny"), dict(micro_batch_size=2, seq_len=256)
    profile = _slow_link_profile(50e6)
    every_step = simulate(build_plan(model.n_layers, 1, 2, 2), model, profile, **shape)
    diloco = outer_period(build_plan(model.n_layers, 1, 2, 2, sync="diloco:8"), model, profile,
                          **shape)
    streaming = outer_period(build_plan(model.n_layers, 1, 2, 2, sync="diloco:8:4"), model,
                             profile, **shape)
    assert diloco.inner.step_time < every_step.step_time / 2  # no gradient crosses the link
    # the whole model's delta at once: most of it exposed in its step; streamed, mostly hidden
    assert diloco.exposed_sync_s[0] > 0.5 * every_step.step_time
    assert max(streaming.exposed_sync_s) < 0.5 * diloco.exposed_sync_s[0]
    assert streaming.mean_step_time < diloco.mean_step_time < every_step.step_time
    total = outer_bytes_per_replica(build_plan(model.n_layers, 1, 2, 2, sync="diloco:8"), model)
    parts = outer_bytes_per_replica(build_plan(model.n_layers, 1, 2, 2, sync="diloco:8:4"), model)
    assert len(parts) == 4 and abs(sum(parts) - total[0]) <= 4 and max(parts) < total[0]
    # the outer parameters and momentum are counted as optimizer state: 8 bytes a parameter
    plain = diloco.inner.ranks[0].at_peak.get("optimizer", 0)
    synced_plan = dataclasses.replace(build_plan(model.n_layers, 1, 2, 2), sync="step")
    base = simulate(synced_plan, model, profile, **shape).ranks[0].at_peak.get("optimizer", 0)
    from ratrain.sim import unit_costs as uc
    assert plain - base == 8 * sum(uc.param_count(model, u) for u in range(model.n_units))


def test_an_inner_steps_end_waits_for_no_replica():
    """E reduces the loss over the replicas every synchronous step; an inner step's is the
    replica's own (training/step_meetings.py), so a link's latency does not reach it."""
    model, shape = get_preset("tiny"), dict(micro_batch_size=2, seq_len=256)
    profile = _slow_link_profile(50e6)
    for links in (profile.intra_node, profile.inter_node):
        links.collective = Link(bandwidth=links.collective.bandwidth, latency=0.25)

    def step_end(sync: str) -> float:
        plan = build_plan(model.n_layers, 1, 2, 2, sync=sync)
        (a, start, end), = [x for x in simulate(plan, model, profile, **shape).ranks[0].actions
                            if x[0].op is Op.STEP_END]
        return end - start

    assert step_end("step") >= 2 * 0.25  # a ring of two: two hops, each the latency
    assert step_end("diloco:8") < 1e-3


def test_a_host_homed_units_outer_delta_is_in_host_memory():
    """With the state in a GPU's host memory (--sync diloco's outer sync over gloo) the delta
    in flight lives there too: a synced step holds no more on the device than an inner one,
    and more on the host."""
    model, shape = get_preset("tiny"), dict(micro_batch_size=2, seq_len=256, dtype="bfloat16")
    plan = build_plan(model.n_layers, 1, 2, 2, sync="diloco:8", state_home="host", view_window=1)
    period = outer_period(plan, model, load_profile("h100-80g-ib"), **shape)
    inner, synced = period.inner.ranks[0], period.synced[0].ranks[0]
    assert synced.device_peak == inner.device_peak
    assert synced.host_peak > inner.host_peak


def test_plan_says_which_sync_its_programs_step_under(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--global-batch", "8",
                             "--dp", "4", "--micro-batch-size", "1", "--schedule", "1f1b",
                             "--sync", "diloco:2:islands=2")
    assert code == 0, err
    assert "--sync diloco:2:islands=2 (the programs below: an inner step)" in out.splitlines()[0]
    assert "GS0" in out  # the island's sum, every step


def test_the_synced_steps_of_a_period_need_no_walk_over_its_steps():
    """synced_steps asked fragment_due of each of H steps: --sync diloco:1000000000 hung
    train, simulate and plan at their start (the memory check simulates a period)."""
    from ratrain.schedule.outer_sync import parse_sync

    for text in ("diloco:1", "diloco:4", "diloco:7", "diloco:8:4", "diloco:9:4", "diloco:5:5"):
        sync = parse_sync(text)
        walked = [s for s in range(sync.every, 2 * sync.every) if sync.fragment_due(s) is not None]
        assert sync.synced_steps() == walked, text
    # (walked, this took minutes)
    assert parse_sync("diloco:1000000000:4").synced_steps() == [
        1000000000, 1250000000, 1500000000, 1750000000]
