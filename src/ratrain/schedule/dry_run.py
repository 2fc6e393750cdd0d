"""A dry run of all pipeline ranks' programs together, proving they cannot deadlock."""

from __future__ import annotations

from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import SPECS, Op, Peer, peer_offset
from ratrain.schedule.table import fail

def _peer_start(a: Action) -> tuple[int, Action] | None:
    """For the wait of a transfer: the peer rank's offset and the start of the peer's that lets
    it complete (a receive's data arrives once the peer has started sending; a send completes,
    rendezvous, once the peer has posted the receive)."""
    start = SPECS[a.op].waits
    if start is None or SPECS[start].pairs_with is None:
        return None
    return peer_offset(start), Action(SPECS[start].pairs_with, a.unit, a.mb)


def _blocking_collective(op: Op) -> bool:
    """A collective over the pipeline that holds the rank until every stage reached it (E)."""
    return SPECS[op].pipeline_collective and not SPECS[op].starts


def _collective_start(a: Action) -> Action | None:
    """For the wait of an asynchronous pipeline collective (WN): the start every stage must
    have issued before it completes."""
    start = SPECS[a.op].waits
    return Action(start) if start is not None and SPECS[start].pipeline_collective else None


def _tied_start(a: Action, rank: int, p: int) -> tuple[int, Op] | None:
    """For the wait of the tied weight's sum (WTS): the other end of the pipeline, which must
    have started its own TS (on its own unit) before the sum completes."""
    start = SPECS[a.op].waits
    if start is None or Peer.TIED not in SPECS[start].peers:
        return None
    return (p - 1 if rank == 0 else 0), start


def _blocked(a: Action, rank: int, p: int, arrived: dict[Op, set[int]],
             started: list[set[Action]]) -> bool:
    if tied := _tied_start(a, rank, p):
        other, start = tied
        return not any(s.op is start for s in started[other])
    if peer := _peer_start(a):
        offset, start = peer
        return start not in started[rank + offset]
    if start := _collective_start(a):
        return any(start not in s for s in started)
    return _blocking_collective(a.op) and len(arrived[a.op]) < p


def _why_blocked(a: Action, rank: int, p: int, arrived: dict[Op, set[int]],
                 started: list[set[Action]]) -> str:
    if tied := _tied_start(a, rank, p):
        return f"stage {rank} waits {a} (stage {tied[0]} has not started its {tied[1].value})"
    if peer := _peer_start(a):
        offset, start = peer
        return f"stage {rank} waits {a} (stage {rank + offset} has not started {start})"
    if start := _collective_start(a):
        missing = [r for r in range(p) if start not in started[r]]
        return f"stage {rank} waits {a} (stages {missing} have not started {start})"
    missing = [r for r in range(p) if r not in arrived[a.op]]
    return f"stage {rank} waits {a} (stages {missing} have not reached {a})"


def dry_run(programs: list[Program]) -> None:
    """Execute all pipeline ranks together, round-robin, under conservative semantics: starts
    (SA, SG, RA, RG, GS, O, L, P), X and compute never block; WL and WP complete (local
    copies); WRA/WRG complete once the peer has started the matching send; WSA/WSG once the
    peer has started the matching receive (rendezvous, which also holds for NCCL); WGS
    completes (DP replicas run the same program); WTS once the other end of the pipeline has
    started its TS; WN completes once every pipeline rank has
    started N; E is a collective over all pipeline stages: a rank passes it only when every
    rank has reached it. Raises ScheduleError naming every blocked rank if no rank can make
    progress.

    Rendezvous is the worst case: where a transport completes sends eagerly, every wait
    completes no later than here, so a program that passes also runs there."""
    p = len(programs)
    pcs = [0] * p
    started: list[set[Action]] = [set() for _ in range(p)]
    arrived: dict[Op, set[int]] = {op: set() for op in SPECS if _blocking_collective(op)}
    while True:
        progressed = False
        for r, program in enumerate(programs):
            while pcs[r] < len(program):
                a = program[pcs[r]]
                if a.op in arrived:
                    arrived[a.op].add(r)
                if _blocked(a, r, p, arrived, started):
                    break
                if SPECS[a.op].starts:
                    started[r].add(a)
                pcs[r] += 1
                progressed = True
        if all(pc == len(program) for pc, program in zip(pcs, programs)):
            return
        if not progressed:
            blocked = {r: pcs[r] for r in range(p) if pcs[r] < len(programs[r])}
            reasons = [_why_blocked(programs[r][pc], r, p, arrived, started)
                       for r, pc in blocked.items()]
            fail(programs, "deadlock: " + "; ".join(reasons), blocked)
