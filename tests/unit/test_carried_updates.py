"""Carried updates in the programs (schedule/carried_updates.py), their checks, the plan field,
and the simulator's steady state."""

from __future__ import annotations

import pytest

from ratrain.models.presets import get_preset
from ratrain.schedule.errors import ScheduleConfigError, ScheduleError
from ratrain.schedule.ir import Action, Op, format_program, parse_program
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim import unit_costs as uc
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate

GPU = "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml"


def _ops(program, op):
    return [a for a in program if a.op is op]


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("pp, dp, window", [(1, 1, 1), (1, 2, None), (2, 1, None), (2, 2, 1)])
def test_each_update_starts_when_its_gradient_is_final_and_is_waited_before_its_next_use(
        pp, dp, window, clip):
    plan = build_plan(4, pp, dp, 4, clip=clip, view_window=window, update="carried")
    inline = build_plan(4, pp, dp, 4, clip=clip, view_window=window)
    for program, before, units in zip(plan.programs, inline.programs, plan.stage_units):
        assert not _ops(program, Op.UPDATE)
        assert [a.unit for a in _ops(program, Op.WAIT_UPDATE)] == \
            sorted(units, key=lambda u: program.index(Action(Op.WAIT_UPDATE, u)))
        carried = (Op.START_UPDATE, Op.WAIT_UPDATE, Op.START_NORM, Op.WAIT_NORM)
        rest = [a for a in program if a.op not in carried]
        assert rest == [a for a in before if a.op is not Op.UPDATE]  # nothing else moved
        for u in units:
            wait, start = program.index(Action(Op.WAIT_UPDATE, u)), program.index(Action(Op.START_UPDATE, u))
            first = min(i for i, a in enumerate(program)
                        if a.unit == u and a.op in (Op.PREFETCH, Op.FORWARD))
            assert wait == first - 1  # right before the masters are read
            if clip:  # the coefficient is known only after the global norm
                assert start > program.index(Action(Op.WAIT_GRAD_NORM))
            elif dp > 1:  # right after its sync
                assert program[start - 1] == Action(Op.WAIT_GRAD_SYNC, u)
            else:  # right after its last backward
                last_b = max(i for i, a in enumerate(program) if a.op is Op.BACKWARD and a.unit == u)
                assert start == last_b + 1 + sum(1 for a in program[last_b + 1:start]
                                                 if a.op is Op.START_UPDATE)
        if clip:  # started together: in the order the next step reads them
            started = [a.unit for a in _ops(program, Op.START_UPDATE)]
            assert started == sorted(units)
            # each unit's part of the norm on the host thread once its gradient is final,
            # all of them waited right before N
            n = program.index(Action(Op.GRAD_NORM))
            assert [a for a in program[n - len(units):n]] == \
                [Action(Op.WAIT_NORM, u) for u in sorted(units)]
            for u in units:
                sn = program.index(Action(Op.START_NORM, u))
                last_b = max(i for i, a in enumerate(program) if a.op is Op.BACKWARD and a.unit == u)
                ready = program.index(Action(Op.WAIT_GRAD_SYNC, u)) if dp > 1 else last_b
                assert ready < sn < n and all(a.op is Op.START_NORM for a in program[ready + 1:sn])
        else:
            assert not _ops(program, Op.START_NORM) and not _ops(program, Op.WAIT_NORM)
    again = PipelinePlan.from_dict(plan.to_dict())
    again.validate()
    assert again.update == "carried" and again.programs == plan.programs
    assert "update" not in inline.to_dict()


def test_checks_refuse_a_wait_after_its_start_and_a_lost_wait():
    plan = build_plan(2, 1, 1, 2, update="carried")
    program = plan.programs[0]
    late = [a for a in program if a != Action(Op.WAIT_UPDATE, 0)]
    late.insert(len(late) - 1, Action(Op.WAIT_UPDATE, 0))
    with pytest.raises(ScheduleError, match="must come before SU0"):
        PipelinePlan.from_dict({**plan.to_dict(), "programs": [format_program(late)]}).validate()
    lost = [a for a in program if a != Action(Op.WAIT_UPDATE, 1)]
    with pytest.raises(ScheduleError, match="SU1 and WU1 must each run once"):
        PipelinePlan.from_dict({**plan.to_dict(), "programs": [format_program(lost)]}).validate()
    inline = build_plan(2, 1, 1, 2)
    with pytest.raises(ScheduleError, match="do not carry the updates"):
        PipelinePlan.from_dict({**inline.to_dict(), "update": "carried"}).validate()
    assert parse_program(format_program(program)) == program


def test_sharded_state_refuses_carried_updates():
    with pytest.raises(ScheduleConfigError, match="carried updates need whole state"):
        build_plan(2, 1, 2, 2, shard_state=True, view_window=1, update="carried")


def test_simulator_hides_host_updates_on_a_gpu_but_claims_nothing_on_a_cpu():
    """On the H200 profile, 7B's host AdamW (host state, one unit's view at a time) runs beside
    the compute: the step is shorter, by at most the updates' time. On a CPU profile the
    walker runs a carried update as it would an inline one."""
    model = get_preset("llama2-7b")
    gpu, cpu = load_profile(GPU), load_profile("cpu-local")
    for clip in (True, False):
        steps = {}
        for update in ("inline", "carried"):
            plan = build_plan(model.n_layers, 1, 1, 4, activation="recompute", view_window=1,
                              state_home="host", update=update, clip=clip)
            steps[update] = simulate(plan, model, gpu, micro_batch_size=1, seq_len=4096,
                                     dtype="bfloat16")
        updates = sum(d for a, _, d in _spans(steps["inline"], Op.UPDATE))
        saved = steps["inline"].step_time - steps["carried"].step_time
        assert 0.1 * updates < saved <= updates + 1e-9, (saved, updates)
    tiny = get_preset("tiny")
    times = [simulate(build_plan(tiny.n_layers, 1, 1, 2, update=u), tiny, cpu,
                      micro_batch_size=2, seq_len=64).step_time for u in ("inline", "carried")]
    assert times[0] <= times[1] <= 1.01 * times[0]  # no gain; a WU's walker overhead only


def _spans(result, op):
    return [(a, start, end - start) for a, start, end in result.ranks[0].actions
            if a.op is op]


@pytest.mark.parametrize("n_micro, group", [(1, 1), (4, 1), (4, 2)])
def test_a_units_host_norm_waits_for_its_gradients_trip_to_the_host(n_micro, group):
    """Across the H200 profile's host link every fold sends its gradient on the gradient
    stream, one copy after another: the step's first into the zero accumulation in fp32 (4
    bytes a parameter), a later one as it is (a unit-major run's fp32 sum, 1F1B's bf16
    gradient), a held one not at all; and a unit's norm (SN) on the host starts only once its
    last copy is there. A CPU profile, without a link, has no such copy."""
    model = get_preset("llama2-7b")
    model.n_layers = 4
    gpu = load_profile(GPU)
    plan = build_plan(model.n_layers, 1, 1, n_micro, activation="recompute", view_window=1,
                      state_home="host", micro_batch_group=group, update="carried")
    rank = simulate(plan, model, gpu, micro_batch_size=1, seq_len=4096,
                    dtype="bfloat16").ranks[0]
    copies = sorted((t0, t1, name) for name, t0, t1 in rank.spans
                    if name.startswith("fold copy "))
    assert all(a[1] <= b[0] + 1e-12 for a, b in zip(copies, copies[1:]))  # one stream
    link = gpu.device.host_link
    per_unit: dict[int, list[float]] = {}
    for t0, t1, name in copies:
        per_unit.setdefault(int(name.split()[-1].split(".")[0]), []).append(t1 - t0)
    runs = n_micro // group
    for u in range(model.n_layers + 2):
        n = uc.param_count(model, u)
        first, *later = per_unit[u]
        assert first == pytest.approx(link.time(4 * n))
        assert len(later) == runs - 1
        # unit-major runs fold their fp32 sum; 1F1B each bf16 gradient
        assert all(t == pytest.approx(link.time((4 if group > 1 else 2) * n)) for t in later)
        last_copy = max(t1 for t0, t1, name in copies if name.split()[-1].startswith(f"{u}."))
        norm = next(a for a in rank.spans if a[0] == str(Action(Op.START_NORM, u)))
        assert norm[1] >= last_copy - 1e-12
    cpu_rank = simulate(build_plan(2, 1, 1, 2, view_window=1, state_home="host"),
                        get_preset("tiny"), load_profile("cpu-local"), micro_batch_size=2,
                        seq_len=64).ranks[0]
    assert not [s for s in cpu_rank.spans if s[0].startswith("fold copy ")]
