"""Where a split schedule's weight gradients run: the lifecycle's choice for BW.

A split backward's BW u.m waits only for BI u.m and nothing waits for it but unit u's own
gradient sync (and its update), so it may go anywhere between them. Two placements, for the
compute-only programs of a split builder (builders.zbh1), before any other pass:

* bubble: as the builder placed them (ZB-H1: BWs fill the pipeline's cool-down bubble).
* bubble:K: the same, but no stage defers more than K micro-batches' BWs (stage s defers
  min(s, K)). What a deferred BW keeps (its seeds, the inputs of the ops that read a weight)
  is what makes the later stages hold more than under 1F1B, up to s micro-batches' worth on
  stage s; the cap trades part of the filled bubble for that memory. K = 0 runs each BW
  right after its BI: 1F1B's memory, and still the input gradient sent before the weight
  gradient is computed.
* grouped: every BW of a unit together (BW u.0 .. BW u.(n-1)), the units in the order of
  their last BI, which is the order their syncs should start; each group right after its
  unit's last BI, and on a stage that sends gradients back, after the stage's last BI (whose
  gradient the previous stage waits for: no BW goes in front of it). A unit's gradient is then
  final after n BWs rather than at the end of the step's backward, so its sync runs under the
  BWs of the units after it; what BW needs stays alive until its group runs (every
  micro-batch's, as in GPipe).
  On a single stage nothing waits for the input gradients, so the backward runs unit-major:
  every forward, then per unit (top first) its backward of every micro-batch. The top unit's
  gradient is final after about 1/units of the step's backward. Nothing there needs the
  split, so the backwards are whole (B): the halves cost more than the whole (on a tiny block,
  BI 27.0 + BW 16.3 ms against 38.7; docs/benchmarks.md) and BW's seeds lived between them.
"""

from __future__ import annotations

import functools

from ratrain.schedule.builders import zbh1_program
from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Action, Op, Program

WEIGHT_GRADS = ("bubble", "grouped")
CAPPED = "bubble:K"  # how a capped bubble placement is written, K a whole number


@functools.lru_cache(maxsize=64)
def parse_placement(placement: str) -> tuple[str, int | None]:
    """(kind, cap): ("bubble", None), ("bubble", K) for "bubble:K", ("grouped", None)."""
    kind, sep, cap = placement.partition(":")
    if kind in WEIGHT_GRADS and not sep:
        return kind, None
    if kind == "bubble" and cap.isdigit():
        return kind, int(cap)
    raise ScheduleConfigError(f"unknown weight-gradient placement {placement!r}; choose one of "
                              f"{', '.join(WEIGHT_GRADS)} or {CAPPED} (K >= 0: the most "
                              f"micro-batches' weight gradients a stage defers)")


def is_bubble(placement: str | None) -> bool:
    """Whether a placement fills the bubble (capped or not); None, a whole backward, does not."""
    return placement is not None and parse_placement(placement)[0] == "bubble"


def deferral_lag(placement: str, stage: int) -> int:
    """How many micro-batches' BWs stage `stage` defers under a bubble placement."""
    cap = parse_placement(placement)[1]
    return stage if cap is None else min(stage, cap)


def place_weight_grads(programs: list[Program], placement: str) -> list[Program]:
    """The programs with their BWs placed as `placement` says (module docstring)."""
    kind, cap = parse_placement(placement)
    if kind == "bubble" and cap is None:
        return [list(program) for program in programs]
    if kind == "bubble":
        return [_capped(program, s, len(programs), min(s, cap))
                for s, program in enumerate(programs)]
    if len(programs) == 1:
        return [_unit_major(programs[0])]
    return [_grouped(program, sends_grad=s > 0) for s, program in enumerate(programs)]


def _grouped(program: Program, sends_grad: bool) -> Program:
    rest = [a for a in program if a.op is not Op.BACKWARD_WEIGHT]
    last_input = {a.unit: i for i, a in enumerate(rest) if a.op is Op.BACKWARD_INPUT}
    floor = max(last_input.values()) if sends_grad else -1
    after: dict[int, Program] = {}
    for u in sorted(last_input, key=last_input.__getitem__):
        group = [Action(Op.BACKWARD_WEIGHT, u, a.mb) for a in rest
                 if a.op is Op.BACKWARD_INPUT and a.unit == u]
        after.setdefault(max(last_input[u], floor), []).extend(group)
    return [b for i, a in enumerate(rest) for b in [a, *after.get(i, [])]]


def _unit_major(program: Program) -> Program:
    forwards = [a for a in program if a.op is Op.FORWARD]
    micro = list(dict.fromkeys(a.mb for a in forwards))
    units = sorted({a.unit for a in forwards}, reverse=True)
    return forwards + [Action(Op.BACKWARD, u, m) for u in units for m in micro]


def _capped(program: Program, stage: int, pp: int, lag: int) -> Program:
    units = sorted({a.unit for a in program})
    n_micro = len({a.mb for a in program})
    return zbh1_program(range(units[0], units[-1] + 1), stage, pp, n_micro, lag)


def schedules(pp: int, dp: int) -> list[tuple[str, str | None]]:
    """(schedule, weight-gradient placement) worth simulating for a layout: 1F1B; ZB-H1 with its
    BWs in the bubble where there is one (pp > 1: on one stage it is 1F1B's order), and with
    their deferral capped (`deferral_caps`) for less memory on the later stages; grouped where
    grouping may hide syncs (dp > 1) or shorten the cool-down (pp > 1)."""
    out: list[tuple[str, str | None]] = [("1f1b", None)]
    if pp > 1:
        out.append(("zbh1", "bubble"))
        out += [("zbh1", f"bubble:{k}") for k in deferral_caps(pp)]
    if pp > 1 or dp > 1:
        out.append(("zbh1", "grouped"))
    return out


def deferral_caps(pp: int) -> list[int]:
    """The caps on deferred BWs weighed at `pp` stages: 0 and the powers of two below pp - 1
    (the last stage defers pp - 1 uncapped, so a cap of pp - 1 or more is "bubble" itself). A
    cap is a memory knob: the later stages' peak grows with it, nearly linearly, so a chosen
    cap is within 2x of the largest that fits. Each cap is one more layout to partition; the
    bound of a capped layout (unit_tables.UnitTables._own_micro) keeps most of them unexpanded."""
    return [0, *(1 << i for i in range(max(0, pp - 2).bit_length()))]
