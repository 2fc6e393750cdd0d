"""Schedule builders: the compute-only program of every pipeline stage (F and B actions only;
a split schedule's backward is BI and BW).

A builder fixes the order in which a stage runs its micro-batches; the passes (passes.py) then
add communication and training-state actions around that order. A stage owns a contiguous range
of units (0 = embedding, 1..n = decoder blocks, n+1 = head). "Forward of micro-batch m" on a
stage is `F u.m` for each of its units in increasing order; "backward of m" is `B u.m` in
decreasing order, because each unit's backward needs the gradient of its output, which the next
unit's backward produces.
"""

from __future__ import annotations

import functools

from ratrain.counts import model_units
from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Action, Op, Program


def partition_units(
    n_layers: int, pp: int, units_per_stage: list[int] | None = None
) -> list[range]:
    """Split the n_layers + 2 units into pp contiguous stages.

    Default: the embedding on stage 0, the head on the last stage, and the decoder blocks split as
    evenly as possible, the remainder going to the earliest stages (in 1F1B they also hold the
    most micro-batches in flight, but the embedding and head are cheap in compute next to a
    block, so blocks are what balance the pipeline). When pp equals the number of units the only
    partition is one unit per stage. An explicit `units_per_stage` counts the embedding and the
    head, and must have pp entries, each >= 1, summing to n_layers + 2.
    """
    n_units = n_layers + 2
    if n_layers < 1:
        raise ScheduleConfigError(f"n_layers must be >= 1, got {n_layers}")
    if pp < 1:
        raise ScheduleConfigError(f"pp must be >= 1, got {pp}")
    if pp > n_units:
        raise ScheduleConfigError(
            f"pp={pp} is more stages than the model has units ({n_units}: "
            f"{model_units(n_layers)}); lower pp to at most {n_units}"
        )
    if units_per_stage is None:
        if pp == n_units:
            units_per_stage = [1] * pp
        else:
            base, extra = divmod(n_layers, pp)
            units_per_stage = [base + (s < extra) for s in range(pp)]
            units_per_stage[0] += 1  # embedding
            units_per_stage[-1] += 1  # head
    else:
        units_per_stage = list(units_per_stage)
        if len(units_per_stage) != pp:
            raise ScheduleConfigError(
                f"units_per_stage {units_per_stage} has {len(units_per_stage)} entries for pp={pp}"
            )
        if any(k < 1 for k in units_per_stage):
            raise ScheduleConfigError(
                f"units_per_stage {units_per_stage}: every stage needs at least one unit"
            )
        if sum(units_per_stage) != n_units:
            raise ScheduleConfigError(
                f"units_per_stage {units_per_stage} sums to {sum(units_per_stage)}, but the model "
                f"has {n_units} units (embedding + {n_layers} decoder blocks + head)"
            )
    stages, start = [], 0
    for k in units_per_stage:
        stages.append(range(start, start + k))
        start += k
    return stages


def first_units(stage_units: list[range], k: int) -> tuple[int, ...]:
    """The first k units of each stage (all of a stage's where it has fewer): the units a
    plan keeps on the device under `--device-units k` (PipelinePlan.device_units)."""
    return tuple(u for units in stage_units for u in units[:k])


def _forward(units: range, m: int) -> Program:
    return [Action(Op.FORWARD, u, m) for u in units]


def _backward(units: range, m: int) -> Program:
    return [Action(Op.BACKWARD, u, m) for u in reversed(units)]


def one_f_one_b_warmup(stage: int, pp: int, n_micro: int) -> int:
    """1F1B: the forwards stage `stage` of `pp` runs before its steady state (warm-up)."""
    return min(pp - stage - 1, n_micro)


def one_f_one_b_in_flight(stage: int, pp: int, n_micro: int) -> int:
    """1F1B: the micro-batches stage `stage` of `pp` has run forward when its first backward
    begins (the warm-up and the steady state's first forward): the most it ever holds."""
    return min(one_f_one_b_warmup(stage, pp, n_micro) + 1, n_micro)


@functools.lru_cache(maxsize=256)
def one_f_one_b_order(stage: int, pp: int, n_micro: int) -> tuple[tuple[bool, int], ...]:
    """1F1B's order on stage `stage` of `pp`: (is a forward, micro-batch) for each of its 2 x
    n_micro forwards and backwards, in the order the stage runs them (`one_f_one_b`). The
    planner's bounds walk the same order (planner/bounds.py)."""
    warmup = one_f_one_b_warmup(stage, pp, n_micro)
    order = [(True, m) for m in range(warmup)]
    for m in range(n_micro - warmup):
        order += [(True, m + warmup), (False, m)]
    order += [(False, m) for m in range(n_micro - warmup, n_micro)]
    return tuple(order)


def one_f_one_b(stage_units: list[range], n_micro: int) -> list[Program]:
    """Non-interleaved 1F1B (PipeDream-Flush), one program per stage.

    Stage s of p runs `min(p - s - 1, n_micro)` warm-up forwards, then alternates one forward and
    one backward (steady state: forward of m + warm-up, then backward of m), then the remaining
    backwards (cool-down): `one_f_one_b_order`. Backwards run in micro-batch order. A
    micro-batch is in flight on a stage from its first forward to its last backward; stage s
    never holds more than p - s (`one_f_one_b_in_flight`).
    """
    p = len(stage_units)
    return [[a for forward, m in one_f_one_b_order(s, p, n_micro)
             for a in (_forward(units, m) if forward else _backward(units, m))]
            for s, units in enumerate(stage_units)]


@functools.lru_cache(maxsize=256)
def zbh1_order(stage: int, pp: int, n_micro: int,
               lag: int | None = None) -> tuple[tuple[Op, int], ...]:
    """ZB-H1's order on stage `stage` of `pp`: (F, BI or BW, micro-batch) for each of its 3 x
    n_micro actions (`zbh1`), each BW deferred by `lag` micro-batches (None: by `stage`)."""
    lag = stage if lag is None else lag
    warmup = one_f_one_b_warmup(stage, pp, n_micro)
    order = [(Op.FORWARD, m) for m in range(warmup)]
    deferred: list[int] = []  # micro-batches whose BW is still to run, oldest first

    def backward(m: int) -> None:
        order.append((Op.BACKWARD_INPUT, m))
        deferred.append(m)
        if len(deferred) > lag:
            order.append((Op.BACKWARD_WEIGHT, deferred.pop(0)))

    for m in range(n_micro - warmup):
        order.append((Op.FORWARD, m + warmup))
        backward(m)
    for m in range(n_micro - warmup, n_micro):
        backward(m)
    order += [(Op.BACKWARD_WEIGHT, m) for m in deferred]
    return tuple(order)


def zbh1_program(units: range, stage: int, pp: int, n_micro: int,
                 lag: int | None = None) -> Program:
    """Stage `stage`'s program under ZB-H1 (`zbh1_order`): forwards over its units in
    increasing order, BIs and BWs in decreasing order."""
    return [Action(op, u, m) for op, m in zbh1_order(stage, pp, n_micro, lag)
            for u in (units if op is Op.FORWARD else reversed(units))]


def zbh1(stage_units: list[range], n_micro: int) -> list[Program]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each
    backward split into BI (the input gradient, which the previous unit and stage wait for)
    and BW (the weight gradient, which nothing but the unit's own sync waits for).

    Forwards and BIs run in 1F1B's order (`one_f_one_b_order`, B read as BI), so the input
    gradients travel back through the pipeline faster than 1F1B's whole backwards do. Stage s
    defers its BWs by s micro-batches: the first BW follows its (s + 1)-th BI, then one BW
    follows each BI, and the s still deferred run after the last BI, in the cool-down bubble
    that 1F1B leaves on the later stages (stage s of p idles there about s backwards). Each
    stage then holds 1F1B's count of whole micro-batches and up to s past BI, each of those
    keeping only what BW reads (the inputs of the ops that read a weight) and BW's seeds: the
    stages' peak is about 1F1B's, which is stage 0's, and stage s > 0 holds more than under
    1F1B. With equal F, BI and BW times the bubble is a third of 1F1B's. (A placement may
    defer fewer: schedule/weight_grads.py, "bubble:K".)
    """
    p = len(stage_units)
    return [zbh1_program(units, s, p, n_micro) for s, units in enumerate(stage_units)]


def gpipe(stage_units: list[range], n_micro: int) -> list[Program]:
    """GPipe: every forward, then every backward, one program per stage.

    Backwards run in micro-batch order m = 0..n-1 (as torch.distributed.pipelining's
    ScheduleGPipe does): the last stage starts backward on the micro-batch whose forward finished
    first, and every stage receives gradients in the order the next stage sends them. All n_micro
    micro-batches are in flight on every stage at the turn.
    """
    return [
        [a for m in range(n_micro) for a in _forward(units, m)]
        + [a for m in range(n_micro) for a in _backward(units, m)]
        for units in stage_units
    ]


def forward_only(stage_units: list[range], n_micro: int) -> list[Program]:
    """Evaluation: the forward of every micro-batch in order, nothing else."""
    return [[a for m in range(n_micro) for a in _forward(units, m)] for units in stage_units]
