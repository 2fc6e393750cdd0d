"""Builders, passes and plans: schedule shapes, placement rules, and every built plan passes the
checks over a grid of pipeline depths, micro-batch counts and model depths."""

import itertools

import pytest

from ratrain.errors import UserError
from ratrain.schedule import (
    Action, Op, ScheduleConfigError, ScheduleError, build_eval_programs, build_plan,
    format_program, forward_only, gpipe, one_f_one_b, partition_units, validate,
)

STAGES = range(1, 9)


def _grid(p):
    """(n_micro, n_layers) pairs for p stages."""
    return [(n, layers) for n in sorted({p, p + 1, 2 * p, 3 * p + 1})
            for layers in sorted({p, p + 3, 2 * p + 5})]


def _microbatch_steps(program, units):
    """The program's compute as whole-micro-batch steps [("F", m) | ("B", m)], checking that a
    forward runs the stage's units in increasing order and a backward in decreasing order."""
    compute = [a for a in program if a.op in (Op.FORWARD, Op.BACKWARD)]
    steps = []
    for i in range(0, len(compute), len(units)):
        chunk = compute[i:i + len(units)]
        op, m = chunk[0].op, chunk[0].mb
        order = units if op is Op.FORWARD else reversed(units)
        assert chunk == [Action(op, u, m) for u in order], chunk
        steps.append((op.value, m))
    return steps


def _assert_1f1b(programs, stage_units, n):
    p = len(stage_units)
    for s, (program, units) in enumerate(zip(programs, stage_units)):
        steps = _microbatch_steps(program, units)
        warmup = min(p - s - 1, n)
        steady = [x for m in range(n - warmup) for x in (("F", m + warmup), ("B", m))]
        assert steps == ([("F", m) for m in range(warmup)] + steady
                         + [("B", m) for m in range(n - warmup, n)])
        in_flight = peak = 0
        for op, _ in steps:
            in_flight += 1 if op == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(p - s, n) and in_flight == 0


# --- partition ---------------------------------------------------------------------------------

def test_partition_examples():
    assert partition_units(4, 1) == [range(0, 6)]
    assert partition_units(4, 2) == [range(0, 3), range(3, 6)]
    assert partition_units(5, 2) == [range(0, 4), range(4, 7)]  # remainder to the earliest
    assert partition_units(5, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert partition_units(3, 4) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert partition_units(2, 4) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    assert partition_units(6, 3, [2, 3, 3]) == [range(0, 2), range(2, 5), range(5, 8)]


@pytest.mark.parametrize("n_layers", range(1, 13))
def test_partition_default_is_balanced(n_layers):
    for pp in range(1, n_layers + 3):
        stages = partition_units(n_layers, pp)
        assert len(stages) == pp and stages[0].start == 0 and stages[-1].stop == n_layers + 2
        assert all(len(r) >= 1 and r.stop == nxt.start for r, nxt in zip(stages, stages[1:]))
        blocks = [len(set(r) & set(range(1, n_layers + 1))) for r in stages]
        if pp < n_layers + 2:
            assert max(blocks) - min(blocks) <= 1
            assert blocks == sorted(blocks, reverse=True)


@pytest.mark.parametrize("args, message", [
    ((2, 5), "pp=5 is more stages than the model has units"),
    ((4, 0), "pp must be >= 1"),
    ((0, 1), "n_layers must be >= 1"),
    ((4, 2, [3, 2]), "sums to 5"),
    ((4, 2, [6, 0]), "at least one unit"),
    ((4, 2, [2, 2, 2]), "has 3 entries for pp=2"),
])
def test_bad_partitions_rejected(args, message):
    with pytest.raises(ScheduleConfigError, match=message) as info:
        partition_units(*args)
    assert isinstance(info.value, UserError)  # the CLI exits with code 2


# --- builders ----------------------------------------------------------------------------------

@pytest.mark.parametrize("p", STAGES)
def test_one_f_one_b_shape(p):
    for n, layers in _grid(p):
        stage_units = partition_units(layers, p)
        _assert_1f1b(one_f_one_b(stage_units, n), stage_units, n)


def test_one_f_one_b_example():
    stage_units = [range(0, 1), range(1, 2), range(2, 3)]
    assert [format_program(prog) for prog in one_f_one_b(stage_units, 3)] == [
        "F0.0 F0.1 F0.2 B0.0 B0.1 B0.2",
        "F1.0 F1.1 B1.0 F1.2 B1.1 B1.2",
        "F2.0 B2.0 F2.1 B2.1 F2.2 B2.2",
    ]


def test_gpipe_and_forward_only_shape():
    stage_units = partition_units(5, 3)
    for program, units in zip(gpipe(stage_units, 4), stage_units):
        assert _microbatch_steps(program, units) == (
            [("F", m) for m in range(4)] + [("B", m) for m in range(4)])
    for program, units in zip(forward_only(stage_units, 4), stage_units):
        assert _microbatch_steps(program, units) == [("F", m) for m in range(4)]


# --- plans -------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", STAGES)
def test_every_plan_passes_checks(p):
    for n, layers in _grid(p):
        for schedule in ("1f1b", "gpipe"):
            for activation in ("keep", "recompute"):
                for policy in ("ratrain", "baseline"):
                    plan = build_plan(layers, p, 2, n, schedule=schedule, activation=activation,
                                      policy=policy)
                    if schedule == "1f1b":
                        _assert_1f1b(plan.programs, plan.stage_units, n)
        eval_programs = build_eval_programs(partition_units(layers, p), n)
        validate(eval_programs, partition_units(layers, p), n, 1, forward_only=True)


@pytest.mark.parametrize("p", STAGES)
def test_every_dp_and_clip_variant_passes_checks(p):
    for n in (p, p + 1):
        for schedule in ("1f1b", "gpipe"):
            for activation in ("keep", "recompute"):
                for dp, clip, policy in itertools.product((1, 2), (False, True),
                                                          ("ratrain", "baseline")):
                    plan = build_plan(p + 3, p, dp, n, schedule=schedule,
                                      activation=activation, clip=clip, policy=policy)
                    validate(plan.programs, plan.stage_units, n, dp)
                    for program in plan.programs:
                        assert (Action(Op.GRAD_NORM) in program) == clip
                        assert (Action(Op.WAIT_GRAD_NORM) in program) == clip
                        assert any(a.op is Op.GRAD_SYNC for a in program) == (dp > 1)


def test_baseline_program_text():
    """The placement rules, spelled out on the smallest interesting plan: every sync at the
    flush, then the norm, then every update."""
    plan = build_plan(2, 2, 2, 2, policy="baseline")
    assert [format_program(prog) for prog in plan.programs] == [
        "RG1.0 F0.0 F1.0 SA1.0 F0.1 F1.1 SA1.1 WSA1.0 WRG1.0 RG1.1 B1.0 B0.0 WRG1.1 B1.1 B0.1 "
        "GS1 GS0 WGS1 WGS0 WSA1.1 N WN U0 U1 E",
        "RA1.0 WRA1.0 RA1.1 F2.0 F3.0 B3.0 B2.0 SG1.0 WRA1.1 F2.1 F3.1 B3.1 B2.1 SG1.1 "
        "GS3 GS2 WGS3 WGS2 WSG1.0 WSG1.1 N WN U2 U3 E",
    ]


_RATRAIN_HEAD = [
    "RG1.0 F0.0 F1.0 SA1.0 F0.1 F1.1 SA1.1 WSA1.0 WRG1.0 RG1.1 B1.0 B0.0 WRG1.1 B1.1 ",
    "RA1.0 WRA1.0 RA1.1 F2.0 F3.0 B3.0 B2.0 SG1.0 WRA1.1 F2.1 F3.1 B3.1 ",
]


@pytest.mark.parametrize("dp, clip, tails", [
    # Each unit's sync starts right after its last backward (after the gradient send that
    # backward triggers); the waits follow at the flush in the order the syncs started.
    (2, False, ["GS1 B0.1 GS0 WGS1 U1 WGS0 U0 WSA1.1 E",
                "GS3 B2.1 SG1.1 GS2 WGS3 U3 WGS2 U2 WSG1.0 WSG1.1 E"]),
    (2, True, ["GS1 B0.1 GS0 WGS1 WGS0 N WN U1 U0 WSA1.1 E",
               "GS3 B2.1 SG1.1 GS2 WGS3 WGS2 N WN U3 U2 WSG1.0 WSG1.1 E"]),
    # dp = 1: updates at the flush, never in front of the gradient send stage 0 waits for.
    (1, False, ["B0.1 U1 U0 WSA1.1 E", "B2.1 SG1.1 U3 U2 WSG1.0 WSG1.1 E"]),
    (1, True, ["B0.1 N WN U1 U0 WSA1.1 E", "B2.1 SG1.1 N WN U3 U2 WSG1.0 WSG1.1 E"]),
])
def test_ratrain_program_text(dp, clip, tails):
    plan = build_plan(2, 2, dp, 2, policy="ratrain", clip=clip)
    assert [format_program(prog) for prog in plan.programs] == [
        head + tail for head, tail in zip(_RATRAIN_HEAD, tails)]


@pytest.mark.parametrize("p, dp", [(1, 2), (3, 2), (4, 3)])
def test_ratrain_sync_starts_after_last_backward_and_overlaps_later_backwards(p, dp):
    """Every GS u directly follows B u of the last micro-batch (or the gradient send it
    triggers), and on every stage with more than one unit some backward runs while a sync is
    in flight; the baseline starts none before the last backward."""
    plan = build_plan(6, p, dp, 2 * p, policy="ratrain")
    for program, units in zip(plan.programs, plan.stage_units):
        for u in units:
            i = program.index(Action(Op.GRAD_SYNC, u))
            last_b = max(j for j, a in enumerate(program) if a.op is Op.BACKWARD and a.unit == u)
            assert all(a.op in (Op.SEND_GRAD, Op.GRAD_SYNC) for a in program[last_b + 1:i])
        first_sync = min(i for i, a in enumerate(program) if a.op is Op.GRAD_SYNC)
        assert any(a.op is Op.BACKWARD for a in program[first_sync:]) == (len(units) > 1)
    for program in build_plan(6, p, dp, 2 * p, policy="baseline").programs:
        first_sync = min(i for i, a in enumerate(program) if a.op is Op.GRAD_SYNC)
        assert not any(a.op is Op.BACKWARD for a in program[first_sync:])


def test_rank_order_is_recorded_and_checked():
    assert build_plan(2, 2, 2, 2, rank_order="dp-pp").rank_order == "dp-pp"
    with pytest.raises(ScheduleConfigError, match="unknown rank order 'rows'"):
        build_plan(2, 2, 2, 2, rank_order="rows")


def test_recompute_precedes_backward_and_overlaps_gradient_receive():
    plan = build_plan(4, 2, 1, 3, activation="recompute")
    for program in plan.programs:
        for i, a in enumerate(program):
            if a.op is Op.RECOMPUTE:
                assert 1 <= a.unit <= 4  # decoder blocks only
                rest = program[i + 1:]
                b = rest.index(Action(Op.BACKWARD, a.unit, a.mb))
                assert {x.op for x in rest[:b]} <= {Op.WAIT_RECV_GRAD, Op.RECV_GRAD}
    assert sum(a.op is Op.RECOMPUTE for prog in plan.programs for a in prog) == 4 * 3
    head, embedding = 5, 0
    assert all(a.unit not in (head, embedding) for prog in plan.programs for a in prog
               if a.op is Op.RECOMPUTE)


def test_n_micro_below_pp_rejected():
    with pytest.raises(ScheduleConfigError) as info:
        build_plan(8, 4, 1, 2)
    assert str(info.value) == (
        "n_micro=2 is fewer than pp=4 stages: 1F1B needs at least as many micro-batches as "
        "stages; raise global_batch or lower micro_batch_size/dp")


@pytest.mark.parametrize("kwargs, message", [
    (dict(schedule="interleaved"), "unknown schedule 'interleaved'; choose one of 1f1b, gpipe"),
    (dict(policy="magic"), "unknown policy 'magic'"),
    (dict(activation="swap"), "unknown activation policy 'swap'; choose one of keep, recompute, "
                              "offload"),
    (dict(dp=0), "dp must be >= 1"),
    (dict(units_per_stage=[1, 1]), "sums to 2"),
])
def test_bad_plan_requests_rejected(kwargs, message):
    args = dict(n_layers=4, pp=2, dp=1, n_micro=2) | kwargs
    with pytest.raises(ScheduleConfigError, match=message):
        build_plan(**args)


def test_eval_programs_are_forward_only():
    programs = build_eval_programs(partition_units(4, 3), 3)
    allowed = {Op.FORWARD, Op.SEND_ACT, Op.WAIT_SEND_ACT, Op.RECV_ACT, Op.WAIT_RECV_ACT,
               Op.STEP_END}
    assert all(a.op in allowed for prog in programs for a in prog)
    assert all(prog[-1] == Action(Op.STEP_END) for prog in programs)
    with pytest.raises(ScheduleError):  # a training check wants backwards
        validate(programs, partition_units(4, 3), 3, 1)
