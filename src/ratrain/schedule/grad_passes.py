"""The passes of the gradients: each unit's data-parallel gradient sync, its waits, and the
optimizer updates that read the synchronized gradients (policies.py runs them in its order).
Like every pass (passes.py), each takes the programs of all stages and returns new ones with
actions added, anchored on the compute actions and the pipeline-flush point.
"""

from __future__ import annotations

import bisect

from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import COMPUTE_OPS, INPUT_GRAD_OPS, WAIT_OF, WEIGHT_GRAD_OPS, Op
from ratrain.schedule.passes import add_step_end, after_compute, insert_at


def _flush_point(program: Program) -> int:
    """Index just after the stage's last backward and what it triggers (see after_compute):
    the pipeline flush, where every gradient of the stage has been accumulated. Waits already
    placed there (the previous gradient send's) move after what is inserted."""
    backward = INPUT_GRAD_OPS | WEIGHT_GRAD_OPS
    return after_compute(program, max(i for i, a in enumerate(program) if a.op in backward))


def _last_backwards(program: Program) -> dict[int, int]:
    """Unit -> index of its last backward in the program (B, or BW where it is split): where
    its gradient becomes final."""
    return {a.unit: i for i, a in enumerate(program) if a.op in WEIGHT_GRAD_OPS}


def _final_order(program: Program, units: range) -> list[int]:
    """The stage's units in the order their gradients become final (their last backwards)."""
    last_backward = _last_backwards(program)
    return sorted(units, key=last_backward.__getitem__)


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
            at.setdefault(after_compute(program, i), []).append(Action(Op.GRAD_SYNC, u))
        out.append(insert_at(program, at))
    return out


def add_micro_batch_grad_sync(programs: list[Program], dp: int) -> list[Program]:
    """Per-micro-batch gradient reduction (`ratrain`, sharded state, gradient lifetime
    "micro-batch"; nothing when dp == 1), in place of add_unit_grad_sync: `RS u.m` right after
    each backward of unit u that accumulates its gradient (B, or BW where split), so the
    replicas reduce-scatter that micro-batch's full-size gradient while the stage computes on.
    add_early_sync_waits places the waits."""
    if dp == 1:
        return [list(program) for program in programs]
    out = []
    for program in programs:
        at: dict[int, list[Action]] = {}
        for i, a in enumerate(program):
            if a.op in WEIGHT_GRAD_OPS:
                at.setdefault(after_compute(program, i), []).append(
                    Action(Op.GRAD_REDUCE, a.unit, a.mb))
        out.append(insert_at(program, at))
    return out


def add_early_sync_waits(programs: list[Program]) -> list[Program]:
    """The wait of every gradient sync (GS u, or RS u.m) right after the stage's next compute
    action: a gradient lifetime shorter than the step frees the unit's full-size gradient at
    that wait, so waiting early keeps about two alive, not one per unit, at the price of
    exposing a sync that one compute action does not hide. Where that next action is the
    unit's own next backward (it makes a new full-size gradient), right before it. A wait that
    would land at the pipeline flush is left to add_unit_update, which places it with the
    update."""
    out = []
    for program in programs:
        flush = _flush_point(program)
        computes = [i for i, a in enumerate(program) if a.op in COMPUTE_OPS]
        at: dict[int, list[Action]] = {}
        latest = None  # index of the latest compute action
        for k, a in enumerate(program):
            if a.op in COMPUTE_OPS:
                latest = k
            if a.op not in (Op.GRAD_SYNC, Op.GRAD_REDUCE) or latest is None:
                continue
            n = bisect.bisect_right(computes, latest)
            if n == len(computes):
                continue
            nxt = program[computes[n]]
            same = nxt.op in WEIGHT_GRAD_OPS and nxt.unit == a.unit
            i = computes[n] if same else after_compute(program, computes[n])
            if i < flush:
                at.setdefault(i, []).append(Action(WAIT_OF[a.op], a.unit, a.mb))
        out.append(insert_at(program, at))
    return out


def add_unit_update(programs: list[Program], stage_units: list[range], dp: int,
                    clip: bool) -> list[Program]:
    """Per-unit optimizer updates (`ratrain`), then `E`.

    Everything goes at the stage's flush point (after its last backward and the gradient send
    that the previous stage waits for: an update placed earlier would delay that send, which
    is on the critical path; on stage 0 nothing waits for it, so earlier gains nothing either).
    Syncs complete in the order they were started (they share one link), so the stage waits for
    them in that order, each as late as the program allows:

    * no clipping: `WGS u` (dp > 1; or the wait of the unit's last `RS u.m`; unless
      add_early_sync_waits placed it already) then `U u` for each unit in the order its gradient became
      final, so each update runs while the later units' syncs are still in flight; a stage
      updates on its own timeline while earlier stages still run their cool-down backwards.
    * clipping: the coefficient needs the global norm, that is every unit's synchronized
      gradient on every stage. The stage waits for its syncs, starts the reduction of its
      squared norm over the pipeline (`N`), waits for it (`WN`), then updates its units. The
      syncs still overlap the backward; only the updates wait for the norm.
    """
    out = []
    for program, units in zip(programs, stage_units):
        placed = set(program)
        unwaited = {a.unit: Action(WAIT_OF[a.op], a.unit, a.mb) for a in program
                    if a.op in (Op.GRAD_SYNC, Op.GRAD_REDUCE)
                    and Action(WAIT_OF[a.op], a.unit, a.mb) not in placed}

        def wait(u: int) -> list[Action]:
            return [unwaited[u]] if u in unwaited else []

        order = _final_order(program, units)
        if clip:
            norm = [Action(Op.GRAD_NORM), Action(Op.WAIT_GRAD_NORM)]
            tail = [w for u in order for w in wait(u)] + norm + [Action(Op.UPDATE, u) for u in order]
        else:
            tail = [a for u in order for a in wait(u) + [Action(Op.UPDATE, u)]]
        out.append(insert_at(program, {_flush_point(program): tail}))
    return add_step_end(out)


def add_cross_sync(programs: list[Program]) -> list[Program]:
    """Hybrid sharding (`ratrain`): a unit's shard gradient, summed within its shard group by
    the reduce-scatter, still has to be summed over the groups. `GX u` right after the wait of
    the unit's last sync (WGS u, or its last WRS), so the all-reduce across the groups starts as
    soon as the shard is reduced within its own; `WGX u` right before the first action that
    reads the shard's gradient: the norm's `N`, or `U u`. Run after add_unit_update."""
    out = []
    for program in programs:
        final: dict[int, int] = {}  # unit -> index of the wait of its last sync
        for i, a in enumerate(program):
            if a.op in (Op.WAIT_GRAD_SYNC, Op.WAIT_GRAD_REDUCE):
                final[a.unit] = i
        at: dict[int, list[Action]] = {}
        for u, i in final.items():
            at.setdefault(i + 1, []).append(Action(Op.CROSS_SYNC, u))
            reader = next(j for j in range(i + 1, len(program))
                          if program[j] in (Action(Op.GRAD_NORM), Action(Op.UPDATE, u)))
            at.setdefault(reader, []).append(Action(Op.WAIT_CROSS_SYNC, u))
        # a start goes in front of a wait placed at the same spot
        out.append(insert_at(program, {i: sorted(acts, key=lambda a: a.op is Op.WAIT_CROSS_SYNC)
                                       for i, acts in at.items()}))
    return out
