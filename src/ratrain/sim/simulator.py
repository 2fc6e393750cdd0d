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
from ratrain.schedule.ops import CARRIED, START_OF, Op
from ratrain.schedule.plan import PipelinePlan
from ratrain.sim.cost_model import StageCosts, ops_for
from ratrain.sim.placement import stage_setups
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.result import RankTimeline, SimResult
from ratrain.sim.shared_cores import SharedCores
from ratrain.sim.stage_memory import MemoryClock, StageMemory
from ratrain.sim.transfers import InFlight, Transfers

FOLDS = (Op.BACKWARD, Op.BACKWARD_WEIGHT)  # a view's gradient is folded after these
READS_GRADIENT = (Op.START_NORM, Op.START_UPDATE)  # host work on a unit's folded gradient


def simulate(plan: PipelinePlan, model: ModelConfig, profile: HardwareProfile, *,
             micro_batch_size: int, seq_len: int, dtype: str = "float32",
             threads_per_rank: int = 1) -> SimResult:
    """One steady-state training step of `plan` (optimizer state already allocated), each
    rank computing on `threads_per_rank` threads of a CPU profile's cores (shared_cores.py;
    the profile's times are one thread's)."""
    setups = stage_setups(plan, model, profile, micro_batch_size=micro_batch_size,
                          seq_len=seq_len, dtype=dtype)
    grid = RankGrid(plan.pp, plan.dp, plan.rank_order)
    node_of = [grid.rank(s, 0) // profile.devices_per_node for s in range(plan.pp)]
    weight = [sum(1 for r in grid.replica_ranks(s) if r // profile.devices_per_node == node_of[s])
              for s in range(plan.pp)]
    costs = [StageCosts(s) for s in setups]
    # resident views (window 0) stay allocated between steps
    memory = [StageMemory(c, program, plan.view_window == 0)
              for c, program in zip(costs, plan.programs)]
    sim = _Simulation(plan, costs, memory, profile, node_of, weight, threads=threads_per_rank)
    sim.run()
    if any(a.op in CARRIED for program in plan.programs for a in program):
        # the steady state: each step waits for what the one before it carried over
        for _ in range(_CARRY_PASSES):
            carried = sim.carried_over()
            if all(t <= 0 for t in carried.values()):
                break  # done within the step: the next step starts as this one did
            sim = _Simulation(plan, costs, memory, profile, node_of, weight, carried,
                              threads_per_rank)
            sim.run()
            if _close(sim.carried_over(), carried):
                break
    tokens = plan.n_micro * plan.dp * micro_batch_size * seq_len
    return SimResult(max(r.end for r in sim.timelines), tokens, sim.timelines,
                     profile.device)


_CARRY_PASSES = 4  # steps simulated to reach the steady state of carried updates (2-3 suffice)


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a)


class _Simulation(Transfers):
    def __init__(self, plan: PipelinePlan, costs: list[StageCosts], memory: list[StageMemory],
                 profile: HardwareProfile, node_of: list[int], weight: list[int],
                 carried: dict[tuple[int, int], float] | None = None, threads: int = 1):
        """`carried`: (stage, unit) -> when the previous step's carried update of the unit
        completes, in this step's time (carried_over); `threads`: each rank's."""
        self.plan, self.costs, self.profile = plan, costs, profile
        self.carried = carried or {}
        self.op_tables = [ops_for(c.s.shard_state) for c in costs]  # sharded P: an all-gather
        self.cores = None if profile.device.cores is None else SharedCores(
            profile.device.cores, profile.device.contention, node_of, weight,
            lambda: self.now, self._at, threads, profile.device.thread_efficiency)
        self.synchronous_copies = [c.host_link is None for c in costs]
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        n = plan.pp
        self.timelines = [RankTimeline(s) for s in range(n)]
        self.pc = [0] * n
        self.blocked: list[tuple[InFlight, float] | None] = [None] * n  # a wait: (its op, since)
        self.step_end: dict[int, tuple[Action, float]] = {}  # stages inside E: (E, since)
        self.ops: list[dict[tuple, InFlight]] = [{} for _ in range(n)]  # (op, layer, mb) -> op
        self.send_free = [0.0] * n
        self.recv_free = [0.0] * n
        self.copy_free = [0.0] * n
        # the copy engine's gradient stream: each fold's copy to the host, in order, and when
        # the last of each unit's reached it (SN, SU read the gradient there)
        self.grad_copy_free = [0.0] * n
        self.grad_copied: list[dict[int, float]] = [{} for _ in range(n)]
        self.host_free = [max([0.0] + [t for (st, _), t in self.carried.items() if st == s])
                          for s in range(n)]  # the host update thread, busy with the last step's
        self.posted: dict[tuple, list] = {}  # p2p key -> [(stage, op, issued)] of both sides
        self.gathering: dict[Op, dict[int, tuple[InFlight, float]]] = {Op.GRAD_NORM: {}, Op.STEP_END: {}}
        self.memory = [MemoryClock(m, t) for m, t in zip(memory, self.timelines)]

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
            if kind == "host" and self.cores is not None:
                kind = "compute"  # a CPU's cores are the compute's: the walker runs it
            if kind == "wait":
                op = self.ops[s].get((START_OF[a.op], a.unit, a.mb)) or self._carried(s, a)
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
                if cost.kind in ("copy", "host"):  # run in place: its wait finds it done
                    op = self.ops[s][(a.op, a.unit, a.mb)] = InFlight(a)
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
            if kind in ("copy", "sync", "send", "recv", "host", "pair"):
                op = self.ops[s][(a.op, a.unit, a.mb)] = InFlight(a)
                if kind == "host":
                    op.start = max(start, self.host_free[s],
                                    self.grad_copied[s].get(a.unit, 0.0) if a.op in READS_GRADIENT
                                    else 0.0)
                    op.done = self.host_free[s] = op.start + cost.duration(c, a)
                    self._at(op.done, self._complete, s, op)
                elif kind == "copy":
                    op.start = max(start, self.copy_free[s])
                    op.done = self.copy_free[s] = op.start + cost.duration(c, a)
                    self._at(op.done, self._complete, s, op)
                elif kind == "sync":
                    op.start = max(start, self.send_free[s], self.recv_free[s])
                    op.done = op.start + cost.duration(c, a)
                    self.send_free[s] = self.recv_free[s] = op.done
                    self._at(op.done, self._complete, s, op)
                    self._occupy(op.start, op.done, s, members=c.s.sync_replicas
                                 if a.op is Op.GRAD_SYNC else None)
                elif kind == "pair":
                    self._pair(s, op, cost.duration(c, a))
                else:
                    self._post(s, a, op, cost.duration(c, a))
            self.memory[s].record(self.now)
            self.timelines[s].actions.append((a, start, start + c.overhead))
            if c.overhead:
                self._at(start + c.overhead, self._advance, s)
                return

    def _carried(self, s: int, a: Action) -> InFlight | None:
        """The previous step's start that a wait of a carried op (WU) waits for: done when
        `carried` says (at once in the first step simulated)."""
        start = START_OF[a.op]
        if start not in CARRIED:
            return None
        op = InFlight(Action(start, a.unit, a.mb))
        op.start, op.done = 0.0, max(0.0, self.carried.get((s, a.unit), 0.0))
        if op.done > self.now:
            self._at(op.done, self._wake, s)
        return op

    def carried_over(self) -> dict[tuple[int, int], float]:
        """(stage, unit) -> when this step's carried update completes, in the time of the next
        step, which starts when this one ended on that stage."""
        return {(s, key[1]): op.done - self.timelines[s].end
                for s in range(self.plan.pp) for key, op in self.ops[s].items()
                if key[0] in CARRIED}

    def _finish_wait(self, s: int, a: Action, since: float) -> bool:
        """What the wait `a` waited for is done: it returns now, or runs its own blocking
        collective and work first (WOS's gather and outer step, WRS's add; until 2026-11-29 a
        wait's duration was dropped: the outer step cost nothing); True when the walker is
        busy."""
        c, cost = self.costs[s], self.op_tables[s][a.op]
        work = cost.duration(c, a)
        gather = cost.blocking(c, a) if cost.blocking else 0.0
        if work or gather:
            self.pc[s] += 1
            compute = lambda: self._compute(s, a, work + c.overhead, since=since)  # noqa: E731
            if gather:
                self._over_replicas(s, gather, compute)
            else:
                compute()
            return True
        self.memory[s].record(self.now)
        overhead = c.overhead
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

    def _complete(self, s: int, op: InFlight) -> None:
        self.timelines[s].spans.append((op.name, op.start, op.done))
        self._wake(s)

    def _copy_gradient(self, s: int, a: Action) -> None:
        """The fold after backward `a` sends its gradient to the host on the gradient stream
        (StageCosts.fold_copy), behind the stream's earlier copies."""
        seconds = self.costs[s].fold_copy(a.unit, a.mb)
        if seconds:
            start = max(self.now, self.grad_copy_free[s])
            done = self.grad_copy_free[s] = self.grad_copied[s][a.unit] = start + seconds
            self.timelines[s].spans.append((f"fold copy {a.unit}.{a.mb}", start, done))

    # -- compute: processor sharing on a node (sim/shared_cores.py) ---------------------------

    def _compute(self, s: int, a: Action, seconds: float, then=None, op: InFlight | None = None,
                 since: float | None = None) -> None:
        """`since`: where a wait's work is the compute, when the wait began (its action's
        span on the timeline)."""
        start = self.now

        def done() -> None:
            if op is not None:
                op.done = self.now
            self.timelines[s].compute += self.now - start
            if a.op in FOLDS:
                self._copy_gradient(s, a)
            self.timelines[s].actions.append((a, start if since is None else since, self.now))
            self.memory[s].record(self.now)
            if then is not None:
                then()
            else:
                self._advance(s)

        if self.cores is None:
            self._at(self.now + seconds, done)
        else:
            self.cores.start(s, seconds, done)
