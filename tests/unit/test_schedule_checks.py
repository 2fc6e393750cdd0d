"""Deliberately broken programs are caught, with the step x rank table and the bad action marked."""

import pytest

from ratrain.schedule import (
    ScheduleError, build_plan, format_program, format_table, parse_program, validate,
)
from ratrain.schedule.checks import dry_run

UNITS = [range(0, 2), range(2, 4)]  # 2 decoder blocks on 2 stages
# build_plan(2, 2, 1, 2, clip=False, policy="baseline"): the valid programs every test below
# breaks one way.
RANK0 = ("RG1.0 F0.0 F1.0 SA1.0 F0.1 F1.1 SA1.1 WSA1.0 WRG1.0 RG1.1 B1.0 B0.0 WRG1.1 B1.1 B0.1 "
         "WSA1.1 U0 U1 E")
RANK1 = ("RA1.0 WRA1.0 RA1.1 F2.0 F3.0 B3.0 B2.0 SG1.0 WRA1.1 F2.1 F3.1 B3.1 B2.1 SG1.1 WSG1.0 "
         "WSG1.1 U2 U3 E")


def _edit(program: str, old: str, new: str) -> str:
    """Replace the run of whole actions `old` by `new` (both space-separated; `new` may be
    empty): text edits on programs must not touch `WSA1.1` when replacing `SA1.1`."""
    tokens, old_t = program.split(), old.split()
    at = next(i for i in range(len(tokens)) if tokens[i:i + len(old_t)] == old_t)
    return " ".join(tokens[:at] + new.split() + tokens[at + len(old_t):])


def _check(rank0=RANK0, rank1=RANK1, n_micro=2, dp=1, units=UNITS):
    validate([parse_program(rank0), parse_program(rank1)], units, n_micro, dp)


def _caught(match, **programs) -> str:
    with pytest.raises(ScheduleError, match=match) as info:
        _check(**programs)
    message = str(info.value)
    assert "Stage 0" in message and "Stage 1" in message and "Step 00:" in message
    return message


def test_the_base_programs_are_the_built_ones_and_valid():
    plan = build_plan(2, 2, 1, 2, clip=False, policy="baseline")
    assert [format_program(p) for p in plan.programs] == [RANK0, RANK1]
    _check()


def test_send_after_the_wait_for_its_reply_deadlocks():
    rank0 = _edit(_edit(RANK0, "SA1.1", ""), "WRG1.1", "WRG1.1 SA1.1")
    message = _caught("deadlock", rank0=rank0)
    first = message.splitlines()[0]
    assert first == ("deadlock: stage 0 waits WRG1.1 (stage 1 has not started SG1.1); "
                     "stage 1 waits WRA1.1 (stage 0 has not started SA1.1)")
    assert ">>WRG1.1<<" in message and ">>WRA1.1<<" in message


def test_waiting_for_sends_before_posting_receives_deadlocks_under_rendezvous():
    # Each rank waits until its send is taken before it posts the receive the other one needs:
    # fine where sends complete eagerly, a deadlock where they are rendezvous (large messages).
    rank0 = ("F0.0 F1.0 SA1.0 F0.1 F1.1 SA1.1 WSA1.0 WSA1.1 RG1.0 WRG1.0 RG1.1 B1.0 B0.0 "
             "WRG1.1 B1.1 B0.1 U0 U1 E")
    rank1 = ("RA1.0 WRA1.0 F2.0 F3.0 B3.0 B2.0 SG1.0 WSG1.0 RA1.1 WRA1.1 F2.1 F3.1 B3.1 B2.1 "
             "SG1.1 WSG1.1 U2 U3 E")
    message = _caught("deadlock: stage 0 waits WSA1.1 .* stage 1 waits WSG1.0", rank0=rank0,
                      rank1=rank1)
    assert ">>WSA1.1<<" in message and ">>WSG1.0<<" in message


def test_gradient_send_after_the_norm_collective_deadlocks():
    rank0 = _edit(RANK0, "U0", "N WN U0")
    rank1 = _edit(RANK1, "SG1.1", "N WN SG1.1")
    message = _caught(r"deadlock: stage 0 waits WRG1.1 .*; stage 1 waits WN \(stages \[0\] have "
                      r"not started N\)", rank0=rank0, rank1=rank1)
    assert ">>WN<<" in message


def test_update_before_the_norm_is_known_caught():
    rank0 = _edit(RANK0, "U0", "N U0 WN")
    rank1 = _edit(RANK1, "U2", "N WN U2")
    message = _caught(r"stage 0: U0 at step \d+ comes before WN", rank0=rank0, rank1=rank1)
    assert ">>U0<<" in message


def test_norm_never_waited_caught():
    _caught("stage 0: N is started but never waited",
            rank0=_edit(RANK0, "U0", "N U0"), rank1=_edit(RANK1, "U2", "N WN U2"))


def test_swapped_send_order_caught():
    rank0 = _edit(RANK0, "SA1.0 F0.1 F1.1 SA1.1", "F0.1 F1.1 SA1.1 SA1.0")
    message = _caught(r"stage 0 posts SA in micro-batch order \[1, 0\] but stage 1 posts RA in "
                      r"order \[0, 1\]", rank0=rank0)
    assert ">>SA1.1<<" in message and ">>RA1.0<<" in message


def test_missing_receive_caught():
    message = _caught("stage 0: SA1.1 has 0 matching RA1.1 on stage 1; expected exactly one",
                      rank1=_edit(RANK1, "RA1.1", ""))
    assert ">>SA1.1<<" in message


def test_receive_of_the_wrong_tensor_caught():
    message = _caught("stage 0: SA0.1 names unit 0, but stage 0 exchanges unit 1's tensors with "
                      "stage 1", rank0=_edit(RANK0, "SA1.1", "SA0.1"))
    assert ">>SA0.1<<" in message


def test_backward_before_forward_caught():
    message = _caught(r"stage 1: B3.0 at step 4 comes before F3.0 \(step 5\)",
                      rank1=_edit(RANK1, "F3.0 B3.0", "B3.0 F3.0"))
    assert ">>B3.0<<" in message


def test_forward_before_its_input_arrives_caught():
    _caught(r"stage 1: F2.1 at step 8 comes before WRA1.1 \(step 9\)",
            rank1=_edit(RANK1, "WRA1.1 F2.1", "F2.1 WRA1.1"))


def test_update_before_the_last_backward_caught():
    _caught(r"stage 0: U1 at step 12 comes before every B1.\* \(step 14\)",
            rank0=_edit(_edit(RANK0, "U1", ""), "B0.0", "B0.0 U1"))


def test_start_without_wait_caught():
    message = _caught(r"stage 0: SA1.1 is started but never waited \(no WSA1.1 after it\)",
                      rank0=_edit(RANK0, "WSA1.1", ""))
    assert ">>SA1.1<<" in message


def test_wait_before_its_start_caught():
    message = _caught("stage 1: WRA1.0 waits for RA1.0, which has not been started before it",
                      rank1=_edit(RANK1, "RA1.0 WRA1.0", "WRA1.0 RA1.0"))
    assert ">>WRA1.0<<" in message


@pytest.mark.parametrize("rank0, match", [
    (_edit(RANK0, "U1 E", "E U1"), "stage 0: E must occur exactly once, as the last action"),
    (_edit(RANK0, "F0.1", "F0.1 F0.1"), "stage 0 runs F0.1 2 times; expected once"),
    (_edit(RANK0, "B0.1", ""), "stage 0 runs B0.1 0 times; expected once"),
    (_edit(RANK0, "U1", ""), "stage 0 runs U1 0 times; expected once"),
    (_edit(RANK0, "U0", "N WN U0"), "stage 1 runs N 0 times; expected once"),
    (_edit(RANK0, "F0.0", "F0.0 F2.0"), "stage 0: F2.0 names unit 2, but stage 0 owns units 0..1"),
    (_edit(RANK0, "F0.0", "F0.0 R0.2"), "stage 0: R0.2 names micro-batch 2, but the step has 2"),
    (_edit(RANK0, "U0", "GS0 WGS0 GS1 WGS1 U0"), "stage 0 starts GS0 1 times; expected 0 with dp=1"),
])
def test_incomplete_programs_caught(rank0, match):
    _caught(match, rank0=rank0)


def test_missing_grad_sync_with_dp_caught():
    _caught("stage 0 starts GS0 0 times; expected 1 with dp=2", dp=2)


def test_bad_layout_caught():
    with pytest.raises(ScheduleError, match="stages must own non-empty contiguous ranges"):
        _check(units=[range(0, 2), range(3, 4)])
    with pytest.raises(ScheduleError, match="2 programs for 3 stages"):
        _check(units=[range(0, 1), range(1, 2), range(2, 4)])


def test_forward_only_rejects_training_actions():
    programs = [parse_program("F0.0 F1.0 SA1.0 WSA1.0 E"),
                parse_program("RA1.0 WRA1.0 F2.0 F3.0 E")]
    validate(programs, UNITS, 1, 1, forward_only=True)
    programs[1].insert(4, parse_program("B3.0")[0])
    with pytest.raises(ScheduleError, match="stage 1: B3.0 has no place in an evaluation program"):
        validate(programs, UNITS, 1, 1, forward_only=True)


def test_dry_run_passes_valid_programs():
    dry_run(build_plan(6, 4, 2, 5, activation="recompute").programs)


def test_table_marks_and_elides():
    programs = build_plan(14, 4, 2, 16).programs
    table = format_table(programs, {1: 100, 3: 20})
    lines = table.splitlines()
    assert lines[0].split() == ["Stage", "0", "Stage", "1", "Stage", "2", "Stage", "3"]
    assert f">>{programs[1][100]}<<" in table and f">>{programs[3][20]}<<" in table
    assert "..." in table and len(lines) < 40
    assert lines[-1].startswith("... (") and lines[-1].endswith("steps in all)")
    short = format_table([parse_program("F0.0 E"), parse_program("E")], {1: 0})
    assert short.splitlines() == [
        "        Stage 0  Stage 1",
        "Step 0: F0.0     >>E<<",
        "Step 1: E",
    ]
