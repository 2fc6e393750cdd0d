"""The unit-major order: micro-batches in groups of g, each group run through a stage unit by
unit, and where a unit's gradient folds into its state's accumulation.

Under 1F1B a stage runs micro-batch by micro-batch, so with a view window every backward and
every forward of every micro-batch is a run of one unit of its own, and each run makes the
unit's view again (2m views of a unit a step) and folds the unit's gradient (m folds). Here a
stage runs group by group in 1F1B's order over the groups (`one_f_one_b_order` with m / g
"micro-batches"); inside a group it runs unit k for each of the group's micro-batches before
unit k + 1 (forward), and unit k + 1 before unit k (backward, each micro-batch's recompute or
reload right before its backward). Each unit's forward and backward of a group are then one
run each: with a window, its view is made about 2 m / g times a step (the last unit's forward
and backward runs meet, so it keeps its view across them), and its gradient folds m / g times.
g = 1 is 1F1B; g = m on one stage is every forward unit by unit, then every backward.

What it costs: a stage holds g times 1F1B's micro-batches in flight (each unit's input and
what it keeps, for g micro-batches, or each recomputed unit's input only), and where the
accumulation lives across a host link, a fp32 gradient of the unit being backwarded on the
device during its run (`fold_roles`).

Pure: no torch.
"""

from __future__ import annotations

from ratrain.schedule.builders import one_f_one_b_order
from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Action, Op, Program
from ratrain.schedule.ops import COMPUTE_OPS, WEIGHT_GRAD_OPS


def group_refusal(group: int, n_micro: int, pp: int, schedule: str) -> str | None:
    """Why micro-batch groups of `group` cannot run with these choices, or None."""
    if group < 1:
        return f"--micro-batch-group must be >= 1, got {group}"
    if group == 1:
        return None
    if schedule != "1f1b":
        return (f"--micro-batch-group {group} runs 1F1B over groups; schedule {schedule!r} has "
                f"its own order (use --schedule 1f1b, or leave the group at 1)")
    if n_micro % group:
        return (f"--micro-batch-group {group} must divide the {n_micro} micro-batches a replica "
                f"runs per step")
    return None


def check_group(group: int, n_micro: int, pp: int, schedule: str) -> None:
    reason = group_refusal(group, n_micro, pp, schedule)
    if reason:
        raise ScheduleConfigError(reason)


def unit_major_order(stage: int, pp: int, n_micro: int,
                     group: int) -> list[tuple[bool, list[int]]]:
    """(is a forward, the group's micro-batches) in the order stage `stage` runs them: 1F1B's
    order over the n_micro / group groups."""
    groups = [list(range(i * group, (i + 1) * group)) for i in range(n_micro // group)]
    return [(forward, groups[i]) for forward, i in one_f_one_b_order(stage, pp, len(groups))]


def unit_major(stage_units: list[range], n_micro: int, group: int) -> list[Program]:
    """The compute-only programs of every stage in the unit-major order (module docstring)."""
    p = len(stage_units)
    programs = []
    for s, units in enumerate(stage_units):
        program: Program = []
        for forward, mbs in unit_major_order(s, p, n_micro, group):
            op, order = (Op.FORWARD, units) if forward else (Op.BACKWARD, reversed(units))
            program += [Action(op, u, mb) for u in order for mb in mbs]
        programs.append(program)
    return programs


def post_group_receives(programs: list[Program], group: int) -> list[Program]:
    """Each group's receives (RA, RG) posted together, where its first one is (add_p2p posts
    one ahead of its use). A stage sends a group's g activations or gradients back to back
    while its neighbour may be in the other direction's group: with one receive posted at a
    time, at most two sends of a burst can be outstanding, and 1F1B over groups of 4 then
    deadlocks (the dry run: stage 0 waits for its fifth activation's send while stage 1 waits
    for its gradients' receives, which stage 0 posts after its forwards). Posting the group's
    receives at once holds g receive buffers, not one."""
    if group == 1:
        return programs
    return [_post_together(program, group) for program in programs]


def _post_together(program: Program, group: int) -> Program:
    moved: dict[Action, list[Action]] = {}  # a group's first receive -> the rest of its group
    for a in program:
        if a.op in (Op.RECV_ACT, Op.RECV_GRAD) and a.mb % group:
            moved.setdefault(Action(a.op, a.unit, a.mb - a.mb % group), []).append(a)
    late = {a for rest in moved.values() for a in rest}
    out: Program = []
    for a in program:
        if a in late:
            continue
        out.append(a)
        out += moved.get(a, [])
    return out


HOLD, FIRST, LATER, SYNC = "hold", "first", "later", "sync"
"""A weight-gradient action's fold (fold_roles): keep its gradient on the device for the run's
next backward of the unit; fold into the step's zero accumulation; fold into it added; keep the
run's sum on the device for the unit's gradient sync, which folds it (device_grad_sum)."""


def fold_roles(program: Program,
               device_sum: frozenset[int] = frozenset()) -> dict[tuple[int, int], str]:
    """(unit, micro-batch) of every B or BW -> what it does with the unit's gradient where the
    accumulation lives across a host link (runtime/unit_state.UnitState.fold_grads; the cost
    model prices it the same way). A backward whose run (consecutive compute actions on one
    unit) has a later backward of that unit holds its gradient on the device, in fp32; the
    run's last folds it, the unit's first fold of the step into the zero accumulation (a copy),
    later ones added. Under 1F1B every backward is a run's last: each folds, as before.
    `device_sum` (PipelinePlan.summed_on_device): each of these units' one run of the step
    (one micro-batch, or one group of them all: plan_rules.device_grad_sum_refusal) keeps its
    sum on the device for the unit's gradient sync, which folds it once summed (SYNC)."""
    roles: dict[tuple[int, int], str] = {}
    folded: set[int] = set()
    pending: list[tuple[int, int]] = []  # the current run's backwards, not yet resolved
    run_unit = None
    for a in program:
        if a.op not in COMPUTE_OPS:
            continue
        if a.unit != run_unit:
            _close(pending, roles, folded, device_sum)
            run_unit = a.unit
        if a.op in WEIGHT_GRAD_OPS:
            pending.append((a.unit, a.mb))
    _close(pending, roles, folded, device_sum)
    return roles


def _close(pending: list[tuple[int, int]], roles: dict, folded: set[int],
           device_sum: frozenset[int]) -> None:
    """End a run: all but its last backward hold; the last folds (or leaves it to the sync)."""
    if not pending:
        return
    for key in pending[:-1]:
        roles[key] = HOLD
    u = pending[-1][0]
    roles[pending[-1]] = SYNC if u in device_sum else LATER if u in folded else FIRST
    folded.add(u)
    pending.clear()


def folds_a_step(program: Program, device_sum: frozenset[int] = frozenset()) -> int:
    """The most times any unit's gradient crosses into its accumulation in one step of the
    program (fold_roles: each run's last backward, or the unit's sync): what a bf16 host
    accumulation rounds (runtime/host_grad.py)."""
    counts: dict[int, int] = {}
    for (unit, _), role in fold_roles(program, device_sum).items():
        if role != HOLD:
            counts[unit] = counts.get(unit, 0) + 1
    return max(counts.values(), default=0)


def views_made(program: Program) -> dict[int, int]:
    """Unit -> how many times the program makes its view (P u)."""
    out: dict[int, int] = {}
    for a in program:
        if a.op is Op.PREFETCH:
            out[a.unit] = out.get(a.unit, 0) + 1
    return out


def check_order(programs: list[Program], stage_units: list[range], n_micro: int,
                group: int) -> str | None:
    """Why the programs' forwards and backwards are not the unit-major order of `group`
    (a plan file's claim), or None."""
    want = unit_major(stage_units, n_micro, group)
    for s, (program, expected) in enumerate(zip(programs, want)):
        got = [a for a in program if a.op in (Op.FORWARD, Op.BACKWARD)]
        if got != expected:
            return (f"micro_batch_group {group}, but stage {s}'s forwards and backwards are not "
                    f"in the unit-major order of groups of {group}")
    return None
