"""Checks run on every plan before anything executes.

`validate` runs, in order: the stage layout, completeness, matched pipeline communication,
start/wait pairing, per-rank dependency order, parameter-view lifetimes, and a dry run across
all pipeline ranks that proves the programs cannot deadlock. The first failure raises
ScheduleError whose message is a one-line reason followed by a step x stage table of the
programs with the offending (or, for a deadlock, every blocked) action marked `>>like this<<`.
"""

from __future__ import annotations

from collections import Counter

from ratrain.schedule.dry_run import dry_run
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ir import Action, Program
from ratrain.schedule.needs import NEEDS, RankContext
from ratrain.schedule.table import fail
from ratrain.schedule.view_checks import check_shared_gradients, check_views
from ratrain.schedule.ops import (
    CARRIED, SPECS, WAIT_OF, Op, exchanged_unit, peer_offset,
)



def validate(
    programs: list[Program],
    stage_units: list[range],
    n_micro: int,
    dp: int,
    *,
    forward_only: bool = False,
    shared: dict[int, int] | None = None,
) -> None:
    """Run every check; raise ScheduleError at the first failure. `forward_only` checks
    evaluation programs (F, activation transfers, parameter views and E only); `shared`: unit
    -> the other unit whose view its compute reads too (check_views)."""
    check_layout(programs, stage_units)
    check_completeness(programs, stage_units, n_micro, dp, forward_only=forward_only)
    check_communication(programs, stage_units)
    check_waits(programs)
    check_carried(programs)
    check_dependencies(programs, stage_units)
    check_views(programs, shared)
    check_shared_gradients(programs, shared)
    dry_run(programs)


def check_layout(programs: list[Program], stage_units: list[range]) -> None:
    """One program per stage; stages own non-empty contiguous unit ranges starting at unit 0."""
    if len(programs) != len(stage_units) or not programs:
        raise ScheduleError(
            f"{len(programs)} programs for {len(stage_units)} stages; need one per stage"
        )
    start = 0
    for s, units in enumerate(stage_units):
        if units.step != 1 or units.start != start or len(units) < 1:
            raise ScheduleError(
                f"stage {s} owns units {units}: stages must own non-empty contiguous ranges "
                f"in order, starting at unit 0 (expected a range starting at {start})"
            )
        start = units.stop


def check_completeness(
    programs: list[Program],
    stage_units: list[range],
    n_micro: int,
    dp: int,
    *,
    forward_only: bool = False,
) -> None:
    """Every stage runs exactly one F (and, training, one B) per unit and micro-batch, at most
    one R; for an offloaded (unit, micro-batch) exactly one O, L and WL, and no R (the forward
    of a recomputed one saves nothing to offload); one GS per unit iff dp > 1; one U per unit on
    every stage or on none; N on every stage or on none (its WN: check_waits); E exactly once
    and last."""
    kind = "an evaluation" if forward_only else "a training"
    all_counts = [Counter(program) for program in programs]
    for s, (program, units, counts) in enumerate(zip(programs, stage_units, all_counts)):
        for i, a in enumerate(program):
            if forward_only and not SPECS[a.op].in_eval:
                fail(programs, f"stage {s}: {a} has no place in {kind} program", {s: i})
            if SPECS[a.op].own_unit and a.unit not in units:
                fail(programs, f"stage {s}: {a} names unit {a.unit}, but stage {s} owns "
                                f"units {units.start}..{units.stop - 1}", {s: i})
            if a.mb is not None and not 0 <= a.mb < n_micro:
                fail(programs, f"stage {s}: {a} names micro-batch {a.mb}, but the step has "
                                f"{n_micro}", {s: i})
        for u in units:
            for m in range(n_micro):
                for a, expected in _compute_counts(counts, u, m, forward_only):
                    if counts[a] != expected:
                        why = "" if a.op is Op.FORWARD else " (a backward is B, or BI and BW)"
                        fail(programs, f"stage {s} runs {a} {counts[a]} times; expected "
                                        f"{'once' if expected else 'none'}{why}")
        for a, c in counts.items():
            if a.op is Op.RECOMPUTE and c > 1:
                fail(programs, f"stage {s} runs {a} {c} times; expected at most once",
                      {s: program.index(a)})
        offload_ops = (Op.OFFLOAD, Op.RELOAD, WAIT_OF[Op.RELOAD])  # all or none per (u, m)
        offloaded = sorted({(a.unit, a.mb) for a in program if a.op in offload_ops})
        for u, m in offloaded:
            for op in offload_ops:
                if counts[Action(op, u, m)] != 1:
                    fail(programs, f"stage {s} runs {Action(op, u, m)} "
                                    f"{counts[Action(op, u, m)]} times; an offloaded activation "
                                    f"takes exactly one O, L and WL")
            if counts[Action(Op.RECOMPUTE, u, m)]:
                fail(programs, f"stage {s}: {Action(Op.OFFLOAD, u, m)} and "
                                f"{Action(Op.RECOMPUTE, u, m)}: a recomputed forward saves "
                                f"nothing to offload", {s: program.index(Action(Op.OFFLOAD, u, m))})
        syncs = int(dp > 1 and not forward_only)
        for u in units:
            # once per step (GS), or once per micro-batch (RS: gradient lifetime "micro-batch")
            reduces = [counts[Action(Op.GRAD_REDUCE, u, m)] for m in range(n_micro)]
            if any(reduces):
                if counts[Action(Op.GRAD_SYNC, u)] or set(reduces) != {syncs}:
                    fail(programs, f"stage {s} reduces unit {u}'s gradient per micro-batch "
                                    f"(RS{u}.*: {reduces}) and starts GS{u} "
                                    f"{counts[Action(Op.GRAD_SYNC, u)]} times; expected one RS "
                                    f"per micro-batch and no GS with dp={dp}")
            elif counts[Action(Op.GRAD_SYNC, u)] != syncs:
                fail(programs, f"stage {s} starts GS{u} {counts[Action(Op.GRAD_SYNC, u)]} times; "
                                f"expected {syncs} with dp={dp} in {kind} program")
            if counts[Action(Op.CROSS_SYNC, u)] > syncs:
                fail(programs, f"stage {s} starts GX{u} {counts[Action(Op.CROSS_SYNC, u)]} "
                                f"times; expected at most {syncs} with dp={dp} in {kind} program")
        end = Action(Op.STEP_END)
        if counts[end] != 1 or program[-1] != end:
            marks = {s: program.index(end)} if end in program else {}
            fail(programs, f"stage {s}: E must occur exactly once, as the last action", marks)

    updates = (Op.UPDATE, Op.START_UPDATE)  # inline, or carried into the next step
    for ops, per_unit in ((updates, True), ((Op.GRAD_NORM,), False)):
        ops = tuple(op for op in ops if any(a.op is op for counts in all_counts for a in counts))
        if not ops:
            continue
        for s, (units, counts) in enumerate(zip(stage_units, all_counts)):
            for u in units if per_unit else [None]:
                runs = sum(counts[Action(op, u)] for op in ops)
                if runs != 1:
                    names = " or ".join(str(Action(op, u)) for op in ops)
                    fail(programs, f"stage {s} runs {names} {runs} times; expected once "
                                    f"(other stages run {ops[0].name})")


def _compute_counts(counts: Counter, u: int, m: int,
                    forward_only: bool) -> list[tuple[Action, int]]:
    """How often each compute action of unit u on micro-batch m must run: F once; in training,
    the backward once, whole (B) or split (BI and BW, where the program has either half)."""
    expected = [(Action(Op.FORWARD, u, m), 1)]
    if forward_only:
        return expected
    halves = [Action(Op.BACKWARD_INPUT, u, m), Action(Op.BACKWARD_WEIGHT, u, m)]
    split = any(counts[a] for a in halves)
    return expected + [(Action(Op.BACKWARD, u, m), 0 if split else 1)] + [
        (a, 1 if split else 0) for a in halves]


def check_communication(programs: list[Program], stage_units: list[range]) -> None:
    """Every pipeline send has exactly one matching receive on the neighbour and vice versa, for
    the tensor the neighbours actually exchange, and both sides post them in the same micro-batch
    order (transports match messages between a pair of ranks in posting order)."""
    p = len(programs)
    counts = [Counter(program) for program in programs]
    for s, program in enumerate(programs):
        for i, a in enumerate(program):
            peer_op = SPECS[a.op].pairs_with
            if peer_op is None:
                continue
            peer = s + peer_offset(a.op)
            if not 0 <= peer < p:
                fail(programs, f"stage {s}: {a} has no peer (stage {peer} does not exist)", {s: i})
            unit = exchanged_unit(a.op, stage_units[s])
            if a.unit != unit:
                fail(programs, f"stage {s}: {a} names unit {a.unit}, but stage {s} exchanges "
                                f"unit {unit}'s tensors with stage {peer}", {s: i})
            match = Action(peer_op, a.unit, a.mb)
            found = counts[peer][match]
            if found != 1:
                fail(programs, f"stage {s}: {a} has {found} matching {match} on stage {peer}; "
                                f"expected exactly one", {s: i})
    transfers = [(op, spec.pairs_with, peer_offset(op)) for op, spec in SPECS.items()
                 if spec.pairs_with and spec.sends]
    for s in range(p - 1):
        for send, recv, offset in transfers:
            sender, receiver = (s, s + 1) if offset > 0 else (s + 1, s)
            sends = [a.mb for a in programs[sender] if a.op is send]
            recvs = [a.mb for a in programs[receiver] if a.op is recv]
            if sends != recvs:
                k = next(k for k, (a, b) in enumerate(zip(sends, recvs)) if a != b)
                at_send = [i for i, a in enumerate(programs[sender]) if a.op is send][k]
                at_recv = [i for i, a in enumerate(programs[receiver]) if a.op is recv][k]
                fail(programs, f"stage {sender} posts {send.value} in micro-batch order {sends} "
                                f"but stage {receiver} posts {recv.value} in order {recvs}",
                      {sender: at_send, receiver: at_recv})


def check_waits(programs: list[Program]) -> None:
    """Every asynchronous start is waited exactly once, later on the same rank; no wait without
    an outstanding start. A start may repeat (a view prefetched again for the backward) once its
    previous instance has been waited. O has no wait op (the executor tracks its copy)."""
    for s, program in enumerate(programs):
        outstanding: dict[Action, int] = {}
        for i, a in enumerate(program):
            if a.op in CARRIED or SPECS[a.op].waits in CARRIED:
                continue  # check_carried
            if SPECS[a.op].starts:
                if a in outstanding:
                    fail(programs, f"stage {s}: {a} starts again before its previous start "
                                    f"(step {outstanding[a]}) was waited", {s: i})
                outstanding[a] = i
            elif SPECS[a.op].waits:
                start = Action(SPECS[a.op].waits, a.unit, a.mb)
                if outstanding.pop(start, None) is None:
                    fail(programs, f"stage {s}: {a} waits for {start}, which has not been "
                                    f"started before it", {s: i})
        for start, i in outstanding.items():
            wait = Action(WAIT_OF[start.op], start.unit, start.mb)
            fail(programs, f"stage {s}: {start} is started but never waited (no {wait} after it)",
                  {s: i})


def check_carried(programs: list[Program]) -> None:
    """A start carried into the next step (SU u) runs once, and its wait (WU u) once before it
    in the same program: the wait of step t + 1 is for the start of step t."""
    for s, program in enumerate(programs):
        for i, a in enumerate(program):
            if a.op not in CARRIED:
                continue
            wait = Action(WAIT_OF[a.op], a.unit, a.mb)
            if program.count(a) != 1 or program.count(wait) != 1:
                fail(programs, f"stage {s}: {a} and {wait} must each run once a step", {s: i})
            if program.index(wait) > i:
                fail(programs, f"stage {s}: {wait} (the previous step's {a}) must come before "
                                f"{a}", {s: program.index(wait)})
        for i, a in enumerate(program):
            start = SPECS[a.op].waits
            if start in CARRIED and Action(start, a.unit, a.mb) not in program:
                fail(programs, f"stage {s}: {a} waits for {Action(start, a.unit, a.mb)}, which "
                                f"the program never starts", {s: i})


def check_dependencies(programs: list[Program], stage_units: list[range]) -> None:
    """Each action comes after what it consumes, on its own rank:

    F u.m after its input (F (u-1).m on the stage; WRA of the previous stage's last unit; nothing
    for unit 0). R u.m after F u.m. B u.m (or BI u.m, where the backward is split) after F u.m,
    after R u.m if there is one, and after its output gradient (B or BI (u+1).m on the stage;
    WRG u.m; nothing for the head), and after WL u.m if u.m is offloaded; BW u.m after BI u.m.
    O u.m after F u.m, L u.m after O u.m, WL u.m after L u.m. SA u.m after F u.m; SG after the
    B or BI of the stage's first unit. GS u after every B (or BW) u.*. N after every B, BW and
    WGS of the stage. U u after WN if there is one, and after WGS u if there is one, else after
    every B (or BW) u.*.
    """
    p = len(programs)
    for s, (program, units) in enumerate(zip(programs, stage_units)):
        ctx = RankContext.of(program, s, p, units)
        for i, a in enumerate(program):
            needs = NEEDS[a.op](a, ctx)
            for need in needs:
                at = ctx.pos.get(need, -1) if isinstance(need, Action) else need[1]
                if at < i and (at >= 0 or not isinstance(need, Action)):
                    continue
                name = str(need) if isinstance(need, Action) else need[0]
                if at < 0:
                    fail(programs, f"stage {s}: {a} needs {name}, which stage {s} never runs",
                          {s: i})
                fail(programs, f"stage {s}: {a} at step {i} comes before {name} (step {at}), "
                                f"which it needs", {s: i})
