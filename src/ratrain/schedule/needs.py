"""What each op needs before it on its own rank: one rule per op (checked complete at import),
read by checks.check_dependencies.

A rule returns what the action consumes: actions, which must come earlier in the program, or
(description, step of the last thing described), for needs that are a set of actions ("every
B3.*"). Waits need their start (checks.check_waits proves it for every wait); the rules here
add what the data flow asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import WEIGHT_GRAD_OPS, Op


@dataclass
class RankContext:
    """One rank's program, indexed for the rules."""

    stage: int
    stages: int
    units: range
    pos: dict[Action, int]  # first step of each action
    last_backward: dict[int, int]  # unit -> step of its last B or BW (its gradient is final)
    last_sync: int  # step of the stage's last WGS, WRS, WGX or WTS (-1: none)
    split: set[int]  # units whose backward is split (BI, BW)
    weight_grads: dict[int, list[int]]  # unit -> micro-batches of its B or BW, in program order
    last_reduce: dict[int, int]  # unit -> step of its last WRS (gradient lifetime "micro-batch")

    @classmethod
    def of(cls, program: Program, stage: int, stages: int, units: range) -> RankContext:
        pos: dict[Action, int] = {}
        last_backward: dict[int, int] = {}
        weight_grads: dict[int, list[int]] = {}
        last_reduce: dict[int, int] = {}
        for i, a in enumerate(program):
            pos.setdefault(a, i)
            if a.op in WEIGHT_GRAD_OPS:
                last_backward[a.unit] = i
                weight_grads.setdefault(a.unit, []).append(a.mb)
            if a.op is Op.WAIT_GRAD_REDUCE:
                last_reduce[a.unit] = i
        last_sync = max([pos.get(Action(op, u), -1) for u in units
                         for op in (Op.WAIT_GRAD_SYNC, Op.WAIT_CROSS_SYNC, Op.WAIT_TIED_SYNC)]
                        + list(last_reduce.values()))
        split = {a.unit for a in pos if a.op is Op.BACKWARD_WEIGHT}
        return cls(stage, stages, units, pos, last_backward, last_sync, split, weight_grads,
                   last_reduce)

    def runs(self, a: Action) -> bool:
        return a in self.pos

    def every_backward(self, u: int) -> tuple[str, int]:
        return f"every {'BW' if u in self.split else 'B'}{u}.*", self.last_backward.get(u, -1)

    def input_grad_of(self, u: int, mb: int) -> Action:
        """The action that makes the gradient of unit u's input on mb: its B, or its BI where
        the backward is split."""
        split = Action(Op.BACKWARD_INPUT, u, mb)
        return split if self.runs(split) else Action(Op.BACKWARD, u, mb)


Need = Action | tuple[str, int]
Rule = Callable[[Action, RankContext], list[Need]]


def _nothing(a: Action, ctx: RankContext) -> list[Need]:
    return []


def _forward(a: Action, ctx: RankContext) -> list[Need]:
    """Its input: the previous unit's forward on the stage, or the received activation."""
    if a.unit - 1 in ctx.units:
        return [Action(Op.FORWARD, a.unit - 1, a.mb)]
    return [Action(Op.WAIT_RECV_ACT, a.unit - 1, a.mb)] if ctx.stage > 0 else []


def _backward(a: Action, ctx: RankContext) -> list[Need]:
    """B and BI: its forward, its recompute or reload if any, and its output's gradient."""
    needs: list[Need] = [Action(Op.FORWARD, a.unit, a.mb)]
    if ctx.runs(Action(Op.RECOMPUTE, a.unit, a.mb)):
        needs.append(Action(Op.RECOMPUTE, a.unit, a.mb))
    if ctx.runs(Action(Op.OFFLOAD, a.unit, a.mb)):
        needs.append(Action(Op.WAIT_RELOAD, a.unit, a.mb))
    if a.unit + 1 in ctx.units:
        needs.append(ctx.input_grad_of(a.unit + 1, a.mb))
    elif ctx.stage < ctx.stages - 1:
        needs.append(Action(Op.WAIT_RECV_GRAD, a.unit, a.mb))
    return needs


def _weight_grad(a: Action, ctx: RankContext) -> list[Need]:
    """B and BW fold into the unit's full-size gradient: where each micro-batch's gradient is
    reduced on its own (RS), the previous one's reduction must have completed first (it reads
    that buffer, which this backward makes anew)."""
    order = ctx.weight_grads.get(a.unit, [])
    at = order.index(a.mb) if a.mb in order else 0
    if at and ctx.runs(Action(Op.GRAD_REDUCE, a.unit, order[at - 1])):
        return [Action(Op.WAIT_GRAD_REDUCE, a.unit, order[at - 1])]
    return []


def _backward_whole(a: Action, ctx: RankContext) -> list[Need]:
    return _backward(a, ctx) + _weight_grad(a, ctx)


def _backward_weight(a: Action, ctx: RankContext) -> list[Need]:
    return [Action(Op.BACKWARD_INPUT, a.unit, a.mb)] + _weight_grad(a, ctx)


def _after(op: Op, unit_offset: int = 0) -> Rule:
    """Needs `op` of the same micro-batch on unit + `unit_offset` (what it moves or copies)."""
    def rule(a: Action, ctx: RankContext) -> list[Need]:
        return [Action(op, a.unit + unit_offset, a.mb)]
    return rule


def _send_grad(a: Action, ctx: RankContext) -> list[Need]:
    """The gradient it sends: made by the stage's first unit's B or BI."""
    return [ctx.input_grad_of(a.unit + 1, a.mb)]


def _grad_norm(a: Action, ctx: RankContext) -> list[Need]:
    needs: list[Need] = [("every B of the stage", max(ctx.last_backward.values(), default=-1)),
                         ("every WGS and WRS of the stage", ctx.last_sync)]
    return needs + [Action(Op.WAIT_NORM, u) for u in ctx.units
                    if ctx.runs(Action(Op.START_NORM, u))]


def _unit_norm(a: Action, ctx: RankContext) -> list[Need]:
    """What U needs but the global norm: the unit's final gradient."""
    return [n for n in _update(a, ctx) if n != Action(Op.WAIT_GRAD_NORM)]


def _cross_sync(a: Action, ctx: RankContext) -> list[Need]:
    """The shard's gradient, reduced within its group: the unit's sync waited (WGS, or every
    WRS of the unit)."""
    if a.unit in ctx.last_reduce:
        return [(f"every WRS{a.unit}.*", ctx.last_reduce[a.unit])]
    return [Action(Op.WAIT_GRAD_SYNC, a.unit)]


def _tied_sync(a: Action, ctx: RankContext) -> list[Need]:
    """The unit's own gradient, final and summed over the replicas (its WGS, where it has
    one)."""
    synced = Action(Op.WAIT_GRAD_SYNC, a.unit)
    return [ctx.every_backward(a.unit)] + ([synced] if ctx.runs(synced) else [])


def _update(a: Action, ctx: RankContext) -> list[Need]:
    """The global norm if the program reduces one; its synced gradient, else every backward."""
    needs: list[Need] = []
    if ctx.runs(Action(Op.WAIT_GRAD_NORM)) or ctx.runs(Action(Op.GRAD_NORM)):
        needs.append(Action(Op.WAIT_GRAD_NORM))
    if ctx.runs(Action(Op.CROSS_SYNC, a.unit)):
        needs.append(Action(Op.WAIT_CROSS_SYNC, a.unit))
    if ctx.runs(Action(Op.TIED_SYNC, a.unit)):
        needs.append(Action(Op.WAIT_TIED_SYNC, a.unit))
    if ctx.runs(Action(Op.WAIT_GRAD_SYNC, a.unit)):
        needs.append(Action(Op.WAIT_GRAD_SYNC, a.unit))
    elif a.unit in ctx.last_reduce:
        needs.append((f"every WRS{a.unit}.*", ctx.last_reduce[a.unit]))
        needs.append(ctx.every_backward(a.unit))
    else:
        needs.append(ctx.every_backward(a.unit))
    return needs


def _updated(a: Action, ctx: RankContext) -> list[Need]:
    """Where the unit's update is carried into the next step (SU), the previous step's update
    waited for (WU) before the masters are read: the view made from them, or the forward."""
    return [Action(Op.WAIT_UPDATE, a.unit)] if ctx.runs(Action(Op.START_UPDATE, a.unit)) else []


NEEDS: dict[Op, Rule] = {
    Op.FORWARD: lambda a, ctx: _forward(a, ctx) + _updated(a, ctx),
    Op.BACKWARD: _backward_whole,
    Op.BACKWARD_INPUT: _backward,
    Op.BACKWARD_WEIGHT: _backward_weight,
    Op.RECOMPUTE: _after(Op.FORWARD),
    Op.SEND_ACT: _after(Op.FORWARD),
    Op.WAIT_SEND_ACT: _nothing,
    Op.RECV_ACT: _nothing,
    Op.WAIT_RECV_ACT: _nothing,
    Op.SEND_GRAD: _send_grad,
    Op.WAIT_SEND_GRAD: _nothing,
    Op.RECV_GRAD: _nothing,
    Op.WAIT_RECV_GRAD: _nothing,
    Op.GRAD_SYNC: lambda a, ctx: [ctx.every_backward(a.unit)],
    Op.WAIT_GRAD_SYNC: _nothing,
    Op.GRAD_REDUCE: lambda a, ctx: [Action(Op.BACKWARD_WEIGHT if a.unit in ctx.split
                                           else Op.BACKWARD, a.unit, a.mb)],
    Op.WAIT_GRAD_REDUCE: _nothing,
    Op.CROSS_SYNC: _cross_sync,
    Op.WAIT_CROSS_SYNC: _nothing,
    Op.GRAD_NORM: _grad_norm,
    Op.WAIT_GRAD_NORM: _nothing,
    Op.UPDATE: _update,
    Op.START_UPDATE: _update,
    Op.WAIT_UPDATE: _nothing,
    Op.START_NORM: _unit_norm,
    Op.WAIT_NORM: _nothing,
    Op.OFFLOAD: _after(Op.FORWARD),
    Op.RELOAD: _after(Op.OFFLOAD),
    Op.WAIT_RELOAD: _after(Op.RELOAD),
    Op.PREFETCH: _updated,
    Op.WAIT_PREFETCH: _nothing,
    Op.RELEASE: _nothing,
    Op.STEP_END: _nothing,
    # the outer delta reads the local parameters as the last update left them; the merge
    # writes them, so it goes after the unit's update (schedule/outer_sync.py places both)
    Op.OUTER_SYNC: _nothing,
    Op.WAIT_OUTER_SYNC: lambda a, ctx: [Action(Op.UPDATE, a.unit)],
    Op.TIED_SYNC: _tied_sync,
    Op.WAIT_TIED_SYNC: _nothing,
}

if set(NEEDS) != set(Op):
    raise ImportError(f"schedule/needs.py: no rule for {sorted(o.name for o in set(Op) - set(NEEDS))}")
