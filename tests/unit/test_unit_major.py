"""The unit-major order (schedule/unit_major.py): its programs, how many views a window makes,
where gradients fold, the plan field's checks, and the executor's ledger against the
simulator's, kind by kind, with a run's gradient held on the device."""

from __future__ import annotations


import pytest

from ratrain.config import RunConfig
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.errors import ScheduleConfigError, ScheduleError
from ratrain.schedule.ir import Action, Op, format_program
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.schedule.unit_major import (FIRST, HOLD, LATER, SYNC, fold_roles, folds_a_step,
                                         views_made)

from .executor_ledger import assert_simulated_ledger_is, executor_ledger, small_model


def _compute(program):
    return format_program([a for a in program if a.op in (Op.FORWARD, Op.BACKWARD)])


def test_one_stage_runs_each_group_unit_by_unit():
    plan = build_plan(2, 1, 1, 4, micro_batch_group=2, activation="recompute")
    assert _compute(plan.programs[0]) == (
        "F0.0 F0.1 F1.0 F1.1 F2.0 F2.1 F3.0 F3.1 B3.0 B3.1 B2.0 B2.1 B1.0 B1.1 B0.0 B0.1 "
        "F0.2 F0.3 F1.2 F1.3 F2.2 F2.3 F3.2 F3.3 B3.2 B3.3 B2.2 B2.3 B1.2 B1.3 B0.2 B0.3")
    # each micro-batch's recompute right before its own backward: one recomputed at a time
    text = format_program(plan.programs[0])
    assert "R1.0 B1.0 R1.1 B1.1" in text


def test_a_pipeline_runs_1f1b_over_groups():
    plan = build_plan(2, 2, 1, 4, micro_batch_group=2)  # checked: dry run across the ranks
    assert _compute(plan.programs[0]) == (
        "F0.0 F0.1 F1.0 F1.1 F0.2 F0.3 F1.2 F1.3 B1.0 B1.1 B0.0 B0.1 B1.2 B1.3 B0.2 B0.3")
    assert _compute(plan.programs[1]) == (
        "F2.0 F2.1 F3.0 F3.1 B3.0 B3.1 B2.0 B2.1 F2.2 F2.3 F3.2 F3.3 B3.2 B3.3 B2.2 B2.3")
    assert plan.to_dict()["micro_batch_group"] == 2
    # a group's sends come in a burst: its receives are posted together (without that, groups
    # of 4 deadlock in the dry run that build_plan runs)
    four = build_plan(2, 2, 1, 8, micro_batch_group=4, activation=["offload", "keep"],
                      view_window=2, state_home="host")
    text = format_program(four.programs[1])
    assert "RA1.4 RA1.5 RA1.6 RA1.7" in text
    assert build_plan(2, 2, 1, 4, micro_batch_group=1).programs == build_plan(2, 2, 1, 4).programs


@pytest.mark.parametrize("m,g", [(4, 2), (4, 4), (16, 4), (16, 16)])
def test_views_and_folds_per_unit_fall_with_the_group(m, g):
    """llama2-7b's 34 units, one stage, window 1. A block's view is made 2m times a step
    under 1F1B (for each micro-batch's forward and backward) and 2m / g times in groups of g;
    the last block's and the head's forward and backward runs of a group meet, so theirs once
    per group. Each unit's gradient folds m times under 1F1B, m / g times in groups."""
    def counts(group):
        plan = build_plan(32, 1, 1, m, view_window=1, state_home="host",
                          activation="recompute", micro_batch_group=group)
        program = plan.programs[0]
        roles = fold_roles(program)
        folds = sum(1 for (u, _), r in roles.items() if u == 5 and r != HOLD)
        assert folds_a_step(program) == folds  # every unit alike: the most is any one's
        return views_made(program), folds

    views, folds = counts(g)
    base_views, base_folds = counts(1)
    assert base_views[5] == 2 * m and base_views[33] == m and base_folds == m
    assert views[5] == 2 * m // g and views[33] == m // g and folds == m // g
    assert sum(views.values()) == (sum(base_views.values()) - 2) // g + 2  # 258 -> 66 at m = g = 4


def test_fold_roles_hold_within_a_run_and_fold_at_its_end():
    program = build_plan(2, 1, 1, 4, micro_batch_group=2).programs[0]
    roles = fold_roles(program)
    assert [roles[(2, mb)] for mb in range(4)] == [HOLD, FIRST, HOLD, LATER]
    # under 1F1B each backward is a run's last: every one folds, micro-batch 0's first
    roles = fold_roles(build_plan(2, 1, 1, 4).programs[0])
    assert [roles[(2, mb)] for mb in range(4)] == [FIRST, LATER, LATER, LATER]


def test_groups_that_cannot_run_are_refused_in_one_line():
    with pytest.raises(ScheduleConfigError, match="must divide the 4 micro-batches"):
        build_plan(2, 1, 1, 4, micro_batch_group=3)
    with pytest.raises(ScheduleConfigError, match="runs 1F1B over groups"):
        build_plan(2, 2, 1, 4, micro_batch_group=2, schedule="zbh1")
    with pytest.raises(ScheduleConfigError, match=">= 1"):
        build_plan(2, 1, 1, 4, micro_batch_group=0)
    # a plan file that claims groups its programs do not run
    data = build_plan(2, 1, 1, 4).to_dict()
    data["micro_batch_group"] = 2
    with pytest.raises(ScheduleError, match="not in the unit-major order"):
        PipelinePlan.from_dict(data).validate()


def test_the_cli_refuses_a_group_that_does_not_divide(monkeypatch, capsys):
    from .cli_runner import run_cli

    code, _, err = run_cli(monkeypatch, capsys, "plan", "--global-batch", "4",
                           "--micro-batch-size", "1", "--micro-batch-group", "3")
    assert code == 2 and "--micro-batch-group 3 must divide" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("activation", ["keep", "recompute", "offload"])
def test_the_executors_ledger_is_the_simulators_with_groups(activation, monkeypatch):
    """Host-homed state behind a host link (the executor's GPU path, run here on the CPU):
    each run's fp32 gradient is held on the device between its backwards; the simulator,
    on a profile with a host link, holds the same bytes at the same actions."""
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    cfg = RunConfig(model=small_model())
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    plan = build_plan(2, 1, 1, 4, activation=activation, view_window=1, state_home="host",
                      micro_batch_group=2)
    held: set = set()
    measured = executor_ledger(cfg, plan, held)
    assert held == {("rungrad", u) for u in range(4)}
    assert_simulated_ledger_is(measured, plan, cfg)
    costs_hold = [a for a in plan.programs[0] if a.op is Op.BACKWARD
                  and fold_roles(plan.programs[0])[(a.unit, a.mb)] == HOLD]
    assert Action(Op.BACKWARD, 3, 0) in costs_hold


def test_summed_on_the_device_each_host_units_run_waits_for_its_sync():
    """device_grad_sum: the last backward of each host-homed unit's one run leaves the sum to
    the sync (SYNC), a device unit folds as before; refused where a unit's backwards of the
    step are not one run (a plan file's claim too)."""
    plan = build_plan(2, 1, 2, 2, micro_batch_group=2, view_window=1, state_home="host",
                      device_units=(0,), device_grad_sum=True)
    assert plan.summed_on_device == {1, 2, 3}
    roles = fold_roles(plan.programs[0], plan.summed_on_device)
    assert roles == {(3, 0): HOLD, (3, 1): SYNC, (2, 0): HOLD, (2, 1): SYNC,
                     (1, 0): HOLD, (1, 1): SYNC, (0, 0): HOLD, (0, 1): FIRST}
    assert folds_a_step(plan.programs[0], plan.summed_on_device) == 1
    assert PipelinePlan.from_dict(plan.to_dict()).device_grad_sum
    with pytest.raises(ScheduleConfigError, match="--micro-batch-group 2"):
        build_plan(2, 1, 2, 2, view_window=1, state_home="host", device_grad_sum=True)
    data = build_plan(2, 1, 2, 2, view_window=1, state_home="host").to_dict()
    data.update(device_grad_sum=True, micro_batch_group=2)  # a claim its programs break
    with pytest.raises(ScheduleError, match="not in the unit-major order"):
        PipelinePlan.from_dict(data).validate()
