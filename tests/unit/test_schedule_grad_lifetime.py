"""Gradient lifetimes of sharded state in the IR: where the syncs and their waits go, what the
checks refuse, the plan field, and what the simulated ledger holds."""

import json
import re

import pytest

from ratrain.setup import rule as runnable
from ratrain.errors import UserError
from ratrain.schedule import (Action, Op, PipelinePlan, ScheduleError, build_plan,
                              format_program, parse_program, validate)
from ratrain.schedule.ops import WEIGHT_GRAD_OPS
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate

from .cli_runner import run_cli


def _sharded(pp, dp, n_micro, lifetime, n_layers=4, **kw):
    return build_plan(n_layers, pp, dp, n_micro, view_window=1, shard_state=True,
                      grad_lifetime=lifetime, **kw)


def test_micro_batch_program_text():
    # One stage, one block (units 0, 1, 2), one micro-batch, views resident: each backward's
    # reduce-scatter starts right after it and is waited after the next backward; a wait that
    # would land at the flush goes with its unit's update.
    plan = build_plan(1, 1, 2, 1, view_window=0, shard_state=True, clip=False,
                      grad_lifetime="micro-batch")
    assert format_program(plan.programs[0]) == (
        "P0 P1 P2 WP0 WP1 WP2 F0.0 F1.0 F2.0 B2.0 RS2.0 B1.0 RS1.0 WRS2.0 B0.0 RS0.0 "
        "U2 WRS1.0 U1 WRS0.0 U0 E")


def test_transient_moves_only_the_waits():
    step = _sharded(2, 2, 4, "step")
    transient = _sharded(2, 2, 4, "transient")
    for a, b in zip(step.programs, transient.programs):
        assert sorted(map(str, a)) == sorted(map(str, b))
    # one micro-batch per replica: each WGS right after the stage's next compute action
    one = _sharded(1, 2, 1, "transient").programs[0]
    for u in range(6):
        if u == 0:
            continue  # the last backward: its wait goes with the updates
        gs = one.index(Action(Op.GRAD_SYNC, u))
        wait = one.index(Action(Op.WAIT_GRAD_SYNC, u))
        computes = [i for i in range(gs, wait) if one[i].op in WEIGHT_GRAD_OPS]
        assert len(computes) == 1, format_program(one)


@pytest.mark.parametrize("pp,schedule,weight_grad", [
    (1, "1f1b", None), (2, "1f1b", None), (4, "1f1b", None), (2, "zbh1", "bubble"),
    (1, "zbh1", "grouped"), (2, "zbh1", "grouped")])
def test_micro_batch_reduces_each_backward_once_and_waits_before_the_next(pp, schedule,
                                                                          weight_grad):
    n_micro = 4
    plan = _sharded(pp, 2, n_micro, "micro-batch", n_layers=6, schedule=schedule,
                    weight_grad=weight_grad)
    plan.validate()
    for program, units in zip(plan.programs, plan.stage_units):
        assert not any(a.op is Op.GRAD_SYNC for a in program)
        for u in units:
            backwards = [i for i, a in enumerate(program)
                         if a.op in WEIGHT_GRAD_OPS and a.unit == u]
            assert len(backwards) == n_micro
            for i, nxt in zip(backwards, backwards[1:] + [None]):
                m = program[i].mb
                start = program.index(Action(Op.GRAD_REDUCE, u, m))
                wait = program.index(Action(Op.WAIT_GRAD_REDUCE, u, m))
                assert i < start < wait and (nxt is None or wait < nxt)
            assert program.index(Action(Op.UPDATE, u)) > wait


def test_a_dropped_reduction_is_caught():
    plan = _sharded(1, 2, 2, "micro-batch", n_layers=1)
    text = format_program(plan.programs[0])
    broken = text.replace(" RS1.1", "").replace(" WRS1.1", "")
    with pytest.raises(ScheduleError, match="reduces unit 1's gradient per micro-batch"):
        validate([parse_program(broken)], plan.stage_units, 2, 2)


def test_a_backward_before_the_previous_reduction_completes_is_caught():
    # one stage, grouped: unit-major, so unit 1's second backward follows its first reduction
    plan = _sharded(1, 2, 2, "micro-batch", n_layers=1, schedule="zbh1", weight_grad="grouped")
    text = format_program(plan.programs[0])
    assert "WRS1.0 B1.1" in text
    broken = text.replace("WRS1.0 B1.1", "B1.1 WRS1.0")
    with pytest.raises(ScheduleError, match=r"B1\.1 .*WRS1\.0|WRS1\.0.*B1\.1"):
        validate([parse_program(broken)], plan.stage_units, 2, 2)


def test_plan_field_round_trips_and_is_checked():
    plan = _sharded(2, 2, 4, "micro-batch")
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["grad_lifetime"] == "micro-batch"
    assert PipelinePlan.from_dict(d) == plan
    assert "grad_lifetime" not in _sharded(2, 2, 4, "step").to_dict()  # older readers
    d["grad_lifetime"] = "transient"  # the programs still reduce per micro-batch
    with pytest.raises(ScheduleError, match="do reduce each micro-batch's gradient"):
        PipelinePlan.from_dict(d).validate()


@pytest.mark.parametrize("change, needle", [
    (dict(grad_lifetime="transient"), "only sharded state does; add --shard-state"),
    (dict(grad_lifetime="micro-batch", shard_state=True, view_window=0, policy="baseline"),
     "is a lifecycle choice of --policy ratrain"),
])
def test_lifetime_refusals_are_one_line(change, needle):
    ok = dict(n_layers=2, pp=1, dp=2, global_batch=8, micro_batch_size=2)
    reason = runnable.refusal(**{**ok, **change})
    assert reason and needle in reason and "\n" not in reason
    with pytest.raises(UserError, match="^" + re.escape(reason) + "$"):
        runnable.check_runnable(**{**ok, **change})


def test_train_refuses_a_lifetime_without_sharded_state(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-progress", "--dp", "2",
                           "--grad-lifetime", "transient")
    assert code == 2 and "add --shard-state" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("n_micro", [1, 4])
def test_simulated_gradients_fall_with_the_lifetime(n_micro):
    """llama2-7b, dp=8, one stage: "step" holds every unit's full fp32 gradient; the shorter
    lifetimes a few at a time. With one micro-batch "transient" frees each after its sync;
    with four, the first micro-batch has made every full gradient before the last's backward,
    so only "micro-batch" holds less."""
    from ratrain.models.presets import get_preset

    model = get_preset("llama2-7b")
    held = {}
    for lifetime in ("step", "transient", "micro-batch"):
        plan = build_plan(model.n_layers, 1, 8, n_micro, view_window=1, shard_state=True,
                          grad_lifetime=lifetime, activation="recompute")
        result = simulate(plan, model, load_profile("mt3000"), seq_len=4096,
                          micro_batch_size=1, dtype="float16")
        held[lifetime] = result.ranks[0].at_peak["gradients"]
    full = 4 * 6.7e9  # every unit's full fp32 gradient; the shards are an eighth of it
    assert held["step"] > full * (1 + 1 / 8)
    assert held["micro-batch"] < full * (2 / 8 + 0.1)  # the shard, the reduction's output
    if n_micro == 1:
        assert held["transient"] < full * (1 / 8 + 0.1)
    else:
        assert held["transient"] > full


# --- hybrid sharding ----------------------------------------------------------------------------

@pytest.mark.parametrize("lifetime", ["step", "transient", "micro-batch"])
def test_hybrid_sums_each_shard_across_groups_after_its_last_sync(lifetime):
    plan = _sharded(2, 4, 4, lifetime, shard_group=2)
    plan.validate()
    final_wait = Op.WAIT_GRAD_REDUCE if lifetime == "micro-batch" else Op.WAIT_GRAD_SYNC
    for program, units in zip(plan.programs, plan.stage_units):
        norm = program.index(Action(Op.GRAD_NORM))
        for u in units:
            last = max(i for i, a in enumerate(program) if a.op is final_wait and a.unit == u)
            start = program.index(Action(Op.CROSS_SYNC, u))
            wait = program.index(Action(Op.WAIT_CROSS_SYNC, u))
            assert start == last + 1 and start < wait < norm


def test_hybrid_plan_round_trips_and_is_checked():
    plan = _sharded(1, 4, 2, "step", shard_group=2)
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["shard_group"] == 2 and PipelinePlan.from_dict(d) == plan
    assert "shard_group" not in _sharded(1, 4, 2, "step").to_dict()
    del d["shard_group"]  # the programs still sum across groups
    with pytest.raises(ScheduleError, match="do sum the shards across the groups"):
        PipelinePlan.from_dict(d).validate()
    text = format_program(plan.programs[0])
    broken = text.replace("GX1 ", "GX1 GX1 WGX1 ", 1)
    with pytest.raises(ScheduleError, match="starts GX1 2 times"):
        validate([parse_program(broken)], plan.stage_units, 2, 4)


@pytest.mark.parametrize("change, needle", [
    (dict(shard_group=2), "needs --shard-state"),
    (dict(shard_group=3, shard_state=True, view_window=0), "must divide --dp 4 into at least two"),
    (dict(shard_group=4, shard_state=True, view_window=0), "must divide --dp 4 into at least two"),
    (dict(shard_group=2, shard_state=True, view_window=0, policy="baseline"),
     "lifecycle choice of --policy ratrain"),
])
def test_hybrid_refusals_are_one_line(change, needle):
    ok = dict(n_layers=2, pp=1, dp=4, global_batch=8, micro_batch_size=2)
    reason = runnable.refusal(**{**ok, **change})
    assert reason and needle in reason and "\n" not in reason


def test_hybrid_shards_are_bigger_and_each_is_summed_across_groups():
    """llama2-7b, dp=16 on mt3000: sharded over a node's replicas the state per device is
    dp / shard_group times a full sharding's, and every unit's shard is all-reduced across the
    groups (GX) in the simulated step."""
    from ratrain.models.presets import get_preset

    model = get_preset("llama2-7b")
    profile = load_profile("mt3000")
    per_node = profile.devices_per_node
    results = {}
    for group in (None, per_node):
        plan = build_plan(model.n_layers, 1, 16, 1, view_window=1, shard_state=True,
                          activation="recompute", shard_group=group)
        results[group] = simulate(plan, model, profile, seq_len=4096, micro_batch_size=1,
                                  dtype="float16")
    whole, hybrid = (results[g].ranks[0].at_peak["masters"] for g in (None, per_node))
    assert hybrid == pytest.approx(whole * 16 / per_node, rel=0.01)
    spans = [name for name, *_ in results[per_node].ranks[0].spans if name.startswith("GX")]
    assert len(spans) == model.n_layers + 2
