"""Carried updates: each unit's optimizer update started on the host update thread (SU) as
soon as what it reads is final, and waited (WU) in the next step, right before the unit's
masters are read again.

A host-homed unit's AdamW is host work that nothing on the compute device waits for until the
unit's view is made again in the next step's forward. Run inline (U) it sits on the walker
between the last backward and the next forward, however idle the host was during the step; on
the LLaMA-2-7B H200 run of 2026-11-26 that was 2.4 s of a 4.0 s step. Started on a thread of
its own it runs beside the rest of the backward and the next step's forward of the units
before it.

With the global norm (clipping, float16), the unit's part of it is host work too: `SN u`, on
the same thread, finishes its gradient (the add of its last fold) and takes its squared norm as
soon as the gradient is final, beside the rest of the backward; `WSN u` (every unit's) goes
right before `N`, which then only sums them.

Where SU goes: right after the last of its needs (schedule/needs.py's rule for U: the norm's
WN when clipping, else the unit's sync wait, else its last backward). Starts that become ready
at the same place (every unit after WN) are ordered by the unit's first use in the next step,
so the thread finishes the one needed first first. Where WU goes: right before the program's
first action on the unit (its view's P, or its first forward). The math is U's: the same
update with the same learning rate and clipping coefficient, only later in time.

Units whose state stays on the compute device (`inline`: PipelinePlan.device_units) keep U:
their update is the device's fast work, in its place on the walker.
"""

from __future__ import annotations

from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ir import Action, Program
from ratrain.schedule.needs import NEEDS, RankContext
from ratrain.schedule.ops import Op

_READS_MASTERS = (Op.PREFETCH, Op.FORWARD)


def carry_updates(programs: list[Program], stage_units: list[range],
                  inline=frozenset()) -> list[Program]:
    """Replace every `U u` but those of the `inline` units by a carried `SU u` and its `WU u`
    (module docstring)."""
    return [_carry(p, s, len(programs), units, inline)
            for s, (p, units) in enumerate(zip(programs, stage_units))]


def _carry(program: Program, stage: int, stages: int, units: range, inline) -> Program:
    updated = [a.unit for a in program if a.op is Op.UPDATE and a.unit not in inline]
    if not updated:
        return program
    carried = set(updated)  # read once per action of the program
    first_use: dict[int, int] = {}
    for i, a in enumerate(program):
        if a.op in _READS_MASTERS and a.unit in carried:
            first_use.setdefault(a.unit, i)
    order = {u: k for k, u in enumerate(sorted(first_use, key=first_use.__getitem__))}
    missing = [u for u in updated if u not in first_use]
    if missing:
        raise ScheduleError(f"stage {stage}: units {missing} are updated but never read")
    rest = [a for a in program if not (a.op is Op.UPDATE and a.unit in carried)]
    ctx = RankContext.of(rest, stage, stages, units)
    after: dict[int, list[int]] = {}  # step in `rest` -> units whose SU goes right after it
    for u in updated:
        after.setdefault(_ready_at(Action(Op.UPDATE, u), ctx), []).append(u)
    norms: dict[int, list[int]] = {}  # step in `rest` -> units whose SN goes right after it
    if Action(Op.GRAD_NORM) in rest:
        for u in updated:
            norms.setdefault(_ready_at(Action(Op.START_NORM, u), ctx), []).append(u)
    out: list[Action] = []
    for i, a in enumerate([None] + rest, start=-1):  # -1: needs nothing, goes first
        if a is not None:
            if a.op in _READS_MASTERS and a.unit in first_use:
                del first_use[a.unit]
                out.append(Action(Op.WAIT_UPDATE, a.unit))
            if a.op is Op.GRAD_NORM:
                out += [Action(Op.WAIT_NORM, u) for u in sorted(updated)]
            out.append(a)
        out += [Action(Op.START_NORM, u) for u in norms.get(i, [])]
        # the order in which the next step reads them: the thread finishes the first one first
        out += [Action(Op.START_UPDATE, u) for u in sorted(after.get(i, []), key=order.get)]
    return out


def _ready_at(start: Action, ctx: RankContext) -> int:
    """The step of the last thing `start` (U, SN) needs (schedule/needs.py), in the program
    without U."""
    at = -1
    for need in NEEDS[start.op](start, ctx):
        at = max(at, ctx.pos.get(need, -1) if isinstance(need, Action) else need[1])
    return at
