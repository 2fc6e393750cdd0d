"""Passes: pure functions that take the programs of all stages and return new ones with actions
added. A builder's compute-only programs go through them in this order (policies.py composes
them into policies, eval_programs.py's build_eval_programs into eval):

    baseline:  add_activation_policy -> add_p2p -> add_grad_sync -> add_update -> add_views
    ratrain:   add_activation_policy -> add_p2p -> add_unit_grad_sync -> add_unit_update
               -> add_views; with a gradient lifetime shorter than the step,
               add_early_sync_waits after the sync pass, which is add_micro_batch_grad_sync
               for lifetime "micro-batch"; with hybrid sharding, add_cross_sync after the
               update pass
    eval:      add_p2p -> add_step_end -> add_views

(both updates end with add_step_end). Each pass anchors what it adds on the compute actions
(F, R, B, or a split backward's BI and BW) and on the pipeline-flush point, so what a later pass adds slots in between without
moving what is already placed; no pass reorders the compute actions. Inputs are never modified.

Here: activation recovery, pipeline communication, the step's end, and where a pass places what
it adds (after_compute, insert_at). The gradients' passes (syncs, their waits, the updates) are
grad_passes.py's; add_views, the parameter views' pass, is view_passes.py's.
"""

from __future__ import annotations

from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import COMPUTE_OPS, INPUT_GRAD_OPS, SPECS, Op


def add_activation_policy(programs: list[Program], policy: dict[int, str]) -> list[Program]:
    """How each unit's backward gets the activations its forward saved: `policy` maps a unit to
    "keep", "recompute" or "offload" (units absent: keep). Every micro-batch of a unit is treated
    alike.

    * keep: nothing is added; F keeps what B needs on the device until B.
    * recompute: `R u.m` right before `B u.m`. F keeps only the unit's input; R re-runs the
      forward just in time, so at most one micro-batch's recomputed activations of the unit are
      alive.
    * offload: `O u.m` right after `F u.m` starts moving what F saved to the host tier (it has
      no wait: the device copy is freed once the host copy has completed). `L u.m` starts the
      reload right before the compute action that precedes `B u.m`, so the copy overlaps one
      compute action and the reloaded tensors are back on the device no earlier than that
      needs; where that action is `F u.m` itself, L follows O. `WL u.m` right before `B u.m`.

    A split backward's BI stands for B here (it is what needs the activations first; they
    stay until its BW). Run this before add_p2p: the waits for the output gradient then land
    between R (or WL) and B, so the recompute of the stage's last unit overlaps the gradient
    still in flight, and the activation send lands right after F, in front of O. Where a B gets both its own R and
    another unit's L, R comes first so that L still runs ahead of one compute action only.
    """
    return [_stage_activation(program, policy) for program in programs]


def _stage_activation(program: Program, policy: dict[int, str]) -> Program:
    def chosen(a: Action, ops: frozenset[Op], choice: str) -> bool:
        return a.op in ops and policy.get(a.unit, "keep") == choice

    backward, forward = INPUT_GRAD_OPS, frozenset({Op.FORWARD})  # a split backward: its BI

    reloads: dict[int, list[Action]] = {}  # index of the action a reload goes in front of
    previous = 0  # index of the latest compute action; none yet: the program's start
    for i, a in enumerate(program):
        if chosen(a, backward, "offload"):
            at = i if program[previous] == Action(Op.FORWARD, a.unit, a.mb) else previous
            reloads.setdefault(at, []).append(Action(Op.RELOAD, a.unit, a.mb))
        if a.op in COMPUTE_OPS:
            previous = i
    out: Program = []
    for i, a in enumerate(program):
        if chosen(a, backward, "recompute"):
            out.append(Action(Op.RECOMPUTE, a.unit, a.mb))
        out += reloads.get(i, [])
        if chosen(a, backward, "offload"):
            out.append(Action(Op.WAIT_RELOAD, a.unit, a.mb))
        out.append(a)
        if chosen(a, forward, "offload"):
            out.append(Action(Op.OFFLOAD, a.unit, a.mb))
    return out


def add_p2p(programs: list[Program], stage_units: list[range]) -> list[Program]:
    """Pipeline point-to-point communication, each transfer a start and a wait.

    For stage s of p with units [first, last] and x = first - 1 (the previous stage's last unit,
    whose output is this stage's input); micro-batch orders are taken from the program (the
    order of `F first.*` for activations, of `B last.*` for gradients):

    * activation receive (s > 0): `RA x.m0` for the first forward micro-batch opens the program;
      `WRA x.m` goes right before `F first.m`, and right after it `RA x.m'` posts the receive of
      the next forward micro-batch m'. So one activation receive is outstanding at any time and
      it is posted one whole forward ahead of its use.
    * gradient receive (s < p - 1): the same with `RG last.*`/`WRG last.*` around `B last.m`
      (split backwards: `BI last.m`, here and below):
      `RG last.m0` opens the program (after `RA`), `WRG last.m` right before `B last.m`, then
      `RG last.m'` for the next backward micro-batch.
    * activation send (s < p - 1): `SA last.m` right after `F last.m`; the wait for the previous
      send `WSA last.(m-1)` right after it and after the offload `O last.m` if there is one
      (neither start is delayed by the old send's wait; at most two sends are outstanding), the
      last one at the end of the program.
    * gradient send (s > 0): `SG x.m` right after `B first.m`, then `WSG x.(m-1)`, the last one at
      the end of the program.

    Both sides of a rank pair post their transfers in the same micro-batch order, so transports
    that match messages in posting order (gloo and NCCL without tags) pair them correctly. The
    dry run in checks.py proves every built plan deadlock-free with rendezvous sends (a send
    completes only once the peer has posted the receive); where a transport completes sends
    eagerly (buffered), waits only complete sooner, so those runs are deadlock-free too. The programs must
    not contain E yet: the last send waits are appended at the end.
    """
    p = len(stage_units)
    return [_stage_p2p(program, s, stage_units[s], p) for s, program in enumerate(programs)]


def _next_in_order(program: Program, ops: frozenset[Op],
                   layer: int) -> tuple[list[int], dict[int, int]]:
    order = [a.mb for a in program if a.op in ops and a.unit == layer]
    return order, dict(zip(order, order[1:]))


def _stage_p2p(program: Program, s: int, units: range, p: int) -> Program:
    first, last, x = units[0], units[-1], units[0] - 1
    receives_act, sends_act = s > 0, s < p - 1
    fwd_order, next_fwd = _next_in_order(program, frozenset({Op.FORWARD}), first)
    bwd_order, next_bwd = _next_in_order(program, INPUT_GRAD_OPS, last)

    out: Program = []
    if receives_act and fwd_order:
        out.append(Action(Op.RECV_ACT, x, fwd_order[0]))
    if sends_act and bwd_order:
        out.append(Action(Op.RECV_GRAD, last, bwd_order[0]))
    sent_act = sent_grad = None  # micro-batch of the send still to be waited
    held: Program = []  # the previous activation send's wait, held behind this forward's O
    for a in program:
        if held and a.op is not Op.OFFLOAD:
            out += held
            held = []
        if a.op is Op.FORWARD and a.unit == first and receives_act:
            out.append(Action(Op.WAIT_RECV_ACT, x, a.mb))
            if a.mb in next_fwd:
                out.append(Action(Op.RECV_ACT, x, next_fwd[a.mb]))
        if a.op in INPUT_GRAD_OPS and a.unit == last and sends_act:
            out.append(Action(Op.WAIT_RECV_GRAD, last, a.mb))
            if a.mb in next_bwd:
                out.append(Action(Op.RECV_GRAD, last, next_bwd[a.mb]))
        out.append(a)
        if a.op is Op.FORWARD and a.unit == last and sends_act:
            out.append(Action(Op.SEND_ACT, last, a.mb))
            if sent_act is not None:
                held = [Action(Op.WAIT_SEND_ACT, last, sent_act)]
            sent_act = a.mb
        if a.op in INPUT_GRAD_OPS and a.unit == first and receives_act:
            out.append(Action(Op.SEND_GRAD, x, a.mb))
            if sent_grad is not None:
                out.append(Action(Op.WAIT_SEND_GRAD, x, sent_grad))
            sent_grad = a.mb
    out += held
    if sent_act is not None:
        out.append(Action(Op.WAIT_SEND_ACT, last, sent_act))
    if sent_grad is not None:
        out.append(Action(Op.WAIT_SEND_GRAD, x, sent_grad))
    return out


def after_compute(program: Program, i: int) -> int:
    """Index just after the compute action at i and the starts placed right after it (eager ops
    in schedule/ops.py): after a backward, the gradient send to the previous stage (which that stage
    waits for, so nothing goes in front of it) and the gradient syncs already placed there;
    after a forward, the activation send or the offload."""
    i += 1
    while i < len(program) and SPECS[program[i].op].eager:
        i += 1
    return i


def insert_at(program: Program, at: dict[int, list[Action]]) -> Program:
    """`program` with `at[i]` inserted before its i-th action (i == len(program): at the end)."""
    out: Program = []
    for i, a in enumerate(program):
        out += at.get(i, [])
        out.append(a)
    return out + at.get(len(program), [])


def add_step_end(programs: list[Program]) -> list[Program]:
    """Append `E` (a collective over the pipeline stages that reduces the step's loss) to every
    program; nothing may follow it."""
    return [program + [Action(Op.STEP_END)] for program in programs]
