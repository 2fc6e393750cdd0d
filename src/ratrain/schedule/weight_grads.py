"""Where a split schedule's weight gradients run: the lifecycle's choice for BW.

A split backward's BW u.m waits only for BI u.m and nothing waits for it but unit u's own
gradient sync (and its update), so it may go anywhere between them. Two placements, for the
compute-only programs of a split builder (builders.zbh1), before any other pass:

* bubble: as the builder placed them (ZB-H1: BWs fill the pipeline's cool-down bubble).
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

from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Action, Op, Program

WEIGHT_GRADS = ("bubble", "grouped")


def place_weight_grads(programs: list[Program], placement: str) -> list[Program]:
    """The programs with their BWs placed as `placement` says (module docstring)."""
    if placement not in WEIGHT_GRADS:
        raise ScheduleConfigError(f"unknown weight-gradient placement {placement!r}; choose one "
                                  f"of {', '.join(WEIGHT_GRADS)}")
    if placement == "bubble":
        return [list(program) for program in programs]
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
