"""Tied embeddings across pipeline stages (plan field `tie_embeddings` with the embedding and
the head on different stages): the head's stage keeps a copy of the embedding's weight, and
`TS u` / `WTS u` sum the two copies' gradients over the replica's first and last stage.

The copy starts equal to the embedding (models/llama.build_unit draws it from the embedding's
generator). Each step, once a copy's gradient is final and summed over the replicas (after
`WGS u`; right after the unit's last backward when dp == 1), `TS u` starts an all-reduce of it
with the other copy's, in place; `WTS u` waits for it right before the first thing that reads
the gradient: the global norm's `N`, or without one the unit's update, which then goes last on
its stage (the first stage's embedding is the last gradient of the step to be final, so the
head's stage updates its other units meanwhile). Both copies then hold the whole model's
gradient of the tied weight and take the same AdamW step from the same state: they stay equal,
bit for bit. The global norm counts the weight once: the head's copy is left out of it
(runtime/unit_state.py). Under --sync diloco:H both copies take the same outer step at the same
step from the same outer state, so they stay equal too; streaming with several fragments would
sync them at different steps and is refused.

Megatron-LM does the same with its embedding group. Pure Python, no torch.
"""

from __future__ import annotations

from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import WEIGHT_GRAD_OPS, Op
from ratrain.schedule.outer_sync import parse_sync
from ratrain.schedule.passes import after_compute, insert_at


def tied_ends(stage_units: list[range], tie_embeddings: bool) -> dict[int, int]:
    """Stage -> the unit whose weight is tied there ({0: 0, last stage: head}) where the tie
    crosses stages; {} where it does not (untied, or both units on one stage: the head reads
    the embedding's own weight, plan_rules.shared_views)."""
    if not tie_embeddings or len(stage_units) < 2:
        return {}
    return {0: 0, len(stage_units) - 1: stage_units[-1].stop - 1}


def tied_refusal(tie_embeddings: bool, pp: int, shard_state: bool, sync: str) -> str | None:
    """Why tied embeddings cannot cross stages with these choices (one line), or None."""
    if not tie_embeddings or pp < 2:
        return None
    if shard_state:
        return ("tied embeddings across pipeline stages sum the whole tied weight's gradient "
                "between the first and last stage, which --shard-state slices over the "
                "replicas; drop --shard-state, or use --pp 1")
    outer = parse_sync(sync)
    if outer is not None and (outer.fragments or 1) > 1:
        return (f"tied embeddings across pipeline stages need the embedding and the head's copy "
                f"of it in one fragment, which --sync {sync} cuts apart (each fragment syncs at "
                f"its own step); use --sync diloco:{outer.every}, or --pp 1")
    return None


def check_tied(tie_embeddings: bool, pp: int, shard_state: bool, sync: str) -> None:
    reason = tied_refusal(tie_embeddings, pp, shard_state, sync)
    if reason:
        raise ScheduleConfigError(reason)


def add_tied_sync(programs: list[Program], stage_units: list[range],
                  tie_embeddings: bool) -> list[Program]:
    """`TS u` and `WTS u` on the two stages that hold a copy of the tied weight (module
    docstring); the programs as they are where the tie does not cross stages. Run after the
    policy's passes (it anchors on WGS, N and U)."""
    ends = tied_ends(stage_units, tie_embeddings)
    out = [list(program) for program in programs]
    for s, u in ends.items():
        out[s] = _add(out[s], u)
    return out


def _add(program: Program, u: int) -> Program:
    synced = Action(Op.WAIT_GRAD_SYNC, u)
    if synced in program:
        start = program.index(synced) + 1
    else:
        last = max(i for i, a in enumerate(program) if a.op in WEIGHT_GRAD_OPS and a.unit == u)
        start = after_compute(program, last)
    update = Action(Op.UPDATE, u)
    reader = next(i for i in range(start, len(program))
                  if program[i] in (Action(Op.GRAD_NORM), update))
    program = insert_at(program, {start: [Action(Op.TIED_SYNC, u)]})
    reader += 1
    if program[reader] == update:  # no norm: the update goes last, after the others'
        program.pop(reader)
        end = program.index(Action(Op.STEP_END))
        return insert_at(program, {end: [Action(Op.WAIT_TIED_SYNC, u), update]})
    return insert_at(program, {reader: [Action(Op.WAIT_TIED_SYNC, u)]})
