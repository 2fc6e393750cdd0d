"""Walks one stage's program: one handler per op, handles of asynchronous work kept until the
program's wait action for them.

Each unit's forward runs on a detached copy of its input that requires grad, so each unit's
backward is its own action: `B u.m` back-propagates unit u alone and leaves the gradient of its
input for unit u - 1 (or for the send to the previous stage). What a forward saves for its
backward is held in a SavedActivations (counted, offloadable); the memory ledger follows every
tensor the executor and the units' training state hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ratrain.models.llama import lm_loss
from ratrain.optim import set_lr
from ratrain.runtime import p2p, timed_comm
from ratrain.runtime.loss_scale import DynamicLossScale
from ratrain.runtime.saved_activations import SavedActivations
from ratrain.runtime.stage import Stage
from ratrain.schedule.ir import START_OF, WAIT_OF, Action, Op, Program
from ratrain.trace import Tracer


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
        self.clip = clip
        self.tracer = tracer
        self.comm_timeout_s = comm_timeout_s
        self.recompute: set[int] = set()
        self._handlers = {
            Op.FORWARD: self._forward,
            Op.BACKWARD: self._backward,
            Op.RECOMPUTE: self._recompute,
            Op.SEND_ACT: self._send_act,
            Op.RECV_ACT: self._recv_act,
            Op.SEND_GRAD: self._send_grad,
            Op.RECV_GRAD: self._recv_grad,
            Op.WAIT_SEND_ACT: self._wait,
            Op.WAIT_SEND_GRAD: self._wait,
            Op.WAIT_RECV_ACT: self._wait_recv_act,
            Op.WAIT_RECV_GRAD: self._wait_recv_grad,
            Op.GRAD_SYNC: self._grad_sync,
            Op.WAIT_GRAD_SYNC: self._wait_grad_sync,
            Op.GRAD_NORM: self._grad_norm,
            Op.WAIT_GRAD_NORM: self._wait_grad_norm,
            Op.UPDATE: self._update,
            Op.OFFLOAD: self._offload,
            Op.RELOAD: self._reload,
            Op.WAIT_RELOAD: self._wait_reload,
            Op.PREFETCH: self._prefetch,
            Op.WAIT_PREFETCH: self._wait_prefetch,
            Op.RELEASE: self._release,
            Op.STEP_END: self._step_end,
        }

    # -- entry points -------------------------------------------------------------------------

    def train_step(self, program: Program, batches, lr: float, step: int = 0) -> StepResult:
        """Run one optimizer step; `batches` are this replica's (inputs, targets) micro-batches."""
        self.recompute = {a.layer for a in program if a.op is Op.RECOMPUTE}
        set_lr(self.stage.optimizers(), lr)
        self._run(program, batches, step, training=True)
        return StepResult(self._loss, self._grad_norm, self._skip)

    @torch.no_grad()
    def eval_step(self, program: Program, batches) -> float:
        """Forward-only pass of an evaluation program; returns the mean loss over micro-batches."""
        self.recompute = set()
        self._run(program, batches, step=-1, training=False)
        return self._loss

    # -- the walk -----------------------------------------------------------------------------

    def _run(self, program: Program, batches, step: int, training: bool) -> None:
        self.batches = batches
        self.step = step
        self.n_micro = len(batches)
        self.training = training
        self.act: dict[tuple[int, int], torch.Tensor] = {}  # unit output (with graph when local)
        self.inp: dict[tuple[int, int], torch.Tensor] = {}  # detached unit input
        self.grad: dict[tuple[int, int], torch.Tensor] = {}  # gradient of a unit's output
        self.saved: dict[tuple[int, int], SavedActivations] = {}
        self.pending: dict[Action, object] = {}  # start action -> (work, tensor)
        self.losses: list[torch.Tensor] = []
        self._loss = float("nan")
        self._norm: tuple[object, torch.Tensor] | None = None  # (work, squared norm) after N
        self.syncs: dict[int, object] = {}  # unit -> its gradient sync in flight
        self._grad_norm = None
        self._grad_factor = None  # what U multiplies the gradients by: clipping, 1/loss scale
        self._skip = False
        self.stage.train(training)
        trace = self.tracer if self.tracer and training else None
        if trace:
            trace.begin_step(step)
        for action in program:
            handler = self._handlers.get(action.op)
            if handler is None:
                raise NotImplementedError(f"{action.op.name} ({action}) is not supported by this executor")
            t0 = time.perf_counter()
            work = handler(action)  # a start returns its work handle
            if trace:
                t1 = time.perf_counter()
                trace.record(str(action), t0, t1)
                if action.op in WAIT_OF:
                    trace.start_async(str(action), t0, self._completion(action, work))
                elif action.op in START_OF:
                    trace.end_async(str(Action(START_OF[action.op], action.layer, action.mb)), t1)

    def _completion(self, action: Action, work):
        """A future that fires when `work` completes, where the backend's future means that:
        gloo collectives. (gloo's p2p has none; NCCL's completes at enqueue.) Otherwise the
        trace ends the span when the program waits for the work."""
        if work is None or action.op not in (Op.GRAD_SYNC, Op.GRAD_NORM):
            return None
        if self.stage.device.type != "cpu":
            return None
        try:
            return work.get_future()
        except RuntimeError:  # gloo's reduce-scatter (sharded state) has none
            return None

    def _unit_input(self, u: int, mb: int) -> torch.Tensor:
        if u == 0:
            return self.batches[mb][0].to(self.stage.device, non_blocking=True)
        # A local producer keeps its output until its own backward; in eval nothing is kept.
        keep = self.training and u - 1 in self.stage.units
        src = self.act[(u - 1, mb)] if keep else self.act.pop((u - 1, mb))
        return src.detach()

    def _apply(self, u: int, mb: int, x: torch.Tensor) -> torch.Tensor:
        with self.stage.autocast():
            y = self.stage.modules[u](x)
            if u == self.head:
                target = self.batches[mb][1].to(self.stage.device, non_blocking=True)
                loss = lm_loss(y, target)
                self.losses.append(loss.detach())
                scale = self.loss_scale.scale if self.loss_scale and self.training else 1.0
                return loss * (scale / (self.n_micro * self.dp))
        return y

    def _apply_saving(self, u: int, mb: int, x: torch.Tensor) -> torch.Tensor:
        """Forward with autograd, what it saves held in self.saved[(u, mb)]."""
        if x.is_floating_point():
            x.requires_grad_()
        held = {p.untyped_storage().data_ptr() for p in self.stage.modules[u].parameters()}
        held.add(x.untyped_storage().data_ptr())
        saved = self.saved[(u, mb)] = SavedActivations(held)
        with saved.hooks():
            y = self._apply(u, mb, x)
        self.ledger.hold(("act", u, mb), "activations", saved.tensors + [x, y])
        return y

    # -- compute ------------------------------------------------------------------------------

    def _forward(self, a: Action) -> None:
        x = self._unit_input(a.layer, a.mb)
        if not self.training or a.layer in self.recompute:
            with torch.no_grad():
                y = self._apply(a.layer, a.mb, x)
            if self.training:
                self.ledger.hold(("act", a.layer, a.mb), "activations", [x, y])
        else:
            y = self._apply_saving(a.layer, a.mb, x)
        self.ledger.release(("recv", a.layer - 1, a.mb))  # a received input is an activation now
        if self.training:
            self.inp[(a.layer, a.mb)] = x
        if self.training or a.layer != self.head:
            self.act[(a.layer, a.mb)] = y

    def _recompute(self, a: Action) -> None:
        if a.layer == self.head:
            self.losses.pop()  # the recomputed forward records the same loss again
        self.ledger.release(("act", a.layer, a.mb))  # the no-grad output is replaced
        x = self.inp[(a.layer, a.mb)]
        self.act[(a.layer, a.mb)] = self._apply_saving(a.layer, a.mb, x)

    def _backward(self, a: Action) -> None:
        y = self.act.pop((a.layer, a.mb))
        if a.layer == self.head:
            y.backward()
        else:
            y.backward(self.grad.pop((a.layer, a.mb)))
            self.ledger.release(("grad", a.layer, a.mb))
        self.stage.state[a.layer].fold_grads()
        x = self.inp.pop((a.layer, a.mb))
        self.saved.pop((a.layer, a.mb), None)
        self.ledger.release(("act", a.layer, a.mb))
        self.ledger.release(("offloaded", a.layer, a.mb))
        if a.layer > 0:
            self.grad[(a.layer - 1, a.mb)] = x.grad
            self.ledger.hold(("grad", a.layer - 1, a.mb), "buffers", [x.grad])

    # -- activation offload and parameter views -----------------------------------------------

    def _offload(self, a: Action) -> None:
        key = (a.layer, a.mb)
        saved = self.saved[key]
        self.ledger.release(("act", *key))
        saved.offload(self.stage.copies)
        self.ledger.hold(("act", *key), "activations", [self.inp[key], self.act[key]])
        self.ledger.hold(("offloaded", *key), "offloaded", saved.tensors)

    def _reload(self, a: Action) -> None:
        saved = self.saved[(a.layer, a.mb)]
        saved.reload(self.stage.copies, self.stage.device)
        self.ledger.release(("offloaded", a.layer, a.mb))
        self.ledger.hold(("act", a.layer, a.mb), "activations", saved.tensors)

    def _wait_reload(self, a: Action) -> None:
        self.saved[(a.layer, a.mb)].wait_reload(self.stage.copies)

    def _prefetch(self, a: Action):
        work = self.stage.state[a.layer].prefetch()  # sharded: the all-gather
        if work is not None:
            self.pending[a] = (work, None)
        return work

    def _wait_prefetch(self, a: Action) -> None:
        gathered = self.pending.pop(Action(Op.PREFETCH, a.layer), None)
        if gathered is not None:
            self._timed_wait(gathered[0], a, self._replica_peers())
        self.stage.state[a.layer].wait_view()

    def _release(self, a: Action) -> None:
        self.stage.state[a.layer].release_view()

    # -- pipeline point-to-point --------------------------------------------------------------

    def _send_act(self, a: Action):
        t = self.act[(a.layer, a.mb)].detach()
        if not self.training:
            self.act.pop((a.layer, a.mb))
        g = self.groups
        work = p2p.isend(t, g.next_rank, g.act_to_next, p2p.ACT, a.layer, a.mb, self.n_micro)
        self.pending[a] = (work, t)
        return work

    def _recv_act(self, a: Action):
        buf = torch.empty(self.act_shape, dtype=self.act_dtype, device=self.stage.device)
        self.ledger.hold(("recv", a.layer, a.mb), "buffers", [buf])
        g = self.groups
        work = p2p.irecv(buf, g.prev_rank, g.act_from_prev, p2p.ACT, a.layer, a.mb, self.n_micro)
        self.pending[a] = (work, buf)
        return work

    def _send_grad(self, a: Action):
        t = self.grad.pop((a.layer, a.mb))
        g = self.groups
        work = p2p.isend(t, g.prev_rank, g.grad_to_prev, p2p.GRAD, a.layer, a.mb, self.n_micro)
        self.pending[a] = (work, t)
        return work

    def _recv_grad(self, a: Action):
        buf = torch.empty(self.act_shape, dtype=self.act_dtype, device=self.stage.device)
        self.ledger.hold(("grad", a.layer, a.mb), "buffers", [buf])
        g = self.groups
        work = p2p.irecv(buf, g.next_rank, g.grad_from_next, p2p.GRAD, a.layer, a.mb, self.n_micro)
        self.pending[a] = (work, buf)
        return work

    def _wait(self, a: Action) -> torch.Tensor:
        work, t = self.pending.pop(Action(START_OF[a.op], a.layer, a.mb))
        g = self.groups
        peer = g.next_rank if a.op in (Op.WAIT_SEND_ACT, Op.WAIT_RECV_GRAD) else g.prev_rank
        self._timed_wait(work, a, f"rank {peer}")
        if a.op is Op.WAIT_SEND_GRAD:
            self.ledger.release(("grad", a.layer, a.mb))
        return t

    def _wait_recv_act(self, a: Action) -> None:
        self.act[(a.layer, a.mb)] = self._wait(a)

    def _wait_recv_grad(self, a: Action) -> None:
        self.grad[(a.layer, a.mb)] = self._wait(a)

    def _timed_wait(self, work, a: Action, peer: str) -> None:
        when = f"step {self.step + 1}" if self.training else "validation"
        timed_comm.wait(work, self.comm_timeout_s, when, str(a), peer)

    def _replica_peers(self) -> str:
        """The stage's other replicas, for a timed-out wait's message."""
        g = self.groups
        return timed_comm.ranks_text(g.grid.replica_ranks(g.stage), g.rank)

    def _pipeline_peers(self) -> str:
        """The replica's other stages, for a timed-out wait's message."""
        g = self.groups
        return timed_comm.ranks_text(g.grid.pipeline_ranks(g.replica), g.rank)

    # -- training state -----------------------------------------------------------------------

    def _grad_sync(self, a: Action):
        work = self.syncs[a.layer] = self.stage.state[a.layer].start_sync(self.groups.replicas)
        return work

    def _wait_grad_sync(self, a: Action) -> None:
        work = self.syncs.pop(a.layer, None)
        if work is not None:
            self._timed_wait(work, a, self._replica_peers())
        self.stage.state[a.layer].wait_sync()

    def _grad_norm(self, a: Action):
        """Start reducing the stage's squared gradient norm over the pipeline stages (sharded:
        first summed over the stage's replicas, each of which holds a slice)."""
        parts = [sq for s in self.stage.state.values() if (sq := s.sq_norm()) is not None]
        sq = (torch.stack(parts).sum() if parts else torch.zeros((), device=self.stage.device)).reshape(1)
        if self.stage.sharded:  # each replica holds a slice of the stage's gradients
            self._timed_wait(dist.all_reduce(sq, group=self.groups.replicas, async_op=True), a,
                             self._replica_peers())
        work = dist.all_reduce(sq, group=self.groups.pipeline, async_op=True) if self.pp > 1 else None
        self._norm = (work, sq)
        return work

    def _wait_grad_norm(self, a: Action) -> None:
        work, sq = self._norm
        if work is not None:
            self._timed_wait(work, a, self._pipeline_peers())
        self._norm = None
        scale = self.loss_scale.scale if self.loss_scale else 1.0
        total = float(sq.sqrt()) / scale
        self._grad_norm = total
        # The norm is the same on every rank, so every rank skips the same fp16 steps.
        self._skip = self.loss_scale is not None and self.loss_scale.update(total)
        # Same coefficient as torch.nn.utils.clip_grad_norm_, so a single-process run matches.
        clip_coef = min(1.0, self.clip / (total + 1e-6)) if self.clip > 0 else 1.0
        self._grad_factor = clip_coef / scale if (self.clip > 0 or self.loss_scale) else None

    def _update(self, a: Action) -> None:
        state = self.stage.state[a.layer]
        if self._skip:
            state.zero_grad()
        else:
            state.update(self._grad_factor)

    def _step_end(self, a: Action) -> None:
        """Mean loss over all micro-batches of all replicas, known on every rank.

        Sums and counts are reduced rather than means, because evaluation may give replicas
        different numbers of micro-batches.
        """
        local = torch.stack(self.losses).sum().float() if self.losses else torch.zeros(())
        total = torch.stack([local.cpu(), torch.tensor(float(len(self.losses)))]).to(self.stage.device)
        g = self.groups
        if self.pp > 1:
            self._timed_wait(dist.all_reduce(total, group=g.pipeline, async_op=True), a,
                             self._pipeline_peers())
        if self.dp > 1:
            self._timed_wait(dist.all_reduce(total, group=g.replicas, async_op=True), a,
                             self._replica_peers())
        self._loss = float(total[0] / total[1])
        syncing = [u for u, state in self.stage.state.items() if state.syncing]
        if self.pending or syncing or self._norm or self.act or self.grad or self.saved:
            left = sorted(map(str, self.pending)) + [f"sync {u}" for u in syncing]
            left += [f"saved activations {k}" for k in self.saved]
            left += ["norm"] if self._norm else []
            left += [f"act {k}" for k in self.act] + [f"grad {k}" for k in self.grad]
            raise RuntimeError(f"step ended with unfinished work: {', '.join(left[:8])}")
