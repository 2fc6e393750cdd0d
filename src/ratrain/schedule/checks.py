"""Checks run on every plan before anything executes.

`validate` runs, in order: the stage layout, completeness, matched pipeline communication,
start/wait pairing, per-rank dependency order, parameter-view lifetimes, and a dry run across
all pipeline ranks that proves the programs cannot deadlock. The first failure raises
ScheduleError whose message is a one-line reason followed by a step x rank table of the
programs with the offending (or, for a deadlock, every blocked) action marked `>>like this<<`.
"""

from __future__ import annotations

from collections import Counter

from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ir import START_OF, WAIT_OF, Action, Op, Program

# Only a training step may contain these.
_TRAINING_ONLY = frozenset({
    Op.BACKWARD, Op.RECOMPUTE, Op.SEND_GRAD, Op.WAIT_SEND_GRAD, Op.RECV_GRAD, Op.WAIT_RECV_GRAD,
    Op.GRAD_SYNC, Op.WAIT_GRAD_SYNC, Op.GRAD_NORM, Op.WAIT_GRAD_NORM, Op.UPDATE, Op.OFFLOAD,
    Op.RELOAD, Op.WAIT_RELOAD,
})
# Ops whose layer must be one of the stage's own units (communication names the peer's unit).
_OWN_UNIT = frozenset({
    Op.FORWARD, Op.BACKWARD, Op.RECOMPUTE, Op.GRAD_SYNC, Op.WAIT_GRAD_SYNC, Op.UPDATE,
    Op.OFFLOAD, Op.RELOAD, Op.WAIT_RELOAD, Op.PREFETCH, Op.WAIT_PREFETCH, Op.RELEASE,
})
_COMPUTE = frozenset({Op.FORWARD, Op.RECOMPUTE, Op.BACKWARD})
_OFFLOAD_OPS = (Op.OFFLOAD, Op.RELOAD, Op.WAIT_RELOAD)  # all or none per (unit, micro-batch)
# the state of a unit's view after each view op (check_views)
_VIEW_STATE = {Op.PREFETCH: "pending", Op.WAIT_PREFETCH: "live", Op.RELEASE: "released"}
_COLLECTIVES = (Op.STEP_END,)  # blocking collectives over the pipeline stages
# asynchronous collective over the pipeline stages: wait op -> start op every stage must issue
_COLLECTIVE_WAITS = {Op.WAIT_GRAD_NORM: Op.GRAD_NORM}
_TABLE_CONTEXT = 6  # steps shown around each marked one when a table is long
_TABLE_ROWS = 80  # tables longer than this are cut to the marked steps and their context


def validate(
    programs: list[Program],
    stage_units: list[range],
    n_micro: int,
    dp: int,
    *,
    forward_only: bool = False,
) -> None:
    """Run every check; raise ScheduleError at the first failure. `forward_only` checks
    evaluation programs (F, activation transfers, parameter views and E only)."""
    check_layout(programs, stage_units)
    check_completeness(programs, stage_units, n_micro, dp, forward_only=forward_only)
    check_communication(programs, stage_units)
    check_waits(programs)
    check_dependencies(programs, stage_units)
    check_views(programs)
    dry_run(programs)


def format_table(programs: list[Program], marks: dict[int, int] | None = None) -> str:
    """Step x rank table (as torch.distributed.pipelining's _format_pipeline_order): row i holds
    each rank's i-th action; `marks` maps a rank to the step whose action is marked. Long
    tables keep only the steps near a mark."""
    marks = marks or {}
    cells = [[str(a) for a in program] for program in programs]
    for rank, step in marks.items():
        cells[rank][step] = f">>{cells[rank][step]}<<"
    n_steps = max((len(c) for c in cells), default=0)
    if n_steps <= _TABLE_ROWS:
        shown = list(range(n_steps))
    elif marks:
        shown = sorted({
            i for step in marks.values()
            for i in range(max(0, step - _TABLE_CONTEXT), min(n_steps, step + _TABLE_CONTEXT + 1))
        })
    else:
        shown = list(range(_TABLE_ROWS))
    headers = [f"Rank {r}" for r in range(len(programs))]
    widths = [max([len(h)] + [len(c) for c in col]) for h, col in zip(headers, cells)]
    digits = len(str(max(n_steps - 1, 0)))
    label = " " * (len("Step ") + digits + 2)
    lines = [label + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    previous = -1
    for i in shown:
        if i != previous + 1:
            lines.append("...")
        row = [(col[i] if i < len(col) else "").ljust(w) for col, w in zip(cells, widths)]
        lines.append(f"Step {i:0{digits}d}: " + "  ".join(row).rstrip())
        previous = i
    if shown and shown[-1] != n_steps - 1:
        lines.append(f"... ({n_steps} steps in all)")
    return "\n".join(lines)


def _fail(programs: list[Program], reason: str, marks: dict[int, int] | None = None) -> None:
    raise ScheduleError(f"{reason}\n{format_table(programs, marks)}")


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
            if forward_only and a.op in _TRAINING_ONLY:
                _fail(programs, f"rank {s}: {a} has no place in {kind} program", {s: i})
            if a.op in _OWN_UNIT and a.layer not in units:
                _fail(programs, f"rank {s}: {a} names unit {a.layer}, but stage {s} owns "
                                f"units {units.start}..{units.stop - 1}", {s: i})
            if a.mb is not None and not 0 <= a.mb < n_micro:
                _fail(programs, f"rank {s}: {a} names micro-batch {a.mb}, but the step has "
                                f"{n_micro}", {s: i})
        compute = [Op.FORWARD] if forward_only else [Op.FORWARD, Op.BACKWARD]
        for op in compute:
            for u in units:
                for m in range(n_micro):
                    if counts[Action(op, u, m)] != 1:
                        _fail(programs, f"rank {s} runs {Action(op, u, m)} "
                                        f"{counts[Action(op, u, m)]} times; expected once")
        for a, c in counts.items():
            if a.op is Op.RECOMPUTE and c > 1:
                _fail(programs, f"rank {s} runs {a} {c} times; expected at most once",
                      {s: program.index(a)})
        offloaded = sorted({(a.layer, a.mb) for a in program if a.op in _OFFLOAD_OPS})
        for u, m in offloaded:
            for op in _OFFLOAD_OPS:
                if counts[Action(op, u, m)] != 1:
                    _fail(programs, f"rank {s} runs {Action(op, u, m)} "
                                    f"{counts[Action(op, u, m)]} times; an offloaded activation "
                                    f"takes exactly one O, L and WL")
            if counts[Action(Op.RECOMPUTE, u, m)]:
                _fail(programs, f"rank {s}: {Action(Op.OFFLOAD, u, m)} and "
                                f"{Action(Op.RECOMPUTE, u, m)}: a recomputed forward saves "
                                f"nothing to offload", {s: program.index(Action(Op.OFFLOAD, u, m))})
        syncs = int(dp > 1 and not forward_only)
        for u in units:
            if counts[Action(Op.GRAD_SYNC, u)] != syncs:
                _fail(programs, f"rank {s} starts GS{u} {counts[Action(Op.GRAD_SYNC, u)]} times; "
                                f"expected {syncs} with dp={dp} in {kind} program")
        end = Action(Op.STEP_END)
        if counts[end] != 1 or program[-1] != end:
            marks = {s: program.index(end)} if end in program else {}
            _fail(programs, f"rank {s}: E must occur exactly once, as the last action", marks)

    for op, per_unit in ((Op.UPDATE, True), (Op.GRAD_NORM, False)):
        if not any(a.op is op for counts in all_counts for a in counts):
            continue
        for s, (units, counts) in enumerate(zip(stage_units, all_counts)):
            for a in [Action(op, u) for u in units] if per_unit else [Action(op)]:
                if counts[a] != 1:
                    _fail(programs, f"rank {s} runs {a} {counts[a]} times; expected once "
                                    f"(other ranks run {op.name})")


def check_communication(programs: list[Program], stage_units: list[range]) -> None:
    """Every pipeline send has exactly one matching receive on the neighbour and vice versa, for
    the tensor the neighbours actually exchange, and both sides post them in the same micro-batch
    order (transports match messages between a pair of ranks in posting order)."""
    p = len(programs)
    # op -> (peer offset, matching op on the peer, unit exchanged relative to this stage)
    rules = {
        Op.SEND_ACT: (+1, Op.RECV_ACT, "last"),
        Op.RECV_ACT: (-1, Op.SEND_ACT, "input"),
        Op.SEND_GRAD: (-1, Op.RECV_GRAD, "input"),
        Op.RECV_GRAD: (+1, Op.SEND_GRAD, "last"),
    }
    counts = [Counter(program) for program in programs]
    for s, program in enumerate(programs):
        unit = {"last": stage_units[s][-1], "input": stage_units[s][0] - 1}
        for i, a in enumerate(program):
            if a.op not in rules:
                continue
            offset, peer_op, which = rules[a.op]
            peer = s + offset
            if not 0 <= peer < p:
                _fail(programs, f"rank {s}: {a} has no peer (rank {peer} does not exist)", {s: i})
            if a.layer != unit[which]:
                _fail(programs, f"rank {s}: {a} names unit {a.layer}, but rank {s} exchanges "
                                f"unit {unit[which]}'s tensors with rank {peer}", {s: i})
            match = Action(peer_op, a.layer, a.mb)
            found = counts[peer][match]
            if found != 1:
                _fail(programs, f"rank {s}: {a} has {found} matching {match} on rank {peer}; "
                                f"expected exactly one", {s: i})
    for s in range(p - 1):
        for send, recv, sender, receiver in (
            (Op.SEND_ACT, Op.RECV_ACT, s, s + 1),
            (Op.SEND_GRAD, Op.RECV_GRAD, s + 1, s),
        ):
            sends = [a.mb for a in programs[sender] if a.op is send]
            recvs = [a.mb for a in programs[receiver] if a.op is recv]
            if sends != recvs:
                k = next(k for k, (a, b) in enumerate(zip(sends, recvs)) if a != b)
                at_send = [i for i, a in enumerate(programs[sender]) if a.op is send][k]
                at_recv = [i for i, a in enumerate(programs[receiver]) if a.op is recv][k]
                _fail(programs, f"rank {sender} posts {send.value} in micro-batch order {sends} "
                                f"but rank {receiver} posts {recv.value} in order {recvs}",
                      {sender: at_send, receiver: at_recv})


def check_waits(programs: list[Program]) -> None:
    """Every asynchronous start is waited exactly once, later on the same rank; no wait without
    an outstanding start. A start may repeat (a view prefetched again for the backward) once its
    previous instance has been waited. O has no wait op (the executor tracks its copy)."""
    for s, program in enumerate(programs):
        outstanding: dict[Action, int] = {}
        for i, a in enumerate(program):
            if a.op in WAIT_OF:
                if a in outstanding:
                    _fail(programs, f"rank {s}: {a} starts again before its previous start "
                                    f"(step {outstanding[a]}) was waited", {s: i})
                outstanding[a] = i
            elif a.op in START_OF:
                start = Action(START_OF[a.op], a.layer, a.mb)
                if outstanding.pop(start, None) is None:
                    _fail(programs, f"rank {s}: {a} waits for {start}, which has not been "
                                    f"started before it", {s: i})
        for start, i in outstanding.items():
            wait = Action(WAIT_OF[start.op], start.layer, start.mb)
            _fail(programs, f"rank {s}: {start} is started but never waited (no {wait} after it)",
                  {s: i})


def check_dependencies(programs: list[Program], stage_units: list[range]) -> None:
    """Each action comes after what it consumes, on its own rank:

    F u.m after its input (F (u-1).m on the stage; WRA of the previous stage's last unit; nothing
    for unit 0). R u.m after F u.m. B u.m after F u.m, after R u.m if there is one, and after its
    output gradient (B (u+1).m on the stage; WRG u.m; nothing for the head), and after WL u.m if
    u.m is offloaded. O u.m after F u.m, L u.m after O u.m, WL u.m after L u.m. SA u.m after
    F u.m; SG after the B of the stage's first unit. GS u after every B u.*. N after every B and
    WGS of the stage. U u after WN if there is one, and after WGS u if there is one, else after
    every B u.*.
    """
    p = len(programs)
    for s, (program, units) in enumerate(zip(programs, stage_units)):
        pos: dict[Action, int] = {}
        last_backward: dict[int, int] = {}  # unit -> step of its last B
        for i, a in enumerate(program):
            pos.setdefault(a, i)
            if a.op is Op.BACKWARD:
                last_backward[a.layer] = i
        last_sync = max((pos.get(Action(Op.WAIT_GRAD_SYNC, u), -1) for u in units))

        for i, a in enumerate(program):
            # what `a` needs: actions, or (description, step of the last thing described)
            needs: list[Action | tuple[str, int]] = []
            if a.op is Op.FORWARD:
                if a.layer - 1 in units:
                    needs.append(Action(Op.FORWARD, a.layer - 1, a.mb))
                elif s > 0:
                    needs.append(Action(Op.WAIT_RECV_ACT, a.layer - 1, a.mb))
            elif a.op is Op.RECOMPUTE:
                needs.append(Action(Op.FORWARD, a.layer, a.mb))
            elif a.op is Op.BACKWARD:
                needs.append(Action(Op.FORWARD, a.layer, a.mb))
                if Action(Op.RECOMPUTE, a.layer, a.mb) in pos:
                    needs.append(Action(Op.RECOMPUTE, a.layer, a.mb))
                if Action(Op.OFFLOAD, a.layer, a.mb) in pos:
                    needs.append(Action(Op.WAIT_RELOAD, a.layer, a.mb))
                if a.layer + 1 in units:
                    needs.append(Action(Op.BACKWARD, a.layer + 1, a.mb))
                elif s < p - 1:
                    needs.append(Action(Op.WAIT_RECV_GRAD, a.layer, a.mb))
            elif a.op is Op.OFFLOAD:
                needs.append(Action(Op.FORWARD, a.layer, a.mb))
            elif a.op is Op.RELOAD:
                needs.append(Action(Op.OFFLOAD, a.layer, a.mb))
            elif a.op is Op.WAIT_RELOAD:
                needs.append(Action(Op.RELOAD, a.layer, a.mb))
            elif a.op is Op.SEND_ACT:
                needs.append(Action(Op.FORWARD, a.layer, a.mb))
            elif a.op is Op.SEND_GRAD:
                needs.append(Action(Op.BACKWARD, a.layer + 1, a.mb))
            elif a.op is Op.GRAD_SYNC:
                needs.append((f"every B{a.layer}.*", last_backward.get(a.layer, -1)))
            elif a.op is Op.GRAD_NORM:
                needs.append(("every B of the stage", max(last_backward.values(), default=-1)))
                needs.append(("every WGS of the stage", last_sync))
            elif a.op is Op.UPDATE:
                if Action(Op.WAIT_GRAD_NORM) in pos or Action(Op.GRAD_NORM) in pos:
                    needs.append(Action(Op.WAIT_GRAD_NORM))
                if Action(Op.WAIT_GRAD_SYNC, a.layer) in pos:
                    needs.append(Action(Op.WAIT_GRAD_SYNC, a.layer))
                else:
                    needs.append((f"every B{a.layer}.*", last_backward.get(a.layer, -1)))
            for need in needs:
                at = pos.get(need, -1) if isinstance(need, Action) else need[1]
                if at < i and (at >= 0 or not isinstance(need, Action)):
                    continue
                name = str(need) if isinstance(need, Action) else need[0]
                if at < 0:
                    _fail(programs, f"rank {s}: {a} needs {name}, which rank {s} never runs",
                          {s: i})
                _fail(programs, f"rank {s}: {a} at step {i} comes before {name} (step {at}), "
                                f"which it needs", {s: i})


def check_views(programs: list[Program]) -> None:
    """Parameter views, per rank and unit. A view is pending from `P u` to `WP u`, then live
    until `X u`. Where a program prefetches a unit's view at all, every F, R and B of that unit
    runs while it is live; P only when the view is neither pending nor live, WP only when it is
    pending, X only when it is live; no view is left pending at the end. A view may stay live
    at the end (resident views). Units never prefetched compute on their masters."""
    for s, program in enumerate(programs):
        viewed = {a.layer for a in program if a.op is Op.PREFETCH}
        # unit -> (state, step it began): "pending", "live" or "released"; absent: never made
        state: dict[int, tuple[str, int]] = {}
        for i, a in enumerate(program):
            current = state.get(a.layer, ("absent", -1))
            if a.op in _COMPUTE and a.layer in viewed and current[0] != "live":
                why = f"{a} needs unit {a.layer}'s view live"
            elif a.op is Op.PREFETCH and current[0] in ("pending", "live"):
                why = f"{a} prefetches unit {a.layer}'s view again"
            elif a.op is Op.WAIT_PREFETCH and current[0] != "pending":
                why = f"{a} waits for unit {a.layer}'s view"
            elif a.op is Op.RELEASE and current[0] != "live":
                why = f"{a} releases unit {a.layer}'s view"
            else:
                why = ""
            if why:
                _fail(programs, f"rank {s}: {why}, but it is {_view_state(a.layer, *current)}",
                      {s: i})
            if a.op in _VIEW_STATE:
                state[a.layer] = (_VIEW_STATE[a.op], i)
        for u, (current, since) in state.items():
            if current == "pending":
                _fail(programs, f"rank {s}: unit {u}'s view is prefetched but never waited "
                                f"(no WP{u} after it)", {s: since})


def _view_state(u: int, state: str, since: int) -> str:
    return {
        "absent": "not prefetched before it",
        "pending": f"only pending (P{u} at step {since}, not waited)",
        "live": f"live (since step {since})",
        "released": f"released (X{u} at step {since})",
    }[state]


# wait op -> (offset of the peer rank, the peer's start that lets the wait complete)
_PEER_START = {
    Op.WAIT_RECV_ACT: (-1, Op.SEND_ACT),  # data arrives once the peer has started sending
    Op.WAIT_RECV_GRAD: (+1, Op.SEND_GRAD),
    Op.WAIT_SEND_ACT: (+1, Op.RECV_ACT),  # rendezvous: the peer must have posted the receive
    Op.WAIT_SEND_GRAD: (-1, Op.RECV_GRAD),
}


def _blocked(a: Action, rank: int, p: int, arrived: dict[Op, set[int]],
             started: list[set[Action]]) -> bool:
    if a.op in _PEER_START:
        offset, op = _PEER_START[a.op]
        return Action(op, a.layer, a.mb) not in started[rank + offset]
    if a.op in _COLLECTIVE_WAITS:
        return any(Action(_COLLECTIVE_WAITS[a.op]) not in s for s in started)
    return a.op in _COLLECTIVES and len(arrived[a.op]) < p


def _why_blocked(a: Action, rank: int, p: int, arrived: dict[Op, set[int]],
                 started: list[set[Action]]) -> str:
    if a.op in _PEER_START:
        offset, op = _PEER_START[a.op]
        return f"rank {rank} waits {a} (rank {rank + offset} has not started " \
               f"{Action(op, a.layer, a.mb)})"
    if a.op in _COLLECTIVE_WAITS:
        start = Action(_COLLECTIVE_WAITS[a.op])
        missing = [r for r in range(p) if start not in started[r]]
        return f"rank {rank} waits {a} (ranks {missing} have not started {start})"
    missing = [r for r in range(p) if r not in arrived[a.op]]
    return f"rank {rank} waits {a} (ranks {missing} have not reached {a})"


def dry_run(programs: list[Program]) -> None:
    """Execute all pipeline ranks together, round-robin, under conservative semantics: starts
    (SA, SG, RA, RG, GS, O, L, P), X and compute never block; WL and WP complete (local
    copies); WRA/WRG complete once the peer has started the matching send; WSA/WSG once the
    peer has started the matching receive (rendezvous, which also holds for NCCL); WGS
    completes (DP replicas run the same program); WN completes once every pipeline rank has
    started N; E is a collective over all pipeline stages: a rank passes it only when every
    rank has reached it. Raises ScheduleError naming every blocked rank if no rank can make
    progress.

    Rendezvous is the worst case: where a transport completes sends eagerly, every wait
    completes no later than here, so a program that passes also runs there."""
    p = len(programs)
    pcs = [0] * p
    started: list[set[Action]] = [set() for _ in range(p)]
    arrived: dict[Op, set[int]] = {op: set() for op in _COLLECTIVES}
    while True:
        progressed = False
        for r, program in enumerate(programs):
            while pcs[r] < len(program):
                a = program[pcs[r]]
                if a.op in _COLLECTIVES:
                    arrived[a.op].add(r)
                if _blocked(a, r, p, arrived, started):
                    break
                if a.op in WAIT_OF:
                    started[r].add(a)
                pcs[r] += 1
                progressed = True
        if all(pc == len(program) for pc, program in zip(pcs, programs)):
            return
        if not progressed:
            blocked = {r: pcs[r] for r in range(p) if pcs[r] < len(programs[r])}
            reasons = [_why_blocked(programs[r][pc], r, p, arrived, started)
                       for r, pc in blocked.items()]
            _fail(programs, "deadlock: " + "; ".join(reasons), blocked)
