"""Tied embeddings with a view window: the head computes with the embedding's view, so the view
pass keeps that view from its first use to the head's last, the checks hold a plan to it, a
plan file says it, and the executor's ledger is the simulator's."""

from __future__ import annotations

import json

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.schedule.checks import validate
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ir import format_program, parse_program
from ratrain.schedule.ops import COMPUTE_OPS, Op
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.schedule.view_checks import check_shared_gradients
from ratrain.setup.plan_file import load_plan

from .executor_ledger import assert_simulated_ledger_is, executor_ledger, small_model


def _live_views(program):
    """For each action, the units whose views are live (or pending) just before it."""
    live, out = set(), []
    for a in program:
        out.append(set(live))
        if a.op is Op.PREFETCH:
            live.add(a.unit)
        elif a.op is Op.RELEASE:
            live.discard(a.unit)
    return out


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("kw", [dict(), dict(micro_batch_group=2, activation="recompute"),
                                dict(schedule="zbh1"), dict(update="carried", state_home="host")],
                         ids=["1f1b", "groups", "zbh1", "carried"])
def test_the_head_computes_while_the_embeddings_view_is_live(window, kw):
    plan = build_plan(2, 1, 1, 4, view_window=window, tie_embeddings=True, **kw)
    untied = build_plan(2, 1, 1, 4, view_window=window, **kw)
    program, head = plan.programs[0], 3
    live = _live_views(program)
    heads = [i for i, a in enumerate(program) if a.op in COMPUTE_OPS and a.unit == head]
    assert heads and all(0 in live[i] for i in heads)
    # one view more than the window allows, at most: the embedding's, held
    assert max(len(v) for v in live) <= window + 2
    # the embedding's view is made once a step and released after the head's last run
    assert [a.op for a in program if a.unit == 0 and a.op in (Op.PREFETCH, Op.RELEASE)] \
        == [Op.PREFETCH, Op.RELEASE]
    last_of = {a.unit: i for i, a in enumerate(program) if a.op in COMPUTE_OPS}
    release = program.index(next(a for a in program if a.op is Op.RELEASE and a.unit == 0))
    assert release > max(last_of[0], last_of[head])
    # without the tie, the same compute, and unit 0's view released between its runs
    assert [a for a in untied.programs[0] if a.op in COMPUTE_OPS] == \
        [a for a in program if a.op in COMPUTE_OPS]
    assert sum(a.op is Op.RELEASE and a.unit == 0 for a in untied.programs[0]) > 1


def test_the_checks_catch_a_head_without_the_embeddings_view():
    untied = build_plan(1, 1, 1, 2, view_window=1, clip=False)
    with pytest.raises(ScheduleError, match=r"F2.0 computes with unit 0's view too, but it is "
                                            r"released \(X0 at step \d+\)"):
        validate(untied.programs, untied.stage_units, 2, 1, shared={2: 0})
    # the head's weight gradient after unit 0's, which folds it: legal for any other weight
    late = parse_program("F0.0 F1.0 F2.0 BI2.0 BI1.0 BW1.0 BI0.0 BW0.0 BW2.0 E")
    check_shared_gradients([late], {})
    with pytest.raises(ScheduleError, match=r"BW2.0 leaves a gradient on unit 0's weight after "
                                            r"that unit's last backward \(BW0.0\)"):
        check_shared_gradients([late], {2: 0})


def test_a_tied_plan_round_trips_and_an_untied_one_reads_as_before():
    plan = build_plan(2, 1, 1, 4, view_window=1, tie_embeddings=True)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["tie_embeddings"] is True
    back = PipelinePlan.from_dict(data)
    assert back.tie_embeddings and back.shared_views == {3: 0}
    assert [format_program(p) for p in back.programs] == data["programs"]
    back.validate()
    assert "tie_embeddings" not in build_plan(2, 1, 1, 4, view_window=1).to_dict()


def test_a_plan_file_made_for_untied_embeddings_is_refused_for_a_tied_model(tmp_path):
    cfg = RunConfig(model=small_model())
    cfg.model.tie_embeddings = True
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    path = tmp_path / "plan.json"
    cfg.parallel.plan_file = str(path)
    for tied, window in ((False, 1), (True, 1), (False, 0)):
        path.write_text(json.dumps(build_plan(2, 1, 1, 4, view_window=window,
                                              tie_embeddings=tied).to_dict()))
        if tied or not window:  # resident views keep the embedding's for the head anyway
            assert load_plan(cfg).view_window == window
        else:
            with pytest.raises(UserError, match=r"tie_embeddings=False \(run has True\)"):
                load_plan(cfg)


def test_the_executors_ledger_is_the_simulators_with_a_tied_head():
    """The held embedding view is in both ledgers at the same actions (on the CPU)."""
    cfg = RunConfig(model=small_model())
    cfg.model.tie_embeddings = True
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    plan = build_plan(2, 1, 1, 4, activation="recompute", view_window=1, state_home="host",
                      tie_embeddings=True)
    assert_simulated_ledger_is(executor_ledger(cfg, plan, set()), plan, cfg)
