"""Walks one stage's program: for each action, its handler (runtime/handlers.py), then its
memory effects from the op registry (schedule/ops.py) on the ledger, then its trace record.

The handlers do the work: compute (runtime/compute.py), pipeline transfers
(runtime/transfer.py), the units' training state and the step's end (runtime/lifecycle.py).
Waiting is the backend's (runtime/comm.py: a timed host wait on gloo, a stream wait on NCCL);
per-step state lives in a StepState made for each walk. The ledger follows every tensor the
executor and the units' training state hold; the simulator applies the same effects to sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ratrain.schedule.ledger import apply_effects
from ratrain.runtime.carried_updates import HostJob, HostUpdates
from ratrain.runtime.comm import comm_for
from ratrain.runtime.handlers import HANDLERS
from ratrain.runtime.loss_scale import DynamicLossScale
from ratrain.runtime.memory_ledger import tensor_storages
from ratrain.runtime.stage import Stage
from ratrain.runtime.step_clock import HostClock, clock_for
from ratrain.runtime.step_state import StepState
from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import SPECS, Op, OpClass
from ratrain.schedule.unit_major import fold_roles
from ratrain.runtime.trace import FutureEnd, Tracer


@dataclass
class StepResult:
    loss: float
    grad_norm: float | None = None
    skipped: bool = False
    """fp16: the step's gradients overflowed, so no unit was updated (the loss scale was lowered)."""


class Executor:
    def __init__(
        self,
        stage: Stage,
        act_shape: tuple[int, ...],
        *,
        groups=None,
        clip: float = 0.0,
        tracer: Tracer | None = None,
        act_dtype: torch.dtype = torch.float32,
        loss_scale: DynamicLossScale | None = None,
        comm_timeout_s: float = 300.0,
        outer=None,
    ):
        self.stage = stage
        self.ledger = stage.ledger
        self.head = stage.cfg.model.n_layers + 1  # the unit that ends in the loss
        self.act_shape = act_shape
        self.act_dtype = act_dtype
        self.loss_scale = loss_scale
        self.groups = groups
        self.dp = groups.grid.dp if groups else 1
        self.pp = groups.grid.pp if groups else 1
        # --sync diloco (runtime/outer_sync.OuterStates): no gradient is summed over the
        # replicas (with islands: only the island's), so each replica's loss is its own (its
        # island's) mean, not a 1/dp share of the global one
        self.outer = outer
        # PipelinePlan.summed_on_device: their gradients are summed before they fold
        self.device_sum = frozenset(u for u, s in stage.state.items() if s.sums_on_device)
        self.grad_replicas = outer.sync.island_size(self.dp) if outer is not None else self.dp
        self.clip = clip
        self.tracer = tracer
        self.comm = comm_for(groups, stage.device, comm_timeout_s)
        self.clock = clock_for(stage.device)
        self.host_updates = HostUpdates()  # carried updates (SU/WU) in flight

    def train_step(self, program: Program, batches, lr: float, step: int = 0) -> StepResult:
        """Run one optimizer step; `batches` are this replica's (inputs, targets) micro-batches.
        Each unit's update takes `lr` when it runs (a carried one may still be running the
        previous step's with its own)."""
        recompute = frozenset(a.unit for a in program if a.op is Op.RECOMPUTE)
        st = self._run(program, StepState(batches, step, True, recompute, lr=lr,
                                          fold=fold_roles(program, self.device_sum)))
        skipped = bool(st.read.get("found_inf", 0.0))
        if self.loss_scale and "grad_norm" in st.read:
            self.loss_scale.update(st.read["grad_norm"])  # halves the scale on an overflow
        return StepResult(st.loss, st.read.get("grad_norm"), skipped)

    @torch.no_grad()
    def eval_step(self, program: Program, batches) -> float:
        """Forward-only pass of an evaluation program; returns the mean loss over micro-batches."""
        self.host_updates.finish()
        return self._run(program, StepState(batches, -1, False, frozenset())).loss

    def _run(self, program: Program, st: StepState) -> StepState:
        self.stage.train(st.training)
        trace = _TraceRecorder(self.tracer, self.clock, st.step) if self.tracer and st.training else None
        for action in program:
            spec = SPECS[action.op]
            t0 = trace.mark() if trace else None
            work = HANDLERS[action.op](self, st, action)
            if st.training:  # evaluation keeps nothing from one step to the next
                apply_effects(self.ledger, spec.memory, action.unit, action.mb,
                              lambda name: tensor_storages(st.bound.get(name, ())))
            st.bound.clear()
            if trace:
                trace.action(action, t0, work, self._completion(action, work))
        if trace:
            trace.flush()
        return st

    def _completion(self, action: Action, work):
        """A future that fires when `work` completes, where the backend's future means that:
        gloo collectives (gloo's p2p has none; NCCL's completes at enqueue), and the host
        update thread's jobs (runtime/carried_updates.HostJob). Otherwise the trace ends the
        span when the program waits for the work."""
        if isinstance(work, HostJob):
            return work
        if work is None or SPECS[action.op].cls is not OpClass.COLLECTIVE:
            return None
        if self.stage.device.type != "cpu":
            return None
        return FutureEnd(work.get_future())


class _TraceRecorder:
    """One step's trace records: straight to the tracer on a CPU; on CUDA, CUDA events kept
    until the step has ended and resolved into host times then (runtime/step_clock.py)."""

    def __init__(self, tracer: Tracer, clock, step: int):
        self.tracer, self.clock = tracer, clock
        self.now = isinstance(clock, HostClock)
        self.queued: list[tuple] = []
        tracer.begin_step(step)
        clock.begin()

    def mark(self):
        return self.clock.mark()

    def action(self, a: Action, t0, work, completion) -> None:
        t1 = self.clock.mark()
        record = (a, t0, t1, completion)
        if self.now:
            self._emit(*record)
        else:
            self.queued.append(record)

    def flush(self) -> None:
        if self.queued:
            self.clock.settle()
        for a, t0, t1, completion in self.queued:
            self._emit(a, self.clock.resolve(t0), self.clock.resolve(t1), completion)
        self.queued.clear()

    def _emit(self, a: Action, t0: float, t1: float, completion) -> None:
        spec = SPECS[a.op]
        self.tracer.record(str(a), t0, t1)
        if spec.starts:
            self.tracer.start_async(str(a), t0, completion)
        elif spec.waits:
            self.tracer.end_async(str(Action(spec.waits, a.unit, a.mb)), t1)
