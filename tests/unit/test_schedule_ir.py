"""The program IR's text form and the plan's serialized form round-trip exactly."""

import json

import pytest

from ratrain.schedule import Action, Op, PipelinePlan, build_plan, format_program, parse_program
from ratrain.schedule.ops import SPECS


def _example(op: Op) -> Action:
    spec = SPECS[op]
    return Action(op, 12 if spec.unit else None, 3 if spec.mb else None)


@pytest.mark.parametrize("op", list(Op))
def test_every_op_round_trips(op):
    a = _example(op)
    assert Action.parse(str(a)) == a
    assert str(Action.parse(str(a))) == str(a)


def test_every_op_has_a_spec():
    assert set(SPECS) == set(Op)
    assert all(SPECS[op].op is op for op in Op)


def test_text_form_examples():
    assert str(Action(Op.FORWARD, 3, 0)) == "F3.0"
    assert str(Action(Op.WAIT_RECV_GRAD, 10, 11)) == "WRG10.11"
    assert str(Action(Op.GRAD_SYNC, 3)) == "GS3"
    assert str(Action(Op.STEP_END)) == "E"
    assert Action.parse(" WSA4.1 ") == Action(Op.WAIT_SEND_ACT, 4, 1)


@pytest.mark.parametrize("text", [
    "", "F", "F3", "F.0", "Q3.0", "f3.0", "F3.0.1", "F-1.0", "E1", "N.0", "GS3.0", "U", "F3 .0",
])
def test_bad_text_raises(text):
    with pytest.raises(ValueError):
        Action.parse(text)


def test_bad_fields_raise():
    with pytest.raises(ValueError, match="takes a unit and a micro-batch"):
        Action(Op.FORWARD, 1)
    with pytest.raises(ValueError, match="no unit"):
        Action(Op.GRAD_NORM, 0)


def test_program_round_trips():
    program = [_example(op) for op in Op] + [Action(Op.FORWARD, 0, 0), Action(Op.STEP_END)]
    text = format_program(program)
    assert parse_program(text) == program
    assert format_program(parse_program(text)) == text
    assert parse_program("") == []
    with pytest.raises(ValueError):
        parse_program("F0.0 B0")


@pytest.mark.parametrize("kwargs", [
    dict(n_layers=4, pp=2, dp=2, n_micro=3, activation="recompute"),
    dict(n_layers=5, pp=3, dp=1, n_micro=4, schedule="gpipe", clip=False),
    dict(n_layers=3, pp=5, dp=1, n_micro=5),
    dict(n_layers=6, pp=3, dp=2, n_micro=6, units_per_stage=[2, 3, 3]),
    dict(n_layers=4, pp=2, dp=2, n_micro=4, schedule="zbh1", weight_grad="grouped"),
])
def test_plan_round_trips(kwargs):
    plan = build_plan(**kwargs)
    d = plan.to_dict()
    assert PipelinePlan.from_dict(d) == plan
    again = PipelinePlan.from_dict(json.loads(json.dumps(d)))
    assert again == plan
    assert again.to_dict() == d
    assert again.n_layers == kwargs["n_layers"]
    again.validate()


def test_every_op_has_a_handler_a_cost_and_a_rule_of_what_it_needs():
    """The three tables beside the registry cover every op (each also refuses to import
    otherwise), and nothing else lists ops: waits pair with their starts both ways."""
    from ratrain.runtime.handlers import HANDLERS
    from ratrain.schedule.needs import NEEDS
    from ratrain.sim.cost_model import DURATIONS

    for table in (HANDLERS, NEEDS, DURATIONS):
        assert set(table) == set(Op)
    for op, spec in SPECS.items():
        if spec.starts:
            assert SPECS[spec.waited_by].waits is op
        if spec.pairs_with:
            assert SPECS[spec.pairs_with].pairs_with is op
            assert SPECS[spec.pairs_with].sends != spec.sends
