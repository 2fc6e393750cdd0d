"""Activation recovery (keep / recompute / offload) and parameter views (window None / 0 / K):
placement on small programs spelled out by hand, properties over many layouts, broken programs
caught, and the plan's new fields."""

import itertools
import json

import pytest

from ratrain.schedule import (
    Action, Op, PipelinePlan, ScheduleConfigError, ScheduleError, build_eval_programs,
    build_plan, format_program, parse_program, partition_units, validate,
)
from ratrain.schedule.view_checks import check_views
from ratrain.schedule.passes import add_activation_policy
from ratrain.schedule.view_passes import add_views

COMPUTE = (Op.FORWARD, Op.RECOMPUTE, Op.BACKWARD)


def _text(programs):
    return [format_program(p) for p in programs]


# --- exact placement ---------------------------------------------------------------------------

def test_offload_program_text():
    # One stage, units 0 (embedding), 1 (the only block, offloaded), 2 (head); 1F1B on one stage
    # is forward then backward of each micro-batch: F0 F1 F2 B2 B1 B0. O1.m right after F1.m;
    # the compute action before B1.m is B2.m, so L1.m goes right before B2.m (the reload
    # overlaps the head's backward) and WL1.m right before B1.m. The updates follow at the
    # flush in the order the gradients became final (2, 1, 0).
    plan = build_plan(1, 1, 1, 2, activation="offload", clip=False)
    assert _text(plan.programs) == [
        "F0.0 F1.0 O1.0 F2.0 L1.0 B2.0 WL1.0 B1.0 B0.0 "
        "F0.1 F1.1 O1.1 F2.1 L1.1 B2.1 WL1.1 B1.1 B0.1 U2 U1 U0 E"]
    assert plan.activation == [["keep", "offload", "keep"]]


@pytest.mark.parametrize("policy, text", [
    # Both offloaded: B1's preceding compute action is its own F1, so L1 cannot go before it
    # (O1 is not issued yet) and follows O1; B0's preceding compute action is B1.
    ({0: "offload", 1: "offload"}, "F0.0 O0.0 F1.0 O1.0 L1.0 L0.0 WL1.0 B1.0 WL0.0 B0.0"),
    # Unit 1 recomputed, unit 0 offloaded: R1 stays in front of L0, so L0 runs ahead of one
    # compute action (B1) only.
    ({0: "offload", 1: "recompute"}, "F0.0 O0.0 F1.0 R1.0 L0.0 B1.0 WL0.0 B0.0"),
    ({}, "F0.0 F1.0 B1.0 B0.0"),
])
def test_activation_policy_pass_on_a_hand_program(policy, text):
    program = parse_program("F0.0 F1.0 B1.0 B0.0")
    assert _text(add_activation_policy([program], policy)) == [text]
    assert format_program(program) == "F0.0 F1.0 B1.0 B0.0"  # input untouched


def test_window_1_program_text():
    # One stage with units 0, 1, 2 and 2 micro-batches. The compute actions in runs of one unit:
    #   r0 F0.0 | r1 F1.0 | r2 F2.0 B2.0 | r3 B1.0 | r4 B0.0 F0.1 | r5 F1.1 | r6 F2.1 B2.1
    #   r7 B1.1 | r8 B0.1
    # Window 1: a unit running again within 2 runs keeps its view: unit 1 (r1, r3, r5, r7) is
    # never released until after r7; units 0 (r0, r4, r8) and 2 (r2, r6) are prefetched afresh
    # each time. P of run r goes after run r - 2: P0 (r0) and P1 (r1) at the start, P2 (r2)
    # after r0, P0 (r4) after r2, P2 (r6) after r4, P0 (r8) after r6; each WP right before its
    # run; each X right after its run, before the P placed at the same point; all released
    # before the updates.
    plan = build_plan(1, 1, 1, 2, clip=False, view_window=1)
    assert _text(plan.programs) == [
        "P0 P1 WP0 F0.0 X0 P2 WP1 F1.0 WP2 F2.0 B2.0 X2 P0 B1.0 WP0 B0.0 F0.1 X0 P2 F1.1 "
        "WP2 F2.1 B2.1 X2 P0 B1.1 X1 WP0 B0.1 X0 U2 U1 U0 E"]
    assert plan.view_window == 1


def test_window_0_program_text():
    # Views resident: every unit's P, then every WP, in the order of first use, at the very
    # start; never released. The rest is the plain ratrain program (test_ratrain_program_text).
    plan = build_plan(2, 2, 1, 2, clip=False, view_window=0)
    assert _text(plan.programs) == [
        "P0 P1 WP0 WP1 RG1.0 F0.0 F1.0 SA1.0 F0.1 F1.1 SA1.1 WSA1.0 WRG1.0 RG1.1 B1.0 B0.0 "
        "WRG1.1 B1.1 B0.1 U1 U0 WSA1.1 E",
        "P2 P3 WP2 WP3 RA1.0 WRA1.0 RA1.1 F2.0 F3.0 B3.0 B2.0 SG1.0 WRA1.1 F2.1 F3.1 B3.1 B2.1 "
        "SG1.1 U3 U2 WSG1.0 WSG1.1 E",
    ]


def test_window_none_adds_nothing():
    assert build_plan(3, 2, 2, 3, view_window=None).programs == build_plan(3, 2, 2, 3).programs
    assert not any(a.op in (Op.PREFETCH, Op.WAIT_PREFETCH, Op.RELEASE)
                   for p in build_plan(3, 2, 2, 3).programs for a in p)


def test_eval_window_1_program_text():
    # Forward only, units 0, 1 on one stage, 2 micro-batches: runs F0.0 | F1.0 | F0.1 | F1.1;
    # each unit runs again two runs later, within the window's 1 + 1, so both views stay live.
    programs = build_eval_programs([range(0, 2)], 2, view_window=1)
    assert _text(programs) == ["P0 P1 WP0 F0.0 WP1 F1.0 F0.1 X0 F1.1 X1 E"]


# --- properties over many layouts --------------------------------------------------------------

def _view_walk(program):
    """(peak number of views prefetched and not yet released, units still holding a view at the
    first U or E, compute actions whose unit had prefetched views but none waited for and
    unreleased at that point)."""
    viewed = {a.unit for a in program if a.op is Op.PREFETCH}
    held, ready, peak, bad, at_end = set(), set(), 0, [], None
    for a in program:
        if a.op in (Op.UPDATE, Op.STEP_END) and at_end is None:
            at_end = set(held)
        if a.op is Op.PREFETCH:
            held.add(a.unit)
        elif a.op is Op.WAIT_PREFETCH:
            ready.add(a.unit)
        elif a.op is Op.RELEASE:
            held.discard(a.unit)
            ready.discard(a.unit)
        elif a.op in COMPUTE and a.unit in viewed and a.unit not in ready:
            bad.append(a)
        peak = max(peak, len(held))
    return peak, at_end, bad


def _compute(program):
    return [a for a in program if a.op in COMPUTE]


def _check_lifecycle(program, units, window, policy):
    compute = _compute(program)
    peak, at_end, bad = _view_walk(program)
    assert not bad
    if window is None:
        assert peak == 0
    elif window == 0:
        n = len(units)
        assert [a.op for a in program[:2 * n]] == [Op.PREFETCH] * n + [Op.WAIT_PREFETCH] * n
        assert {a.unit for a in program[:2 * n]} == set(units)
        assert at_end == set(units) and Action(Op.RELEASE, units[0]) not in program
    else:
        assert 1 <= peak <= window + 1
        assert at_end == set()
    for i, a in enumerate(program):
        if a.op is Op.SEND_ACT:  # the activation send stays right after its forward
            assert program[i - 1] == Action(Op.FORWARD, a.unit, a.mb)
        if a.op is Op.OFFLOAD:
            f = program.index(Action(Op.FORWARD, a.unit, a.mb))
            assert {x.op for x in program[f + 1:i]} <= {Op.SEND_ACT}  # in front of any wait
            load = program.index(Action(Op.RELOAD, a.unit, a.mb))
            b = program.index(Action(Op.BACKWARD, a.unit, a.mb))
            assert i < load < program.index(Action(Op.WAIT_RELOAD, a.unit, a.mb)) < b
            assert len(_compute(program[load:b])) <= 1  # L runs ahead of one compute action
    for op, choice in ((Op.OFFLOAD, "offload"), (Op.RECOMPUTE, "recompute")):
        assert {(a.unit, a.mb) for a in program if a.op is op} == {
            (a.unit, a.mb) for a in compute if a.op is Op.FORWARD and policy[a.unit] == choice}


def _activations(pp, n_layers):
    """(activation, unit_activation) cases: uniform, per stage, and per-unit overrides."""
    per_stage = [("offload", "recompute", "keep")[s % 3] for s in range(pp)]
    return [("keep", None), ("recompute", None), ("offload", None), (per_stage, None),
            (per_stage[::-1], None), ("recompute", {0: "offload", n_layers + 1: "offload"})]


def _without_lifecycle(activation):
    """The same activation choice with offload replaced by keep (recompute stays: R is
    compute)."""
    swap = {"offload": "keep"}
    if activation is None or isinstance(activation, dict):
        return activation and {u: swap.get(c, c) for u, c in activation.items()}
    if isinstance(activation, str):
        return swap.get(activation, activation)
    return [swap.get(c, c) for c in activation]


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
def test_lifecycle_properties_over_layouts(pp):
    built = 0
    for n_layers in sorted({pp + 3, max(1, pp - 2)}):
        stage_units = partition_units(n_layers, pp)
        for n_micro in range(pp, pp + 4):
            for (activation, unit_activation), policy, (dp, clip, schedule) in itertools.product(
                    _activations(pp, n_layers), ("ratrain", "baseline"),
                    ((1, True, "1f1b"), (2, False, "1f1b"), (2, True, "gpipe"))):
                args = dict(n_layers=n_layers, pp=pp, dp=dp, n_micro=n_micro, schedule=schedule,
                            policy=policy, clip=clip)
                reference = None  # the same plan without offload or views, built once
                for window in (None, 0, 1, 2, 3):
                    try:
                        plan = build_plan(**args, activation=activation,
                                          unit_activation=unit_activation, view_window=window)
                    except ScheduleConfigError as e:
                        assert policy == "baseline", e
                        continue
                    built += 1  # build_plan validated it
                    reference = reference or build_plan(
                        **args, activation=_without_lifecycle(activation),
                        unit_activation=_without_lifecycle(unit_activation))
                    for program, ref, units in zip(plan.programs, reference.programs, stage_units):
                        assert _compute(program) == _compute(ref)
                        _check_lifecycle(program, units, window, plan.unit_activation)
            for window in (None, 0, 1, 2, 3):
                programs = build_eval_programs(stage_units, n_micro, view_window=window)
                for program, units in zip(programs, stage_units):
                    _check_lifecycle(program, units, window, {u: "keep" for u in units})
    assert built > 100


def test_baseline_and_ratrain_refuse_or_build_as_documented():
    # baseline builds only uniform activation and resident (or no) views; ratrain builds all.
    for window in (None, 0, 1):
        for activation in ("offload", ["offload", "offload"], ["offload", "keep"]):
            build_plan(4, 2, 1, 2, policy="ratrain", activation=activation, view_window=window)
            uniform = activation == "offload" or len(set(activation)) == 1
            if uniform and window in (None, 0):
                build_plan(4, 2, 1, 2, policy="baseline", activation=activation,
                           view_window=window)
            else:
                with pytest.raises(ScheduleConfigError):
                    build_plan(4, 2, 1, 2, policy="baseline", activation=activation,
                               view_window=window)


# --- plan requests and the plan's fields -------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(activation=["keep", "recompute"], policy="baseline"),
     "baseline takes one activation policy .*use --policy ratrain for per-stage choices"),
    (dict(unit_activation={1: "offload"}, policy="baseline"),
     "baseline takes one activation policy"),
    (dict(unit_activation={0: "recompute"}, activation="recompute", policy="baseline"),
     "baseline takes one activation policy"),
    (dict(view_window=1, policy="baseline"),
     "baseline keeps parameter views resident .*--view-window needs --policy ratrain"),
    (dict(view_window=-1), "view_window must be >= 0"),
    (dict(view_window=-1, policy="baseline"), "view_window must be >= 0"),
    (dict(activation=["keep", "keep", "keep"]), "has 3 entries for pp=2"),
    (dict(activation=["keep"]), "has 1 entries for pp=2"),
    (dict(activation=["keep", "swap"]), "unknown activation policy 'swap'"),
    (dict(unit_activation={6: "keep"}), "unit_activation names unit 6, .* units 0..5"),
    (dict(unit_activation={2: "swap"}), "unknown activation policy 'swap'"),
    (dict(state_home="disk"), "unknown state home 'disk'; choose one of device, host"),
    (dict(shard_state=True, view_window=0), "--dp 1 has none to split over"),
    (dict(shard_state=True, dp=2, view_window=0, state_home="host"), "cannot be combined with --state-home host"),
    (dict(shard_state=True, dp=2), "needs compute views .* not None"),
])
def test_bad_lifecycle_requests_rejected(kwargs, message):
    with pytest.raises(ScheduleConfigError, match=message):
        build_plan(**(dict(n_layers=4, pp=2, dp=1, n_micro=2) | kwargs))


def test_activation_resolution():
    # 4 blocks on 2 stages: stage 0 = units 0 (embedding), 1, 2; stage 1 = 3, 4, 5 (head).
    plan = build_plan(4, 2, 1, 2, activation=["offload", "recompute"],
                      unit_activation={5: "offload"})
    assert plan.activation == [["keep", "offload", "offload"],
                               ["recompute", "recompute", "offload"]]
    assert plan.unit_activation == {0: "keep", 1: "offload", 2: "offload", 3: "recompute",
                                    4: "recompute", 5: "offload"}
    assert build_plan(4, 2, 1, 2, activation="recompute").activation == [
        ["keep", "recompute", "recompute"], ["recompute", "recompute", "keep"]]
    # one unit per stage: the entries of stages without a decoder block apply to nothing, but
    # the baseline still refuses a list whose entries differ
    assert build_plan(1, 3, 1, 3, activation=["offload", "recompute", "offload"]).activation == [
        ["keep"], ["recompute"], ["keep"]]
    with pytest.raises(ScheduleConfigError, match="baseline takes one activation policy"):
        build_plan(1, 3, 1, 3, policy="baseline", activation=["keep", "recompute", "recompute"])
    # baseline accepts a per-stage list that is uniform, and an override that changes nothing
    assert build_plan(4, 2, 1, 2, policy="baseline", activation=["offload", "offload"],
                      unit_activation={2: "offload"}).activation == \
        build_plan(4, 2, 1, 2, policy="baseline", activation="offload").activation


def test_plan_round_trips_with_lifecycle_fields():
    plan = build_plan(4, 2, 2, 3, activation=["offload", "recompute"], view_window=2,
                      state_home="host", unit_activation={0: "offload"})
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["activation"] == [["offload", "offload", "offload"],
                               ["recompute", "recompute", "keep"]]
    assert (d["view_window"], d["state_home"]) == (2, "host")
    again = PipelinePlan.from_dict(d)
    assert again == plan and again.to_dict() == d
    again.validate()
    resident = build_plan(4, 2, 1, 2, view_window=0)
    assert PipelinePlan.from_dict(json.loads(json.dumps(resident.to_dict()))) == resident


def test_sharded_plan_round_trips_and_changes_no_program():
    sharded = build_plan(4, 2, 2, 4, view_window=1, shard_state=True)
    d = json.loads(json.dumps(sharded.to_dict()))
    assert d["shard_state"] is True
    again = PipelinePlan.from_dict(d)
    assert again == sharded
    again.validate()
    assert sharded.programs == build_plan(4, 2, 2, 4, view_window=1).programs
    del d["shard_state"]  # older plans: whole state on every replica
    assert PipelinePlan.from_dict(d).shard_state is False


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(shard_state="yes"), "shard_state must be true or false"),
    (lambda d: d.update(pp=3), "pp=3, but the plan has 2 programs for 2 stages"),
    # a stage that computes unit 1 on its masters: there is no whole master to compute on
    (lambda d: d["programs"].__setitem__(0, " ".join(
        t for t in d["programs"][0].split() if t not in ("P1", "WP1", "X1"))),
     "makes no view of units \\[1\\]"),
])
def test_sharded_plan_validation(edit, match):
    d = build_plan(4, 2, 2, 4, view_window=1, shard_state=True).to_dict()
    edit(d)
    with pytest.raises(ScheduleError, match=match):
        PipelinePlan.from_dict(d).validate()


def test_legacy_plan_loads():
    plan = build_plan(4, 2, 2, 3, activation="recompute")
    d = plan.to_dict()
    d["activation"] = "recompute"  # older plans: one policy for every decoder block
    del d["view_window"], d["state_home"]
    old = PipelinePlan.from_dict(json.loads(json.dumps(d)))
    assert old == plan
    assert (old.view_window, old.state_home) == (None, "device")
    assert old.unit_activation == {0: "keep", 1: "recompute", 2: "recompute", 3: "recompute",
                                   4: "recompute", 5: "keep"}
    old.validate()


def test_plan_validate_catches_activation_the_programs_do_not_do():
    plan = build_plan(4, 2, 1, 2, activation="recompute")
    plan.activation[0][1] = "offload"
    with pytest.raises(ScheduleError, match="not what its programs do"):
        plan.validate()


# --- broken programs ---------------------------------------------------------------------------

UNITS = [range(0, 3)]
# build_plan(1, 1, 1, 1, activation="offload", view_window=1, clip=False): every test below
# breaks it one way.
BASE = ("P0 P1 WP0 F0.0 X0 P2 WP1 F1.0 O1.0 WP2 F2.0 L1.0 B2.0 X2 P0 WL1.0 B1.0 X1 WP0 B0.0 X0 "
        "U2 U1 U0 E")


def _edit(program: str, old: str, new: str) -> str:
    tokens, old_t = program.split(), old.split()
    at = next(i for i in range(len(tokens)) if tokens[i:i + len(old_t)] == old_t)
    return " ".join(tokens[:at] + new.split() + tokens[at + len(old_t):])


def test_the_base_program_is_the_built_one():
    plan = build_plan(1, 1, 1, 1, activation="offload", view_window=1, clip=False)
    assert _text(plan.programs) == [BASE]
    validate([parse_program(BASE)], UNITS, 1, 1)


@pytest.mark.parametrize("program, match, marked", [
    (_edit(BASE, "WL1.0 B1.0", "B1.0 WL1.0"), r"B1.0 at step \d+ comes before WL1.0", "B1.0"),
    (_edit(_edit(BASE, "O1.0", ""), "L1.0", "L1.0 O1.0"), r"L1.0 at step \d+ comes before O1.0",
     "L1.0"),
    (_edit(_edit(BASE, "O1.0", ""), "P0 P1", "O1.0 P0 P1"), r"O1.0 at step 0 comes before F1.0",
     "O1.0"),
    (_edit(_edit(BASE, "L1.0", ""), "WL1.0", "WL1.0 L1.0"), "WL1.0 waits for L1.0", "WL1.0"),
    (_edit(BASE, "WL1.0 B1.0", "WL1.0 R1.0 B1.0"), "a recomputed forward saves nothing to offload",
     "O1.0"),
    (_edit(BASE, "F0.0 X0", "X0 F0.0"), r"F0.0 needs unit 0's view live, but it is released "
                                        r"\(X0 at step 3\)", "F0.0"),
    (_edit(BASE, "F1.0", "F1.0 P1 WP1"), r"P1 prefetches unit 1's view again, but it is live",
     "P1"),
    (_edit(BASE, "X0 U2", "X0 X0 U2"), "X0 releases unit 0's view, but it is released", "X0"),
    (_edit(BASE, "WP2 F2.0", "F2.0 WP2"), "F2.0 needs unit 2's view live, but it is only pending",
     "F2.0"),
    (_edit(BASE, "P0 P1 WP0", "P1 WP0"), "WP0 waits for P0", "WP0"),
])
def test_broken_lifecycle_caught(program, match, marked):
    with pytest.raises(ScheduleError, match=match) as info:
        validate([parse_program(program)], UNITS, 1, 1)
    assert f">>{marked}<<" in str(info.value) and "Step 00:" in str(info.value)


@pytest.mark.parametrize("program, match", [
    (_edit(BASE, "L1.0", ""), "runs L1.0 0 times; an offloaded activation takes exactly one O, L"),
    (_edit(BASE, "WL1.0", "WL1.0 WL1.0"), "runs WL1.0 2 times"),
])
def test_incomplete_offload_caught(program, match):
    with pytest.raises(ScheduleError, match=match):
        validate([parse_program(program)], UNITS, 1, 1)


@pytest.mark.parametrize("program, match", [
    ("P0 F0.0 E", "F0.0 needs unit 0's view live, but it is only pending"),
    ("WP0 F0.0 E", "WP0 waits for unit 0's view, but it is not prefetched before it"),
    ("P0 WP0 F0.0 X0 P0 E", "unit 0's view is prefetched but never waited"),
    ("X0 F0.0 E", "X0 releases unit 0's view, but it is not prefetched before it"),
])
def test_check_views_on_its_own(program, match):
    # validate's earlier start/wait pairing would catch these first; check_views says why too
    with pytest.raises(ScheduleError, match=match):
        check_views([parse_program(program)])


def test_units_without_views_compute_on_their_masters():
    check_views([parse_program("P1 WP1 F0.0 F1.0 X1 E")])


def test_eval_programs_take_views_but_not_offload():
    validate([parse_program("P0 WP0 F0.0 X0 E")], [range(0, 1)], 1, 1, forward_only=True)
    with pytest.raises(ScheduleError, match="O0.0 has no place in an evaluation program"):
        validate([parse_program("F0.0 O0.0 E")], [range(0, 1)], 1, 1, forward_only=True)


def test_add_views_leaves_its_input_alone():
    program = parse_program("F0.0 F1.0 B1.0 B0.0 E")
    for window in (None, 0, 1, 2):
        add_views([program], [range(0, 2)], window)
    assert format_program(program) == "F0.0 F1.0 B1.0 B0.0 E"
