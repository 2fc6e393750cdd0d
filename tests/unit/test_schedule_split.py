"""Split backwards (BI, BW): the ZB-H1 builder, the weight-gradient placements, and what the
checks know of the two halves."""

import pytest

from ratrain.schedule import Action, Op, ScheduleConfigError, ScheduleError, build_plan, validate
from ratrain.schedule.builders import (
    one_f_one_b_in_flight, one_f_one_b_order, partition_units, zbh1, zbh1_order,
)
from ratrain.schedule.ir import parse_program
from ratrain.schedule.weight_grads import is_bubble, place_weight_grads


def _in_flight(order) -> list[int]:
    """Micro-batches held (forward run, weight gradient not yet) after each step of an order."""
    held, out = 0, []
    for op, _ in order:
        held += 1 if op is Op.FORWARD else -1 if op is not Op.BACKWARD_INPUT else 0
        out.append(held)
    return out


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_zbh1_runs_1f1b_order_with_bw_deferred_by_the_stage_index(p, extra):
    n = p + extra
    for s in range(p):
        order = zbh1_order(s, p, n)
        # forwards and input gradients in 1F1B's order
        assert [(op is Op.FORWARD, m) for op, m in order if op is not Op.BACKWARD_WEIGHT] == \
            list(one_f_one_b_order(s, p, n))
        inputs = [m for op, m in order if op is Op.BACKWARD_INPUT]
        weights = [m for op, m in order if op is Op.BACKWARD_WEIGHT]
        assert weights == inputs == list(range(n))
        # the k-th BW comes right after the (k + s + 1)-th BI; the last s after the last BI
        for k, m in enumerate(weights):
            at = order.index((Op.BACKWARD_WEIGHT, m))
            if k < n - s:
                assert order[at - 1] == (Op.BACKWARD_INPUT, inputs[k + s])
            else:
                assert at > order.index((Op.BACKWARD_INPUT, inputs[-1]))
        # each stage holds 1F1B's most (stage 0's), not more
        assert max(_in_flight(order)) == one_f_one_b_in_flight(0, p, n) == min(p, n)


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("cap", [0, 1, 2, 4])
def test_a_capped_bubble_defers_at_most_cap_weight_gradients(p, cap):
    n = p + 2
    stage_units = partition_units(2 * p, p)
    uncapped = zbh1(stage_units, n)
    capped = place_weight_grads(uncapped, f"bubble:{cap}")
    for s, (program, units) in enumerate(zip(capped, stage_units)):
        assert [a for a in program if a.op is not Op.BACKWARD_WEIGHT] == \
            [a for a in uncapped[s] if a.op is not Op.BACKWARD_WEIGHT]
        assert (capped[s] == uncapped[s]) == (cap >= s)
        # micro-batches past their BI (every unit's) and before their BW (the first unit's)
        past, most = set(), 0
        for a in program:
            if a.op is Op.BACKWARD_INPUT and a.unit == units[0]:
                past.add(a.mb)
            elif a.op is Op.BACKWARD_WEIGHT and a.unit == units[-1]:
                past.discard(a.mb)
            most = max(most, len(past))
        assert most == min(s, cap, n - 1) + 1  # one more for a moment, after each BI
    plan = build_plan(2 * p - 2, p, 2, n, schedule="zbh1", weight_grad=f"bubble:{cap}",
                      activation="recompute", view_window=1)
    assert plan.weight_grad == f"bubble:{cap}"
    assert plan.programs != build_plan(2 * p - 2, p, 2, n, schedule="zbh1", activation="recompute",
                                       view_window=1).programs or cap >= p - 1


def test_zbh1_program_example():
    programs = zbh1(partition_units(2, 2), 3)
    assert " ".join(map(str, programs[1])) == (
        "F2.0 F3.0 BI3.0 BI2.0 F2.1 F3.1 BI3.1 BI2.1 BW3.0 BW2.0 "
        "F2.2 F3.2 BI3.2 BI2.2 BW3.1 BW2.1 BW3.2 BW2.2")
    assert " ".join(map(str, programs[0])) == (
        "F0.0 F1.0 F0.1 F1.1 BI1.0 BI0.0 BW1.0 BW0.0 F0.2 F1.2 BI1.1 BI0.1 BW1.1 BW0.1 "
        "BI1.2 BI0.2 BW1.2 BW0.2")


@pytest.mark.parametrize("p", range(1, 6))
@pytest.mark.parametrize("weight_grad", ["bubble", "grouped"])
def test_every_split_plan_passes_checks(p, weight_grad):
    for n, layers in ((p, p + 1), (2 * p + 1, 2 * p + 3)):
        for policy, dp, clip, activation, window in (
                ("ratrain", 2, True, "recompute", 1), ("ratrain", 1, False, "offload", None),
                ("baseline", 2, False, "keep", 0), ("ratrain", 2, False, "keep", 2)):
            plan = build_plan(layers, p, dp, n, schedule="zbh1", policy=policy, clip=clip,
                              activation=activation, view_window=window, weight_grad=weight_grad)
            assert plan.weight_grad == weight_grad
            ops = {a.op for program in plan.programs for a in program}
            if p == 1 and weight_grad == "grouped":  # unit-major: nothing needs the split
                assert Op.BACKWARD in ops and not {Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT} & ops
            else:
                assert Op.BACKWARD not in ops and {Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT} <= ops


def test_grouped_runs_each_units_weight_gradients_together_in_sync_order():
    stage_units = partition_units(6, 3)
    programs = place_weight_grads(zbh1(stage_units, 4), "grouped")
    for s, (program, units) in enumerate(zip(programs, stage_units)):
        last_input = {a.unit: i for i, a in enumerate(program) if a.op is Op.BACKWARD_INPUT}
        first_weight = min(i for i, a in enumerate(program) if a.op is Op.BACKWARD_WEIGHT)
        groups = [u for u in sorted(last_input, key=last_input.get)]
        tail = [a for a in program if a.op is Op.BACKWARD_WEIGHT]
        assert tail == [Action(Op.BACKWARD_WEIGHT, u, m) for u in groups for m in range(4)]
        for u in units:
            at = program.index(Action(Op.BACKWARD_WEIGHT, u, 0))
            assert program[at:at + 4] == [Action(Op.BACKWARD_WEIGHT, u, m) for m in range(4)]
            assert at > last_input[u]
        if s > 0:  # nothing goes in front of the gradient the previous stage waits for
            assert first_weight > max(last_input.values())


def test_grouped_on_one_stage_runs_the_backward_unit_major():
    plan = build_plan(2, 1, 2, 3, schedule="zbh1", weight_grad="grouped", clip=False)
    compute = [str(a) for a in plan.programs[0] if a.op not in (Op.UPDATE, Op.STEP_END)]
    forwards = [f"F{u}.{m}" for m in range(3) for u in range(4)]
    backward = [f"B{u}.{m}" + (f" GS{u}" if m == 2 else "") for u in (3, 2, 1, 0)
                for m in range(3)]
    assert " ".join(compute) == " ".join(forwards + backward + [f"WGS{u}" for u in (3, 2, 1, 0)])


def test_ratrain_sync_follows_the_units_last_weight_gradient():
    plan = build_plan(4, 2, 2, 4, schedule="zbh1", clip=False)
    for program in plan.programs:
        for i, a in enumerate(program):
            if a.op is Op.GRAD_SYNC:
                last = max(j for j, b in enumerate(program)
                           if b.op is Op.BACKWARD_WEIGHT and b.unit == a.unit)
                assert i == last + 1


def test_placement_choices_are_checked():
    with pytest.raises(ScheduleConfigError, match="needs a schedule that splits"):
        build_plan(2, 1, 1, 2, weight_grad="grouped")
    for bad in ("middle", "bubble:", "bubble:-1", "bubble:x", "grouped:2", "bubble:1:2"):
        with pytest.raises(ScheduleConfigError, match="unknown weight-gradient placement"):
            build_plan(2, 1, 1, 2, schedule="zbh1", weight_grad=bad)
    assert build_plan(2, 1, 1, 2, schedule="zbh1").weight_grad == "bubble"
    assert build_plan(2, 1, 1, 2).weight_grad is None
    assert [is_bubble(w) for w in (None, "grouped", "bubble", "bubble:0", "bubble:3")] == \
        [False, False, True, True, True]
    with pytest.raises(ScheduleConfigError, match="unknown weight-gradient placement"):
        is_bubble("bubbles")


ONE_STAGE = "F0.0 F1.0 F2.0 BI2.0 BI1.0 BI0.0 BW2.0 BW1.0 BW0.0 U2 U1 U0 E"


@pytest.mark.parametrize("program, message", [
    (ONE_STAGE.replace("BI1.0 BI0.0 BW2.0 BW1.0", "BI1.0 BW1.0 BI0.0 BW2.0"), None),
    (ONE_STAGE.replace("BI2.0 BI1.0", "BW2.0 BI2.0 BI1.0").replace("BW2.0 BW1.0", "BW1.0"),
     "BW2.0 at step 3 comes before BI2.0"),
    (ONE_STAGE.replace("BI2.0 BI1.0", "BI1.0 BI2.0"), "BI1.0 at step 3 comes before BI2.0"),
    (ONE_STAGE.replace("BW1.0 ", ""), "runs BW1.0 0 times; expected once"),
    (ONE_STAGE.replace("BW1.0", "BW1.0 B1.0"), "runs B1.0 1 times; expected none"),
    (ONE_STAGE.replace("U2 U1", "U1 U2").replace("BW1.0 BW0.0 U1", "U1 BW1.0 BW0.0"),
     "U1 at step 7 comes before every BW1.*"),
])
def test_checks_know_the_halves(program, message):
    programs, stage_units = [parse_program(program)], [range(3)]
    if message is None:
        validate(programs, stage_units, 1, 1)
        return
    with pytest.raises(ScheduleError, match=message.replace(".", r"\.").replace("*", r"\*")):
        validate(programs, stage_units, 1, 1)


def test_gradient_send_waits_for_the_input_half():
    plan = build_plan(2, 2, 1, 2, schedule="zbh1", clip=False)
    text = " ".join(map(str, plan.programs[1]))
    assert "BI2.0 SG1.0" in text
    broken = [parse_program(" ".join(map(str, plan.programs[0]))),
              parse_program(text.replace("BI2.0 SG1.0", "SG1.0 BI2.0"))]
    with pytest.raises(ScheduleError, match=r"SG1\.0 at step \d+ comes before BI2\.0"):
        validate(broken, plan.stage_units, 2, 1)


def test_a_view_stays_live_until_the_units_weight_gradients():
    plan = build_plan(3, 2, 1, 2, schedule="zbh1", weight_grad="grouped", view_window=1,
                      clip=False)
    for program, units in zip(plan.programs, plan.stage_units):
        for u in units:
            release = max(i for i, a in enumerate(program) if a == Action(Op.RELEASE, u))
            assert release > max(i for i, a in enumerate(program)
                                 if a.op is Op.BACKWARD_WEIGHT and a.unit == u)
    text = " ".join(map(str, plan.programs[1]))
    early = text.replace("BW4.1 X4", "X4 BW4.1")
    assert early != text
    with pytest.raises(ScheduleError, match=r"BW4\.1 needs unit 4's view live"):
        validate([plan.programs[0], parse_program(early)], plan.stage_units, 2, 1)


def _simulated(schedule, pp, dp, n_micro, weight_grad=None):
    from ratrain.models.presets import get_preset
    from ratrain.sim.profile import load_profile
    from ratrain.sim.simulator import simulate

    model = get_preset("llama2-7b")
    plan = build_plan(model.n_layers, pp, dp, n_micro, schedule=schedule, clip=False,
                      weight_grad=weight_grad)
    return simulate(plan, model, load_profile("h100-80g-ib"), micro_batch_size=1, seq_len=2048,
                    dtype="bfloat16")


def test_the_halves_cost_what_the_whole_backward_costs():
    from ratrain.sim import unit_costs as uc

    for kind in ("embedding", "block", "head"):
        bi, bw = uc.split_backward_s(kind, 0.7, 0.3 if kind == "block" else 0.0)
        assert bi + bw == pytest.approx(1.0 if kind == "block" else 0.7) and bw > 0
    assert uc.split_backward_s("block", 0.7, 0.3) == pytest.approx((0.65, 0.35))  # attention: BI
    assert uc.split_backward_s("head", 0.7, 0.0) == (0.35, 0.35)
    assert uc.split_backward_s("embedding", 0.7, 0.0) == (0.0, 0.7)


def test_zbh1_fills_the_bubble_in_the_simulator():
    whole, split = _simulated("1f1b", 4, 1, 8), _simulated("zbh1", 4, 1, 8, "bubble")
    assert split.step_time < whole.step_time
    assert split.bubble < 0.6 * whole.bubble


def test_a_cap_trades_the_filled_bubble_for_the_later_stages_memory():
    uncapped, none = _simulated("zbh1", 4, 1, 8, "bubble"), _simulated("1f1b", 4, 1, 8)
    capped = [_simulated("zbh1", 4, 1, 8, f"bubble:{k}") for k in (0, 1, 2)]
    last = [r.device_peak for r in (c.ranks[-1] for c in (none, *capped, uncapped))]
    # 1F1B's a whisker above ZB-H1's with no BW deferred: their backwards' working bytes
    # differ (B's MLP gradients; BI's kept graph), 0.4% on llama2-7b's last stage
    assert last[1:] == sorted(last[1:]) and last[1] < last[-1] and last[0] <= 1.005 * last[1]
    steps = [c.step_time for c in (*capped, uncapped)]
    assert steps == sorted(steps, reverse=True) and steps[0] < none.step_time


def test_grouped_weight_gradients_start_the_top_units_sync_earlier():
    def sync_start(result, unit):
        return next(start for a, start, _ in result.ranks[0].actions
                    if a == Action(Op.GRAD_SYNC, unit))

    whole, grouped = _simulated("1f1b", 1, 2, 4), _simulated("zbh1", 1, 2, 4, "grouped")
    top = 33  # llama2-7b: 32 blocks, the head is unit 33
    assert sync_start(grouped, top) < sync_start(whole, top)
