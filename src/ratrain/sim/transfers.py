"""The simulator's transfers and collectives (sim/simulator.py's _Simulation): a
point-to-point transfer once both sides are posted and both links are free, the work of a
node's cores while it runs there, and the collectives over the pipeline (the norm, the step's
end) once every stage has issued them."""

from __future__ import annotations

from ratrain.schedule.ir import Action
from ratrain.schedule.ops import SPECS, Op, peer_offset


class InFlight:
    """An asynchronous operation in flight: started by one action, completed at `done`."""

    __slots__ = ("action", "start", "done")

    def __init__(self, action: Action):
        self.action = action
        self.start: float | None = None
        self.done: float | None = None

    @property
    def name(self) -> str:
        return str(self.action)


class Transfers:
    """What _Simulation's transfers need of it: plan, now, cores, links' free times, the
    posted sides, gathering, step_end, ops, timelines, memory, _at, _complete, _wake and
    _advance."""

    def _post(self, s: int, a: Action, op: InFlight, seconds: float) -> None:
        """One side of a transfer; it starts when the other side is posted too."""
        spec = SPECS[a.op]
        peer = s + peer_offset(a.op)
        src, dst = (s, peer) if spec.sends else (peer, s)
        send_op = a.op if spec.sends else spec.pairs_with
        key = (send_op, src, dst, a.unit, a.mb)
        sides = self.posted.setdefault(key, [])
        sides.append((s, op, self.now))
        if len(sides) < 2:
            return
        del self.posted[key]
        start = max(self.now, self.send_free[src], self.recv_free[dst])
        end = start + seconds
        self.send_free[src] = self.recv_free[dst] = end
        self._run(sides, start, end)
        self._occupy(start, end, src, dst)

    def _pair(self, s: int, op: InFlight, seconds: float) -> None:
        """One end's TS (tied embeddings across stages); the sum runs once both ends have
        issued theirs and both ends' links are free."""
        sides = self.posted.setdefault(("tied",), [])
        sides.append((s, op, self.now))
        if len(sides) < 2:
            return
        del self.posted[("tied",)]
        (a, _, _), (b, _, _) = sides
        start = max(self.now, self.send_free[a], self.recv_free[a], self.send_free[b],
                    self.recv_free[b])
        end = self.send_free[a] = self.recv_free[a] = self.send_free[b] = self.recv_free[b] = \
            start + seconds
        self._run(sides, start, end)
        self._occupy(start, end, a, b)

    def _run(self, sides: list, start: float, end: float) -> None:
        """Both sides of a transfer or a pair's collective run from `start` to `end`."""
        for stage, side, _ in sides:
            side.start, side.done = start, end
            self._at(end, self._complete, stage, side)

    def _occupy(self, start: float, end: float, s: int, peer: int | None = None,
                members: int | None = None) -> None:
        """Communication within one node is work of its cores (sim/shared_cores.py): stage s's
        sync where all its `members` (its first replicas: default all dp; an island's GS, its
        island's) are on its node, or a transfer between s and `peer` on one node. Between
        nodes the link does the work."""
        cores = self.cores
        if cores is None or end <= start:
            return
        if peer is None:
            # replica 0's node holds the stage's first `weight` replicas (ranks rise with them)
            if cores.weight[s] >= (members or self.plan.dp):
                cores.occupy(s, start, end)
        elif cores.node_of[s] == cores.node_of[peer]:
            cores.occupy(s, start, end)
            cores.occupy(peer, start, end)

    def _over_replicas(self, s: int, seconds: float, then) -> None:
        """A blocking collective over stage s's replicas (sharded N's scalar all-reduce): on
        the rank's links once they are free; the walker waits for it, then goes on with
        `then`."""
        start = max(self.now, self.send_free[s], self.recv_free[s])
        end = self.send_free[s] = self.recv_free[s] = start + seconds
        self.timelines[s].exposed += seconds  # as a wait: the part the collective ran
        self._at(end, then)

    def _gather(self, s: int, a: Action, kind: Op, seconds: float, blocking: bool) -> None:
        """A collective over the pipeline: it runs once every stage has issued it. The step's
        end (blocking) holds the walker inside it; the norm (not blocking) is waited by WN."""
        op = self.ops[s][(a.op, a.unit, a.mb)] = InFlight(a)
        members = self.gathering[kind]
        members[s] = (op, self.now)
        if blocking:
            self.step_end[s] = (a, self.now)
        else:
            self._at(self.now, self._advance, s)
        if len(members) < self.plan.pp:
            return
        for stage, (member, _) in members.items():
            member.start, member.done = self.now, self.now + seconds
            self._at(member.done, self._complete_gathered, stage, member, blocking)
        members.clear()

    def _complete_gathered(self, s: int, op: InFlight, blocking: bool) -> None:
        self.timelines[s].spans.append((op.name, op.start, op.done))
        if not blocking:
            self._wake(s)
            return
        a, since = self.step_end.pop(s)
        timeline = self.timelines[s]
        timeline.exposed += op.done - op.start
        self.memory[s].record(self.now)
        timeline.actions.append((a, since, self.now))
        timeline.end = self.now
        self._advance(s)
