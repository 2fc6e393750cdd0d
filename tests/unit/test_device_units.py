"""State partly on the device (PipelinePlan.device_units, --device-units): the programs keep
those units' updates inline, the plan field and its refusals, the simulator's tiers and times,
and the planner's refinement under a budget."""

from __future__ import annotations

import dataclasses

import pytest

from ratrain.config import RunConfig
from ratrain.models.presets import get_preset
from ratrain.planner.candidate import evaluate
from ratrain.planner.device_units import STATE_BYTES_PER_PARAM, keep_on_device
from ratrain.planner.layouts import PlanRequest
from ratrain.planner.search import search
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.builders import first_units, partition_units
from ratrain.schedule.errors import ScheduleConfigError, ScheduleError
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim import unit_costs as uc
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate
from ratrain.sim.stage_costs import UPDATE_BYTES_PER_PARAM

from .cli_runner import run_cli
from .executor_ledger import assert_simulated_ledger_is, executor_ledger, small_model

GPU = "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml"


@pytest.mark.parametrize("clip", [True, False])
def test_device_units_keep_their_update_inline_and_the_rest_carry_theirs(clip):
    stage_units = partition_units(4, 2)
    device = first_units(stage_units, 2)
    assert device == (0, 1, 3, 4)
    plan = build_plan(4, 2, 1, 4, clip=clip, view_window=1, state_home="host",
                      update="carried", device_units=device)
    for program, units in zip(plan.programs, plan.stage_units):
        for u in units:
            inline = Action(Op.UPDATE, u) in program
            assert inline == (u in device)
            assert (Action(Op.START_UPDATE, u) in program) == (u not in device)
            assert (Action(Op.START_NORM, u) in program) == (clip and u not in device)
    again = PipelinePlan.from_dict(plan.to_dict())
    again.validate()
    assert again.device_units == device
    assert "device_units" not in build_plan(4, 2, 1, 4, view_window=1, state_home="host").to_dict()


def test_a_plan_with_every_unit_on_the_device_carries_nothing_and_says_so():
    plan = build_plan(2, 1, 1, 2, view_window=1, state_home="host", update="carried",
                      device_units=range(4))
    assert plan.update == "inline"
    assert not any(a.op is Op.START_UPDATE for a in plan.programs[0])
    PipelinePlan.from_dict(plan.to_dict()).validate()


def test_a_plan_whose_programs_disagree_with_its_device_units_is_refused():
    plan = build_plan(4, 1, 1, 2, view_window=1, state_home="host", update="carried",
                      device_units=(0,))
    plan.device_units = (0, 1)
    with pytest.raises(ScheduleError, match=r"update units \[0\] inline, not the device units"):
        plan.validate()


@pytest.mark.parametrize("kw, message", [
    ({"state_home": "device"}, "with --state-home device every unit's is there already"),
    ({"state_home": "host", "device_units": (0, 9)}, r"device units \[9\] are not units"),
    ({"state_home": "host", "device_units": ("0",)}, r"must be unit indices \(integers\)"),
])
def test_device_units_refuse_what_they_cannot_mean(kw, message):
    args = {"device_units": (0,), "view_window": 1, "dp": 1, **kw}
    with pytest.raises(ScheduleConfigError, match=message):
        build_plan(4, 1, args.pop("dp"), 2, **args)


def _simulated(model, profile, device_units):
    plan = build_plan(model.n_layers, 1, 1, 4, activation="recompute", view_window=1,
                      state_home="host", update="carried", device_units=device_units)
    return simulate(plan, model, profile, micro_batch_size=1, seq_len=4096, dtype="bfloat16")


def test_the_simulator_moves_a_device_units_state_off_the_host_and_its_update_onto_the_device():
    model = get_preset("llama2-7b")
    profile = load_profile(GPU)
    host, mixed = _simulated(model, profile, ()), _simulated(model, profile, (0, 1))
    state = STATE_BYTES_PER_PARAM * sum(uc.param_count(model, u) for u in (0, 1))
    a, b = host.ranks[0], mixed.ranks[0]
    assert a.host_peak - b.host_peak == pytest.approx(state, abs=100)  # + AdamW's step counts
    assert b.device_peak - a.device_peak == pytest.approx(state, rel=0.02)
    assert mixed.step_time < host.step_time
    # by kind at the device's own peak: the device units' state and nothing of the host's
    for rank, units in ((a, ()), (b, (0, 1))):
        assert sum(rank.at_device_peak.values()) == rank.device_peak
        held = sum(rank.at_device_peak[k] for k in ("masters", "gradients", "optimizer"))
        expected = STATE_BYTES_PER_PARAM * sum(uc.param_count(model, u) for u in units)
        assert held == pytest.approx(expected, abs=100)
    assert a.at_peak["masters"] > 0 == a.at_device_peak["masters"]

    device_update = next(end - start for x, start, end in b.actions
                         if x.op is Op.UPDATE and x.unit == 1)
    host_update = (UPDATE_BYTES_PER_PARAM + 8) * uc.param_count(model, 1) / \
        profile.device.host_memory_bandwidth
    assert device_update < 0.2 * host_update  # the same AdamW, at the device's bandwidth


@pytest.fixture(scope="module")
def found_40gb():
    """7B on the H200 profile, batch 16 of 4096 tokens, under 40 GB: the search's two best."""
    return search(PlanRequest(model=get_preset("llama2-7b"), profile=load_profile(GPU),
                              devices=1, global_batch=16, seq_len=4096, dtype="bfloat16",
                              budget=40e9, top=2))


def test_the_planner_keeps_units_on_the_device_where_the_budget_has_room(found_40gb):
    """At 40 GB the best plans keep their first units on the device and are predicted faster
    than the same plans without; every plan still fits."""
    request, best = found_40gb.request, found_40gb.best[0]
    assert best.device_units and best.device_units == tuple(range(len(best.device_units)))
    assert max(best.stage_bytes) <= request.limit
    assert best.plan.device_units == best.device_units
    without = dataclasses.replace(best, device_units=())
    assert best.step_time < evaluate(request, without).step_time


def test_a_plan_without_room_is_left_as_it_is(found_40gb):
    request = found_40gb.request
    full = evaluate(request, dataclasses.replace(found_40gb.best[0], device_units=()))
    tight = dataclasses.replace(request, budget=max(full.stage_bytes) / (1 - request.margin) + 1e6)
    assert keep_on_device(tight, full) is full


def test_where_the_host_update_sets_the_step_blocks_recompute_to_make_room_for_units(
        monkeypatch):
    """7B on the H200 profile, one sequence of 4096 a step, 20 GB: the search's own best keeps
    18 blocks' activations, which leaves no room for device units. Recomputing every block
    makes room for 4 of them, and with the host's update most of the step that is faster; the
    state they take off the host is 16 bytes a parameter."""
    from ratrain.planner import device_units, search as search_module

    request = PlanRequest(model=get_preset("llama2-7b"), profile=load_profile(GPU), devices=1,
                          global_batch=1, seq_len=4096, dtype="bfloat16", budget=20e9, top=1)
    best = search(request).best[0]
    monkeypatch.setattr(search_module, "keep_on_device", lambda r, c: c)
    kept = search(request).best[0]
    n_units = request.model.n_layers + 2
    assert kept.choices(n_units) != ["recompute"] and not kept.device_units
    assert device_units._with_device_units(request, kept) is kept  # no room as it is
    assert best.choices(n_units) == ["recompute"]
    assert best.device_units == tuple(range(len(best.device_units))) and best.device_units
    assert best.step_time < kept.step_time
    assert max(best.stage_bytes) <= request.limit
    moved = STATE_BYTES_PER_PARAM * sum(uc.param_count(request.model, u)
                                        for u in best.device_units)
    assert kept.host_bytes[0] - best.host_bytes[0] == pytest.approx(moved, rel=1e-3)


def test_where_the_host_tier_would_overfill_the_search_keeps_the_first_units_on_the_device():
    """7B's host-homed state is 107.8 GB (16 bytes a parameter); a host tier of 100 GB (after
    the margin) takes it only with some units' state on the device. The search gives every
    stage as many first units there as its host tier needs (StageChoice.on_device), so it
    finds plans (none before: every layout's states alone overfilled the host), and each fits
    both tiers by its simulation. Batch 16 under 20 GB: 3 units, groups of 4."""
    profile = load_profile(GPU)
    profile = dataclasses.replace(profile, device=dataclasses.replace(
        profile.device, host_memory_bytes=100.08e9 / 0.9))
    request = PlanRequest(model=get_preset("llama2-7b"), profile=profile, devices=1,
                          global_batch=16, seq_len=4096, dtype="bfloat16", budget=20e9, top=3)
    model = request.model
    state = STATE_BYTES_PER_PARAM * sum(uc.param_count(model, u)
                                        for u in range(model.n_layers + 2))
    assert state > request.host_limit
    found = search(request)
    assert len(found.best) == 3
    for plan in found.best:
        units = plan.device_units
        assert units and units == tuple(range(len(units)))
        assert plan.plan.device_units == units
        moved = STATE_BYTES_PER_PARAM * sum(uc.param_count(model, u) for u in units)
        assert state - moved <= request.host_limit
        assert max(plan.host_bytes) <= request.host_limit
        assert max(plan.stage_bytes) <= request.limit
    best = found.best[0]
    assert (len(best.device_units), best.layout.micro_batch_size,
            best.layout.lifecycle.micro_batch_group) == (3, 1, 4)


def test_device_units_without_host_state_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--device-units", "2", "--steps", "1")
    assert code == 2 and "every unit's is there already" in err
    assert len(err.strip().splitlines()) == 1


def test_device_units_past_every_stages_units_is_one_line(monkeypatch, capsys):
    # the default model's 4 blocks, embedding and head: 6 units on one stage
    code, _, err = run_cli(monkeypatch, capsys, "train", "--state-home", "host",
                           "--device-units", "7", "--steps", "1")
    assert code == 2 and "--device-units 7 is more units than any stage has" in err
    assert "the largest has 6" in err and len(err.strip().splitlines()) == 1


def test_the_executors_ledger_is_the_simulators_with_device_units(monkeypatch):
    """The host units on the GPU's fold path (run here on the CPU), the device units on the
    device's: each run's fp32 sum is held on the device for the host units only, and the
    simulator holds the same bytes at the same actions; it counts the device units' state on
    the device."""
    on_device: set[int] = set()
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu",
                        property(lambda self: id(self) not in on_device))
    cfg = RunConfig(model=small_model())
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    plan = build_plan(2, 1, 1, 4, activation="recompute", view_window=1, state_home="host",
                      micro_batch_group=2, update="carried", device_units=(0, 1))
    held: set = set()
    measured = executor_ledger(cfg, plan, held, lambda engine: on_device.update(
        id(engine.stage.state[u]) for u in plan.device_units))
    assert held == {("rungrad", u) for u in (2, 3)}
    rank = assert_simulated_ledger_is(measured, plan, cfg)
    state = STATE_BYTES_PER_PARAM * sum(uc.param_count(cfg.model, u) for u in (0, 1))
    assert rank.device_peak >= state


def test_under_diloco_a_device_units_outer_state_and_delta_are_on_the_device(monkeypatch):
    """(Refused until 2026-11-27.) The outer parameters and momentum (8 bytes a parameter) of a
    device unit live on the device with its masters, and its outer delta while it is summed
    (OS u to WOS u) too; a host unit's stay on the host."""
    from ratrain.schedule.outer_sync import step_programs
    from ratrain.sim import stage_memory

    model, profile = get_preset("llama2-7b"), load_profile(GPU)

    def plan(device_units):
        return build_plan(model.n_layers, 1, 2, 4, activation="recompute", view_window=1,
                          state_home="host", device_units=device_units, sync="diloco:1")

    def synced(device_units):  # the plan as its steps with an outer sync run it
        inner = plan(device_units)
        return dataclasses.replace(inner, programs=step_programs(inner, 0))

    def run(device_units):
        return simulate(synced(device_units), model, profile, micro_batch_size=1, seq_len=4096,
                        dtype="bfloat16").ranks[0]

    host, mixed = run(()), run((0, 1))
    n = sum(uc.param_count(model, u) for u in (0, 1))
    # state 16 and outer state 8 bytes a parameter move; at the host's peak the deltas are
    # in flight too (4), at the device's not
    assert mixed.device_peak - host.device_peak == pytest.approx((16 + 8) * n, rel=1e-6)
    assert host.host_peak - mixed.host_peak == pytest.approx((16 + 8 + 4) * n, rel=1e-6)

    seen = []  # (action, device bytes, host bytes) after each change
    real_note = stage_memory.StageMemory.note

    def note(self):
        real_note(self)
        on_host = self.on_host()
        seen.append((getattr(self, "_action", None), self.ledger.total - on_host, on_host))

    real_record = stage_memory.StageMemory.record
    monkeypatch.setattr(stage_memory.StageMemory, "note", note)
    monkeypatch.setattr(stage_memory.StageMemory, "record",
                        lambda self, a: (setattr(self, "_action", a), real_record(self, a))[1])
    simulate(synced((0, 1)), model, profile, micro_batch_size=1, seq_len=4096, dtype="bfloat16")
    synced_units = set()
    for before, after in zip(seen, seen[1:]):
        a = after[0]
        if a is None or a.op is not Op.OUTER_SYNC:
            continue
        grew = (after[1] - before[1], after[2] - before[2])
        nbytes = 4 * uc.param_count(model, a.unit)  # an fp32 delta
        assert grew == ((nbytes, 0) if a.unit in (0, 1) else (0, nbytes)), (a, grew)
        synced_units.add(a.unit)
    assert synced_units == set(range(model.n_layers + 2))  # every unit's OS was seen
