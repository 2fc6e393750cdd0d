"""Passes: pure functions that take the programs of all stages and return new ones with actions
added. A builder's compute-only programs go through them in this order (plan.py composes them
into policies):

    baseline:  add_activation_policy -> add_p2p -> add_grad_sync -> add_update
    ratrain:   add_activation_policy -> add_p2p -> add_unit_grad_sync -> add_unit_update

(both updates end with add_step_end). Each pass anchors what it adds on the compute actions
(F, B, R) and on the pipeline-flush point, so later lifecycle passes (parameter-view
prefetch/release, activation offload/reload) slot in between without moving what is already
placed. Inputs are never modified.
"""

from __future__ import annotations

from ratrain.schedule.ir import Action, Op, Program


def add_activation_policy(programs: list[Program], recompute_units: set[int]) -> list[Program]:
    """Recompute: add `R u.m` right before `B u.m` for every unit u in `recompute_units`.

    The forward of a recomputed unit keeps only its input; R re-runs it just in time for the
    backward, so at most one micro-batch's recomputed activations of that unit are alive. Run
    this before add_p2p: the wait for the output gradient then lands between R and B, and the
    recompute of the stage's last unit overlaps the gradient still in flight.
    """
    out = []
    for program in programs:
        new: Program = []
        for a in program:
            if a.op is Op.BACKWARD and a.layer in recompute_units:
                new.append(Action(Op.RECOMPUTE, a.layer, a.mb))
            new.append(a)
        out.append(new)
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
    * gradient receive (s < p - 1): the same with `RG last.*`/`WRG last.*` around `B last.m`:
      `RG last.m0` opens the program (after `RA`), `WRG last.m` right before `B last.m`, then
      `RG last.m'` for the next backward micro-batch.
    * activation send (s < p - 1): `SA last.m` right after `F last.m`; the wait for the previous
      send `WSA last.(m-1)` right after it (the new send is never delayed by the old one's
      wait; at most two are outstanding), the last one at the end of the program.
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


def _next_in_order(program: Program, op: Op, layer: int) -> tuple[list[int], dict[int, int]]:
    order = [a.mb for a in program if a.op is op and a.layer == layer]
    return order, dict(zip(order, order[1:]))


def _stage_p2p(program: Program, s: int, units: range, p: int) -> Program:
    first, last, x = units[0], units[-1], units[0] - 1
    receives_act, sends_act = s > 0, s < p - 1
    fwd_order, next_fwd = _next_in_order(program, Op.FORWARD, first)
    bwd_order, next_bwd = _next_in_order(program, Op.BACKWARD, last)

    out: Program = []
    if receives_act and fwd_order:
        out.append(Action(Op.RECV_ACT, x, fwd_order[0]))
    if sends_act and bwd_order:
        out.append(Action(Op.RECV_GRAD, last, bwd_order[0]))
    sent_act = sent_grad = None  # micro-batch of the send still to be waited
    for a in program:
        if a.op is Op.FORWARD and a.layer == first and receives_act:
            out.append(Action(Op.WAIT_RECV_ACT, x, a.mb))
            if a.mb in next_fwd:
                out.append(Action(Op.RECV_ACT, x, next_fwd[a.mb]))
        if a.op is Op.BACKWARD and a.layer == last and sends_act:
            out.append(Action(Op.WAIT_RECV_GRAD, last, a.mb))
            if a.mb in next_bwd:
                out.append(Action(Op.RECV_GRAD, last, next_bwd[a.mb]))
        out.append(a)
        if a.op is Op.FORWARD and a.layer == last and sends_act:
            out.append(Action(Op.SEND_ACT, last, a.mb))
            if sent_act is not None:
                out.append(Action(Op.WAIT_SEND_ACT, last, sent_act))
            sent_act = a.mb
        if a.op is Op.BACKWARD and a.layer == first and receives_act:
            out.append(Action(Op.SEND_GRAD, x, a.mb))
            if sent_grad is not None:
                out.append(Action(Op.WAIT_SEND_GRAD, x, sent_grad))
            sent_grad = a.mb
    if sent_act is not None:
        out.append(Action(Op.WAIT_SEND_ACT, last, sent_act))
    if sent_grad is not None:
        out.append(Action(Op.WAIT_SEND_GRAD, x, sent_grad))
    return out


def _flush_point(program: Program) -> int:
    """Index just after the stage's last backward and what it triggers (see _after_backward):
    the pipeline flush, where every gradient of the stage has been accumulated. Waits already
    placed there (the previous gradient send's) move after what is inserted."""
    return _after_backward(program, max(i for i, a in enumerate(program) if a.op is Op.BACKWARD))


def _last_backwards(program: Program) -> dict[int, int]:
    """Unit -> index of its last backward in the program."""
    return {a.layer: i for i, a in enumerate(program) if a.op is Op.BACKWARD}


def _final_order(program: Program, units: range) -> list[int]:
    """The stage's units in the order their gradients become final (their last backwards)."""
    last_backward = _last_backwards(program)
    return sorted(units, key=last_backward.__getitem__)


def _after_backward(program: Program, i: int) -> int:
    """Index just after the backward at i and what it triggers: the gradient send to the
    previous stage (which that stage waits for, so nothing goes in front of it) and the
    gradient syncs already placed there."""
    i += 1
    while i < len(program) and program[i].op in (Op.SEND_GRAD, Op.GRAD_SYNC):
        i += 1
    return i


def _insert(program: Program, at: dict[int, list[Action]]) -> Program:
    """`program` with `at[i]` inserted before its i-th action (i == len(program): at the end)."""
    out: Program = []
    for i, a in enumerate(program):
        out += at.get(i, [])
        out.append(a)
    return out + at.get(len(program), [])


def add_grad_sync(programs: list[Program], stage_units: list[range], dp: int) -> list[Program]:
    """Baseline data-parallel gradient synchronization (nothing when dp == 1).

    At the pipeline flush (after the stage's last backward and the start of its gradient send to
    the previous stage, which that stage is waiting for) start `GS u` for every unit of the stage
    in the order its gradient became final (order of its last backward: decreasing unit index),
    then all the waits `WGS u` in the same order, so the all-reduces are all in flight together.
    """
    if dp == 1:
        return [list(program) for program in programs]
    out = []
    for program, units in zip(programs, stage_units):
        final_order = _final_order(program, units)
        at = _flush_point(program)
        syncs = [Action(Op.GRAD_SYNC, u) for u in final_order]
        waits = [Action(Op.WAIT_GRAD_SYNC, u) for u in final_order]
        out.append(program[:at] + syncs + waits + program[at:])
    return out


def add_update(programs: list[Program], stage_units: list[range], clip: bool) -> list[Program]:
    """One optimizer step at the end of the step (baseline).

    Appends, on every stage: `N WN` when clipping (the global gradient norm reduced over all
    stages, placed after everything the stage does with gradients: its last backward, its grad
    syncs and their waits), then `U u` for every unit of the stage in increasing order, then `E`.
    """
    norm = [Action(Op.GRAD_NORM), Action(Op.WAIT_GRAD_NORM)] if clip else []
    return add_step_end([
        program + norm + [Action(Op.UPDATE, u) for u in units]
        for program, units in zip(programs, stage_units)
    ])


def add_unit_grad_sync(programs: list[Program], dp: int) -> list[Program]:
    """Per-unit data-parallel gradient sync (`ratrain`; nothing when dp == 1).

    `GS u` right after unit u's last backward of the step on its stage (after the gradient send
    that backward triggers), so each unit's all-reduce runs under the backwards still to come on
    that stage; no stage waits for another. Waits are placed by add_unit_update.
    """
    if dp == 1:
        return [list(program) for program in programs]
    out = []
    for program in programs:
        at: dict[int, list[Action]] = {}
        for u, i in _last_backwards(program).items():
            at.setdefault(_after_backward(program, i), []).append(Action(Op.GRAD_SYNC, u))
        out.append(_insert(program, at))
    return out


def add_unit_update(programs: list[Program], stage_units: list[range], dp: int,
                    clip: bool) -> list[Program]:
    """Per-unit optimizer updates (`ratrain`), then `E`.

    Everything goes at the stage's flush point (after its last backward and the gradient send
    that the previous stage waits for: an update placed earlier would delay that send, which
    is on the critical path; on stage 0 nothing waits for it, so earlier gains nothing either).
    Syncs complete in the order they were started (they share one link), so the stage waits for
    them in that order, each as late as the program allows:

    * no clipping: `WGS u` (dp > 1) then `U u` for each unit in the order its gradient became
      final, so each update runs while the later units' syncs are still in flight; a stage
      updates on its own timeline while earlier stages still run their cool-down backwards.
    * clipping: the coefficient needs the global norm, that is every unit's synchronized
      gradient on every stage. The stage waits for its syncs, starts the reduction of its
      squared norm over the pipeline (`N`), waits for it (`WN`), then updates its units. The
      syncs still overlap the backward; only the updates wait for the norm.
    """
    def wait(u: int) -> list[Action]:
        return [Action(Op.WAIT_GRAD_SYNC, u)] if dp > 1 else []

    out = []
    for program, units in zip(programs, stage_units):
        order = _final_order(program, units)
        if clip:
            norm = [Action(Op.GRAD_NORM), Action(Op.WAIT_GRAD_NORM)]
            tail = [w for u in order for w in wait(u)] + norm + [Action(Op.UPDATE, u) for u in order]
        else:
            tail = [a for u in order for a in wait(u) + [Action(Op.UPDATE, u)]]
        out.append(_insert(program, {_flush_point(program): tail}))
    return add_step_end(out)


def add_step_end(programs: list[Program]) -> list[Program]:
    """Append `E` (a collective over the pipeline stages that reduces the step's loss) to every
    program; nothing may follow it."""
    return [program + [Action(Op.STEP_END)] for program in programs]
