"""The cost of every IR action of one stage on a hardware profile: how it runs (its kind), how
long it takes, and what it does to the memory ledger.

`OPS` has one entry per op of schedule/ir.py (a test fails when an op has none). An entry's
`kind` tells the simulator which resource the action uses:

    compute     runs on the rank's own thread/stream: the walker waits for it (F, B, R, U, and
                on a device without a host link, the copies P, O, L: a CPU copies in place)
    copy        started on the copy engine; a later wait (WP, WL) waits for it
    send, recv  one side of a point-to-point transfer (SA/RA, SG/RG), matched with the peer
    sync        the data-parallel all-reduce of one unit (GS), over the stage's replicas
    norm        the all-reduce of the squared norm over the pipeline (N)
    wait        waits for the start it names (WSA, WRA, WSG, WRG, WGS, WN, WP, WL)
    step_end    the loss reduction: blocks until every stage reached it (E)
    free        no time (X: dropping a view)

Sharded state (the plan's `shard_state`, ZeRO-style): each of the dp replicas holds a slice of
S = ceil(N / dp) of a unit's N parameters (unit_costs.shard; N_pad = dp S). It changes what
four ops do; replica 0 is the one simulated:

    P u    an all-gather, not a copy: kind "sync" (on the replicas' links, shared with the
           syncs): cast the fp32 slice into its slot of the view ((4 + elt) S bytes at memory
           bandwidth), then a ring all-gather of the elt N_pad-byte view (StageCosts.gather).
           Its entry is in `SHARDED_OPS`, which `ops_for` lays over `OPS` for a sharded stage.
    GS u   a ring reduce-scatter of the 4 N_pad-byte gradient: (dp-1)/dp of it over the link
           plus (dp-1) latencies (`ring_half`), not the all-reduce's 2(dp-1)/dp
           (StageCosts.grad_sync, which the planner's closed forms read too)
    U u    updates S parameters, not N (StageCosts.update_params)
    N      the local norm reads 4 S bytes a unit; before the pipeline's reduction the squared
           norm is summed over the replicas: a blocking all-reduce of one fp32 scalar
           (StageCosts.norm_replicas; the simulator's "norm" kind runs it on the replicas' links)

The ledger (`unit_state_owners`, `view_bytes`): masters 4 S, gradients 4 (N_pad + S) (the full
accumulation buffer and the shard's), AdamW 8 x (real elements of the slice) + 4 x (pieces:
the parameter tensors the slice intersects), the view elt N_pad.

Memory effects replay the executor's ledger calls action for action (runtime/executor.py and
runtime/unit_state.py), on named storages with closed-form sizes (sim/unit_costs.py), so a
simulated peak is comparable with the executor's ledger kind by kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from ratrain.config import ModelConfig
from ratrain.ledger import Ledger
from ratrain.schedule.ir import Action, Op
from ratrain.sim import unit_costs as uc
from ratrain.sim.profile import HardwareProfile, Link

UPDATE_BYTES_PER_PARAM = 28
"""Fused AdamW reads parameter, gradient and both moments (16 bytes) and writes parameter and
moments (12) per fp32 parameter."""


@dataclass
class StageSetup:
    """Everything costing one stage's program needs."""

    profile: HardwareProfile
    model: ModelConfig
    micro_batch_size: int
    seq_len: int
    dtype: str
    n_micro: int
    units: range
    activation: dict[int, str]  # unit -> keep / recompute / offload
    view_units: frozenset[int]  # units whose program prefetches a view
    state_home: str
    dp: int
    pp: int
    p2p_prev: Link | None  # links to the neighbouring stages (None at the ends)
    p2p_next: Link | None
    replicas: Link  # the ring of this stage's replicas
    pipeline: Link  # the ring of one replica's stages
    clip: bool
    shard_state: bool = False  # masters and AdamW state sliced over the dp replicas (ZeRO-style)

    @cached_property
    def shape(self) -> uc.UnitShape:
        return uc.UnitShape(self.model, self.micro_batch_size, self.seq_len, self.dtype)

    def kind(self, u: int) -> str:
        return uc.unit_kind(self.model, u)

    def params(self, u: int) -> int:
        return uc.param_count(self.model, u)

    def shard(self, u: int) -> uc.Shard | None:
        """Replica 0's shard of unit u's state; None where the state is not sharded."""
        return uc.shard(self.model, u, self.dp) if self.shard_state else None


class StageCosts:
    def __init__(self, setup: StageSetup):
        self.s = setup
        p = setup.profile
        self.rate = p.rate(setup.dtype).achieved
        self.measured = p.measured_for(setup.model.name, setup.seq_len, setup.micro_batch_size,
                                       setup.dtype)
        self.bandwidth = p.device.memory_bandwidth
        self.host_link = p.device.host_link
        self.overhead = p.device.action_overhead_s
        self._act_bytes = uc.output_bytes(setup.shape, "block")

    # -- compute ------------------------------------------------------------------------------

    def forward(self, u: int, with_grad: bool = True) -> float:
        kind = self.s.kind(u)
        if self.measured is not None:
            times = getattr(self.measured, kind)
            if not with_grad and kind == "block" and self.measured.block_forward_no_grad_s:
                return self.measured.block_forward_no_grad_s
            return times.forward_s
        shape = self.s.shape
        return uc.forward_flops(shape, kind) / self.rate + uc.moved_bytes(shape, kind) / self.bandwidth

    def backward(self, u: int) -> float:
        kind = self.s.kind(u)
        if self.measured is not None:
            t = getattr(self.measured, kind).backward_s
        else:
            shape = self.s.shape
            t = uc.backward_flops(shape, kind) / self.rate + uc.moved_bytes(shape, kind) / self.bandwidth
        if u in self.s.view_units:  # fold the view's gradient into fp32: read both, write one
            t += 12 * self.s.params(u) / self.bandwidth
        return t

    def update_params(self, u: int) -> int:
        """Parameters unit u's update touches, and whose gradient its norm reads: all N, or
        the S of the replica's shard."""
        shard = self.s.shard(u)
        return shard.size if shard else self.s.params(u)

    def update(self, u: int) -> float:
        scale = 8 if self.s.clip else 0  # the gradient multiplied by the clip/unscale factor
        return (UPDATE_BYTES_PER_PARAM + scale) * self.update_params(u) / self.bandwidth

    def norm_local(self) -> float:
        return 4 * sum(self.update_params(u) for u in self.s.units) / self.bandwidth

    def norm_replicas(self) -> float:
        """Sharded: the squared norm summed over the replicas first (a blocking all-reduce of
        one fp32 scalar inside N); 0 otherwise (every replica has the whole sum)."""
        return ring(self.s.replicas, 4, self.s.dp) if self.s.shard_state else 0.0

    def grad_sync(self, u: int, link: Link | None = None, dp: int | None = None) -> float:
        """Unit u's gradient sync (GS) over `link` among `dp` replicas (default: the stage's):
        an all-reduce, or sharded, a reduce-scatter of the padded gradient."""
        link, dp = link or self.s.replicas, dp or self.s.dp
        if self.s.shard_state:
            return ring_half(link, self.grad_sync_bytes(u), dp)
        return ring(link, self.grad_sync_bytes(u), dp)

    def gather(self, u: int, link: Link | None = None) -> float:
        """Sharded P u: cast the replica's fp32 slice into its slot of the view (read 4 S,
        write elt S), then all-gather the view over the replicas."""
        shard = self.s.shard(u)
        cast = (4 + self.s.shape.elt) * shard.size / self.bandwidth
        return cast + ring_half(link or self.s.replicas, self.view_bytes(u), self.s.dp)

    # -- bytes --------------------------------------------------------------------------------

    def view_bytes(self, u: int) -> int:
        """The compute view: the unit's parameters in the compute dtype; sharded, the flat
        gathered buffer of N_pad elements (the parameters are views into it)."""
        shard = self.s.shard(u)
        return (shard.padded if shard else self.s.params(u)) * self.s.shape.elt

    def copy_time(self, nbytes: float) -> float:
        """Host<->device copy; without a host link, an in-memory copy (read + write)."""
        if self.host_link is None:
            return 2 * nbytes / self.bandwidth
        return self.host_link.time(nbytes)

    def act_bytes(self) -> int:
        return self._act_bytes

    def grad_sync_bytes(self, u: int) -> int:
        shard = self.s.shard(u)
        return 4 * (shard.padded if shard else self.s.params(u))

    # -- memory: the executor's ledger calls, on named storages -------------------------------

    def state_owners(self) -> list[tuple[tuple, str, tuple, int]]:
        """What a stage holds from one step to the next: each unit's unit_state_owners."""
        return [owner for u in self.s.units for owner in self.unit_state_owners(u)]

    def unit_state_owners(self, u: int) -> list[tuple[tuple, str, tuple, int]]:
        """A unit's masters, fp32 gradients and AdamW state (from the first update on).
        Sharded: the slice's masters, the full accumulation buffer plus the shard's gradient,
        AdamW over the slice's pieces (one 1-D parameter per tensor it intersects)."""
        shard = self.s.shard(u)
        if shard:
            masters, gradients = 4 * shard.size, 4 * (shard.padded + shard.size)
            optimizer = 8 * shard.real + 4 * shard.pieces
        else:
            n = self.s.params(u)
            masters = gradients = 4 * n
            optimizer = 8 * n + 4 * uc.param_tensors(self.s.model, self.s.kind(u))
        return [(("masters", u), "masters", ("master", u), masters),
                (("gradients", u), "gradients", ("gradbuf", u), gradients),
                (("optimizer", u), "optimizer", ("optim", u), optimizer)]

    def tokens_bytes(self) -> int:
        """The loader gives a step's micro-batches as views of one int64 tensor."""
        return self.s.n_micro * self.s.shape.tokens * 8

    def input_storage(self, u: int, mb: int) -> tuple[tuple, int]:
        if u == 0:
            return ("tokens",), self.tokens_bytes()
        return ("out", u - 1, mb), uc.output_bytes(self.s.shape, "block")

    def output_storage(self, u: int, mb: int) -> tuple[tuple, int]:
        return ("out", u, mb), uc.output_bytes(self.s.shape, self.s.kind(u))

    def saved_storages(self, u: int, mb: int, tag: str = "saved") -> list[tuple[tuple, int]]:
        """What unit u's forward on mb saves, as storages. The cached rotary tables and the
        targets are shared by every micro-batch on the device; a copy to the host or back
        (tag "host", "reloaded") is each micro-batch's own."""
        shape, kind = self.s.shape, self.s.kind(u)
        shared = tag == "saved"
        out = [((tag, u, mb), uc.saved_bytes(shape, kind))]
        if uc.table_bytes(shape, kind):
            out.append((("rope",) if shared else (tag, u, mb, "rope"), uc.table_bytes(shape, kind)))
        if kind == "head":  # views of the step's one int64 tensor of targets, like the inputs
            out.append((("targets",) if shared else (tag, u, mb, "targets"), self.tokens_bytes()))
        return out


Effect = Callable[[StageCosts, Action, Ledger], None]


def _hold(ledger: Ledger, owner, kind: str, storages) -> None:
    for key, nbytes in storages:
        ledger.hold_storage(owner, kind, key, nbytes)


def _forward_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    u, mb = a.layer, a.mb
    kept = [c.input_storage(u, mb), c.output_storage(u, mb)]
    saved = [] if c.s.activation.get(u, "keep") == "recompute" else c.saved_storages(u, mb)
    _hold(ledger, ("act", u, mb), "activations", saved + kept)
    ledger.release(("recv", u - 1, mb))


def _recompute_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    u, mb = a.layer, a.mb
    ledger.release(("act", u, mb))
    storages = c.saved_storages(u, mb) + [c.input_storage(u, mb), c.output_storage(u, mb)]
    _hold(ledger, ("act", u, mb), "activations", storages)


def _backward_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    u, mb = a.layer, a.mb
    ledger.release(("grad", u, mb))
    ledger.release(("act", u, mb))
    ledger.release(("offloaded", u, mb))
    if u > 0:
        ledger.hold_storage(("grad", u - 1, mb), "buffers", ("grad", u - 1, mb), c.act_bytes())


def _offload_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    u, mb = a.layer, a.mb
    ledger.release(("act", u, mb))
    _hold(ledger, ("act", u, mb), "activations", [c.input_storage(u, mb), c.output_storage(u, mb)])
    _hold(ledger, ("offloaded", u, mb), "offloaded", c.saved_storages(u, mb, "host"))


def _reload_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    u, mb = a.layer, a.mb
    ledger.release(("offloaded", u, mb))
    _hold(ledger, ("act", u, mb), "activations", c.saved_storages(u, mb, "reloaded"))


def _recv_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    owner = ("recv", a.layer, a.mb) if a.op is Op.RECV_ACT else ("grad", a.layer, a.mb)
    key = ("out", a.layer, a.mb) if a.op is Op.RECV_ACT else ("grad", a.layer, a.mb)
    ledger.hold_storage(owner, "buffers", key, c.act_bytes())


def _wait_send_grad_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    ledger.release(("grad", a.layer, a.mb))


def _prefetch_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    ledger.hold_storage(("views", a.layer), "views", ("view", a.layer), c.view_bytes(a.layer))


def _release_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    ledger.release(("views", a.layer))


def _no_memory(c: StageCosts, a: Action, ledger: Ledger) -> None:
    pass


@dataclass(frozen=True)
class OpCost:
    kind: str
    duration: Callable[[StageCosts, Action], float]
    memory: Effect = _no_memory


def _zero(c: StageCosts, a: Action) -> float:
    return 0.0


def _forward_time(c: StageCosts, a: Action) -> float:
    return c.forward(a.layer, with_grad=c.s.activation.get(a.layer, "keep") != "recompute")


def _saved_copy(c: StageCosts, a: Action) -> float:
    return c.copy_time(sum(n for _, n in c.saved_storages(a.layer, a.mb)))


def ring(link: Link, nbytes: float, n: int) -> float:
    """Ring all-reduce of `nbytes` over n ranks: 2(n-1) steps of nbytes/n each."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def ring_half(link: Link, nbytes: float, n: int) -> float:
    """Ring reduce-scatter, or all-gather, of `nbytes` (the whole) over n ranks: n-1 steps of
    nbytes/n each (half an all-reduce)."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency


def _p2p_time(c: StageCosts, a: Action) -> float:
    toward_next = a.op in (Op.SEND_ACT, Op.RECV_GRAD)
    link = c.s.p2p_next if toward_next else c.s.p2p_prev
    return link.time(c.act_bytes())


OPS: dict[Op, OpCost] = {
    Op.FORWARD: OpCost("compute", _forward_time, _forward_memory),
    Op.BACKWARD: OpCost("compute", lambda c, a: c.backward(a.layer), _backward_memory),
    Op.RECOMPUTE: OpCost("compute", lambda c, a: c.forward(a.layer), _recompute_memory),
    Op.SEND_ACT: OpCost("send", _p2p_time),
    Op.WAIT_SEND_ACT: OpCost("wait", _zero),
    Op.RECV_ACT: OpCost("recv", _p2p_time, _recv_memory),
    Op.WAIT_RECV_ACT: OpCost("wait", _zero),
    Op.SEND_GRAD: OpCost("send", _p2p_time),
    Op.WAIT_SEND_GRAD: OpCost("wait", _zero, _wait_send_grad_memory),
    Op.RECV_GRAD: OpCost("recv", _p2p_time, _recv_memory),
    Op.WAIT_RECV_GRAD: OpCost("wait", _zero),
    Op.GRAD_SYNC: OpCost("sync", lambda c, a: c.grad_sync(a.layer)),
    Op.WAIT_GRAD_SYNC: OpCost("wait", _zero),
    Op.GRAD_NORM: OpCost("norm", lambda c, a: ring(c.s.pipeline, 4, c.s.pp)),
    Op.WAIT_GRAD_NORM: OpCost("wait", _zero),
    Op.UPDATE: OpCost("compute", lambda c, a: c.update(a.layer)),
    Op.OFFLOAD: OpCost("copy", _saved_copy, _offload_memory),
    Op.RELOAD: OpCost("copy", _saved_copy, _reload_memory),
    Op.WAIT_RELOAD: OpCost("wait", _zero),
    Op.PREFETCH: OpCost("copy", lambda c, a: c.copy_time(c.view_bytes(a.layer)), _prefetch_memory),
    Op.WAIT_PREFETCH: OpCost("wait", _zero),
    Op.RELEASE: OpCost("free", _zero, _release_memory),
    Op.STEP_END: OpCost("step_end", lambda c, a: ring(c.s.pipeline, 8, c.s.pp) + ring(c.s.replicas, 8, c.s.dp)),
}

SHARDED_OPS: dict[Op, OpCost] = {
    Op.PREFETCH: OpCost("sync", lambda c, a: c.gather(a.layer), _prefetch_memory),  # an all-gather
}
"""The entries that sharded state replaces (its kind changes); GS, U and N keep theirs and
price the shard through StageCosts (module docstring)."""


def ops_for(shard_state: bool) -> dict[Op, OpCost]:
    """The op table of a stage: OPS, with SHARDED_OPS over it where the state is sharded."""
    return {**OPS, **SHARDED_OPS} if shard_state else OPS
