"""A discrete-event simulator of one training step: it walks the very per-stage programs the
executor walks, costed by the cost model on a hardware profile.

Each simulated rank has what a real one has: its walker (the thread that issues actions, which
also runs compute: F, B, R, U), a copy engine, a send and a receive link (full duplex, each
first come first served), and its collectives. A point-to-point transfer starts once both sides
have issued it and both links are free; a unit's gradient sync once it is issued and the rank's
links are free; the norm reduction and the step's end once every stage has issued them. Waits
block the walker until what they wait for has completed, as the executor's do. With sharded
state (the plan's `shard_state`) a prefetch is an all-gather on the rank's links like a sync,
and the norm first sums over the replicas, blocking (sim/cost_model.py). Each action's memory
effects go to its stage's ledger (sim/stage_memory.py).

Data-parallel replicas run identical programs on identical costs, so each stage is simulated
once; its replicas appear in the size of its gradient ring and, on a machine whose ranks share
cores (a CPU profile's `cores`), in how many compute at once and how many threads their
communication within the node keeps busy (sim/shared_cores.py).
"""

from __future__ import annotations

import heapq
import itertools

from ratrain.config import ModelConfig
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.ir import Action
from ratrain.schedule.ops import SPECS, START_OF, Op, peer_offset
from ratrain.schedule.plan import PipelinePlan
from ratrain.sim.cost_model import StageCosts, ops_for
from ratrain.sim.placement import stage_setups
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.result import RankTimeline, SimResult
from ratrain.sim.shared_cores import SharedCores
from ratrain.sim.stage_memory import StageMemory


def simulate(plan: PipelinePlan, model: ModelConfig, profile: HardwareProfile, *,
             micro_batch_size: int, seq_len: int, dtype: str = "float32") -> SimResult:
    """One steady-state training step of `plan` (optimizer state already allocated)."""
    setups = stage_setups(plan, model, profile, micro_batch_size=micro_batch_size,
                          seq_len=seq_len, dtype=dtype)
    grid = RankGrid(plan.pp, plan.dp, plan.rank_order)
    node_of = [grid.rank(s, 0) // profile.devices_per_node for s in range(plan.pp)]
    weight = [sum(1 for r in grid.replica_ranks(s) if r // profile.devices_per_node == node_of[s])
              for s in range(plan.pp)]
    sim = _Simulation(plan, [StageCosts(s) for s in setups], profile, node_of, weight)
    sim.run()
    tokens = plan.n_micro * plan.dp * micro_batch_size * seq_len
    return SimResult(max(r.end for r in sim.timelines), tokens, sim.timelines,
                     profile.device)


class _Op:
    """An asynchronous operation in flight: started by one action, completed at `done`."""

    __slots__ = ("action", "start", "done")

    def __init__(self, action: Action):
        self.action = action
        self.start: float | None = None
        self.done: float | None = None

    @property
    def name(self) -> str:
        return str(self.action)


class _Simulation:
    def __init__(self, plan: PipelinePlan, costs: list[StageCosts], profile: HardwareProfile,
                 node_of: list[int], weight: list[int]):
        self.plan, self.costs, self.profile = plan, costs, profile
        self.op_tables = [ops_for(c.s.shard_state) for c in costs]  # sharded P: an all-gather
        self.cores = None if profile.device.cores is None else SharedCores(
            profile.device.cores, profile.device.contention, node_of, weight,
            lambda: self.now, self._at)
        self.synchronous_copies = [c.host_link is None for c in costs]
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        n = plan.pp
        self.timelines = [RankTimeline(s) for s in range(n)]
        self.pc = [0] * n
        self.blocked: list[tuple[_Op, float] | None] = [None] * n  # a wait: (its op, since)
        self.step_end: dict[int, tuple[Action, float]] = {}  # stages inside E: (E, since)
        self.ops: list[dict[tuple, _Op]] = [{} for _ in range(n)]  # (op, layer, mb) -> op
        self.send_free = [0.0] * n
        self.recv_free = [0.0] * n
        self.copy_free = [0.0] * n
        self.posted: dict[tuple, list] = {}  # p2p key -> [(stage, op, issued)] of both sides
        self.gathering: dict[Op, dict[int, tuple[_Op, float]]] = {Op.GRAD_NORM: {}, Op.STEP_END: {}}
        # resident views (window 0) stay allocated between steps
        self.memory = [StageMemory(c, t, plan.view_window == 0, synchronous)
                       for c, t, synchronous in zip(costs, self.timelines, self.synchronous_copies)]

    # -- the event loop -----------------------------------------------------------------------

    def _at(self, t: float, fn, *args) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, args))

    def run(self) -> None:
        for s in range(self.plan.pp):
            self._at(0.0, self._advance, s)
        while self._events:
            t, _, fn, args = heapq.heappop(self._events)
            self.now = t
            fn(*args)
        stuck = [s for s in range(self.plan.pp) if self.pc[s] < len(self.plan.programs[s])]
        if stuck:
            raise RuntimeError(f"simulation stuck: stages {stuck} at "
                               f"{[str(self.plan.programs[s][self.pc[s]]) for s in stuck]}")

    def _advance(self, s: int) -> None:
        """Issue stage s's actions from its program counter until one occupies or blocks it."""
        program = self.plan.programs[s]
        c = self.costs[s]
        while self.pc[s] < len(program):
            a = program[self.pc[s]]
            cost = self.op_tables[s][a.op]
            kind = cost.kind
            if kind == "copy" and self.synchronous_copies[s]:
                kind = "compute"
            if kind == "wait":
                op = self.ops[s].get((START_OF[a.op], a.unit, a.mb))
                if op is None:
                    raise RuntimeError(f"stage {s}: {a} waits for a start that never ran")
                if op.done is None or op.done > self.now:
                    self.blocked[s] = (op, self.now)  # _complete wakes it
                    return
                if self._finish_wait(s, a, self.now):
                    return
                continue
            self.pc[s] += 1
            start = self.now
            if kind == "compute":
                op = None
                if cost.kind == "copy":  # a synchronous copy: its wait finds it done
                    op = self.ops[s][(a.op, a.unit, a.mb)] = _Op(a)
                    op.start = start
                self._compute(s, a, cost.duration(c, a) + c.overhead, op=op)
                return
            if kind == "step_end":
                self._gather(s, a, Op.STEP_END, cost.duration(c, a), blocking=True)
                return
            if kind == "norm":  # the local squared norm first, then its reduction
                def reduce(a=a, c=c, cost=cost) -> None:
                    self._gather(s, a, Op.GRAD_NORM, cost.duration(c, a), blocking=False)
                replicas = c.norm_replicas()  # sharded: summed over the replicas first
                self._compute(s, a, c.norm_local() + c.overhead, then=reduce if not replicas
                              else lambda: self._over_replicas(s, replicas, reduce))
                return
            if kind in ("copy", "sync", "send", "recv"):
                op = self.ops[s][(a.op, a.unit, a.mb)] = _Op(a)
                if kind == "copy":
                    op.start = max(start, self.copy_free[s])
                    op.done = self.copy_free[s] = op.start + cost.duration(c, a)
                    self._at(op.done, self._complete, s, op)
                elif kind == "sync":
                    op.start = max(start, self.send_free[s], self.recv_free[s])
                    op.done = op.start + cost.duration(c, a)
                    self.send_free[s] = self.recv_free[s] = op.done
                    self._at(op.done, self._complete, s, op)
                    self._occupy(op.start, op.done, s)
                else:
                    self._post(s, a, op, cost.duration(c, a))
            self.memory[s].record(a, self.now)
            self.timelines[s].actions.append((a, start, start + c.overhead))
            if c.overhead:
                self._at(start + c.overhead, self._advance, s)
                return

    def _finish_wait(self, s: int, a: Action, since: float) -> bool:
        """The wait `a` returns now; True when the walker is busy for its overhead."""
        self.memory[s].record(a, self.now)
        overhead = self.costs[s].overhead
        self.timelines[s].actions.append((a, since, self.now + overhead))
        self.pc[s] += 1
        if overhead:
            self._at(self.now + overhead, self._advance, s)
            return True
        return False

    def _wake(self, s: int) -> None:
        """Something completed: if stage s waits for it, the wait returns."""
        if self.blocked[s] is None:
            return
        op, since = self.blocked[s]
        if op.done is None or op.done > self.now:
            return
        self.blocked[s] = None
        # exposed: the part of the wait during which the operation itself ran
        self.timelines[s].exposed += max(0.0, self.now - max(since, op.start))
        if not self._finish_wait(s, self.plan.programs[s][self.pc[s]], since):
            self._advance(s)

    def _complete(self, s: int, op: _Op) -> None:
        self.timelines[s].spans.append((op.name, op.start, op.done))
        self._wake(s)

    # -- compute: processor sharing on a node (sim/shared_cores.py) ---------------------------

    def _compute(self, s: int, a: Action, seconds: float, then=None, op: _Op | None = None) -> None:
        start = self.now

        def done() -> None:
            if op is not None:
                op.done = self.now
            self.timelines[s].compute += self.now - start
            self.timelines[s].actions.append((a, start, self.now))
            self.memory[s].record(a, self.now)
            if then is not None:
                then()
            else:
                self._advance(s)

        if self.cores is None:
            self._at(self.now + seconds, done)
        else:
            self.cores.start(s, seconds, done)

    # -- communication ------------------------------------------------------------------------

    def _post(self, s: int, a: Action, op: _Op, seconds: float) -> None:
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
        for stage, side, _ in sides:
            side.start, side.done = start, end
            self._at(end, self._complete, stage, side)
        self._occupy(start, end, src, dst)

    def _occupy(self, start: float, end: float, s: int, peer: int | None = None) -> None:
        """Communication within one node is work of its cores (sim/shared_cores.py): stage s's
        sync where all its replicas are on its node, or a transfer between s and `peer` on
        one node. Between nodes the link does the work."""
        cores = self.cores
        if cores is None or end <= start:
            return
        if peer is None:
            if cores.weight[s] == self.plan.dp:
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
        op = self.ops[s][(a.op, a.unit, a.mb)] = _Op(a)
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

    def _complete_gathered(self, s: int, op: _Op, blocking: bool) -> None:
        self.timelines[s].spans.append((op.name, op.start, op.done))
        if not blocking:
            self._wake(s)
            return
        a, since = self.step_end.pop(s)
        timeline = self.timelines[s]
        timeline.exposed += op.done - op.start
        self.memory[s].record(a, self.now)
        timeline.actions.append((a, since, self.now))
        timeline.end = self.now
        self._advance(s)
