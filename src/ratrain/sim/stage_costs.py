"""The sizes and times of the parts of one stage's program (StageCosts), from what costing it
needs (sim/stage_setup.py): compute per unit, state and view bytes, copies, collectives over
the stage's links (sim/links.py), and the named storages of the op registry's memory effects
(sim/stage_storages.py). sim/cost_model.py turns them into each op's duration."""

from __future__ import annotations

from ratrain.sim.fold_costs import (fold_copy_bytes, fold_s, last_folds, summed_on_device,
                                     summed_runs, unit_norm_s)
from ratrain.sim import unit_costs as uc
from ratrain.sim.links import Link, ring, ring_half
from ratrain.sim.shape_scale import shape_scale
from ratrain.sim.stage_setup import StageSetup
from ratrain.sim.stage_storages import StageStorages

UPDATE_BYTES_PER_PARAM = 28
"""Fused AdamW reads parameter, gradient and both moments (16 bytes) and writes parameter and
moments (12) per fp32 parameter."""


class StageCosts(StageStorages):
    def __init__(self, setup: StageSetup):
        self.s = setup
        p = setup.profile
        self.rate = p.rate(setup.dtype).achieved
        self.attention_rate = p.rate(setup.dtype).attention_achieved
        self.measured = p.measured_for(setup.model, setup.seq_len, setup.micro_batch_size,
                                       setup.dtype)
        self.bandwidth = p.device.memory_bandwidth
        self.host_link = p.device.host_link
        self._host_bandwidth = p.device.host_memory_bandwidth or self.bandwidth
        self.overhead = p.device.action_overhead_s
        self._act_bytes = uc.output_bytes(setup.shape, "block")
        self.summed = summed_runs(setup.fold_roles or {})
        self.device_summed = summed_on_device(setup.fold_roles or {})
        self.last_folds = last_folds(setup.fold_roles or {})
        # a unit's compute times depend on its kind alone, and are read at each micro-batch
        self._times: dict[tuple, object] = {}
        self._working: dict[tuple, int] = {}
        self._scale = {} if self.measured is not None else shape_scale(
            p.measured, setup.shape, self._priced_unit)

    def across_link(self, u: int) -> bool:
        """Unit u's state lives on a host apart from the compute device (behind a host link)."""
        return self.host_link is not None and self.s.state_on_host(u)

    def state_bandwidth(self, u: int) -> float:
        """Where unit u's state's own elementwise work (fold, norm, update) runs: host-homed
        state behind a host link is updated by the CPU."""
        return self._host_bandwidth if self.across_link(u) else self.bandwidth

    def runs_on_device(self, u: int) -> bool:
        """A run's folds of unit u (unit_major.fold_roles) add to a run's sum on the device,
        the run's last folding it across the link."""
        return self.across_link(u) and self.s.grad_lifetime == "step"

    # -- compute ------------------------------------------------------------------------------

    def forward(self, u: int, with_grad: bool = True) -> float:
        return self._per_kind(self._forward, u, with_grad)

    def _per_kind(self, price, u: int, *args):
        """`price`(kind, *args) of unit u's kind, priced once."""
        key = (price.__name__, self.s.kind(u), *args)  # the method itself would hold self
        if key not in self._times:
            self._times[key] = price(key[1], *args)
        return self._times[key]

    def _forward(self, kind: str, with_grad: bool) -> float:
        if self.measured is not None:
            times = getattr(self.measured, kind)
            if not with_grad and kind == "block" and self.measured.block_forward_no_grad_s:
                return self.measured.block_forward_no_grad_s
            return times.forward_s
        return sum(self._priced(uc.forward_flops(self.s.shape, kind), kind)) \
            * self._scale.get(kind, 1.0)

    def backward(self, u: int, mb: int | None = None) -> float:
        """B u.mb (mb None: the step's mean over its micro-batches), with its fold."""
        return sum(self._backward_parts(u)) + self._fold(u, mb)

    def backward_input(self, u: int) -> float:
        """BI: measured where the profile has the shape's halves, else priced
        (uc.split_backward_s)."""
        return self._split(u)[0]

    def backward_weight(self, u: int, mb: int | None = None) -> float:
        """BW: as BI, the weight-gradient half; and the fold of a view's gradient."""
        return self._split(u)[1] + self._fold(u, mb)

    def _split(self, u: int) -> tuple[float, float]:
        return self._per_kind(self._split_s, u)

    def _split_s(self, kind: str) -> tuple[float, float]:
        times = getattr(self.measured, kind) if self.measured is not None else None
        whole = kind == "head" and uc.head_chunks(self.s.shape)
        if times is not None and times.backward_input_s is not None and not whole:
            return times.backward_input_s, times.backward_weight_s
        return uc.split_backward_s(kind, *self._backward_s(kind), whole=whole)

    def _backward_parts(self, u: int) -> tuple[float, float]:
        """Seconds of unit u's backward in its matrix products (and the rest), and in
        attention's core: a measured backward shared out by FLOPs, else priced."""
        return self._per_kind(self._backward_s, u)

    def _backward_s(self, kind: str) -> tuple[float, float]:
        shape = self.s.shape
        if self.measured is not None:
            whole = getattr(self.measured, kind).backward_s
            attention = whole * uc.attention_flops(shape, kind) / uc.forward_flops(shape, kind) \
                if kind == "block" else 0.0
            return whole - attention, attention
        scale = self._scale.get(kind, 1.0)
        return tuple(part * scale for part in self._priced(uc.backward_flops(shape, kind), kind,
                                                           backward=True))

    def _priced(self, flops: float, kind: str, backward: bool = False,
                shape: uc.UnitShape | None = None) -> tuple[float, float]:
        """(matrix products and memory traffic, attention's core) seconds of `flops` of a unit
        of `kind` (on the stage's micro-batch shape, or `shape`), each part at its own rate
        (ComputeRate.attention_efficiency)."""
        shape = shape or self.s.shape
        attention = uc.attention_flops(shape, kind) * (2.0 if backward else 1.0)
        extra = uc.backward_moved_bytes(shape, kind) if backward else 0.0
        moved = uc.moved_bytes(shape, kind) + extra
        return ((flops - attention) / self.rate + moved / self.bandwidth,
                attention / self.attention_rate)

    def _priced_unit(self, shape: uc.UnitShape, kind: str) -> float:
        """A unit's forward + backward on `shape` at the profile's rates (shape_scale's)."""
        return (sum(self._priced(uc.forward_flops(shape, kind), kind, shape=shape))
                + sum(self._priced(uc.backward_flops(shape, kind), kind, True, shape)))

    def _fold(self, u: int, mb: int | None) -> float:
        return fold_s(self, u, mb)

    def fold_copy(self, u: int, mb: int) -> float:
        """The copy of unit u's gradient to the host after its backward on micro-batch mb
        (the gradient stream's; 0 where the fold sends none)."""
        nbytes = fold_copy_bytes(self, u, mb)
        return self.host_link.time(nbytes) if nbytes else 0.0

    def unit_norm(self, u: int) -> float:
        """SN u: the add of the unit's last fold where it is one, then its squared norm."""
        return unit_norm_s(self, u)

    def update_params(self, u: int) -> int:
        """Parameters unit u's update touches, and whose gradient its norm reads: all N, or
        the S of the replica's shard."""
        shard = self.s.shard(u)
        return shard.size if shard else self.s.params(u)

    def update(self, u: int) -> float:
        """U u: the fused AdamW, and with clipping the gradient scaled first (read and write
        it) or, where the host updates for a GPU, by the AdamW as it reads it (it writes the
        scaled gradient back: 4 bytes; runtime/unit_state.step_masters)."""
        scale = (4 if self.across_link(u) else 8) if self.s.clip else 0
        # a bf16 gradient is cast into a cache-sized fp32 scratch chunk by chunk, each chunk
        # stepped at once (runtime/host_grad.py): the cast's work, not its bytes, is what
        # costs (bench/host_grad_update.py: 1.20-1.24x the fp32 update on the host-for-GPU
        # path, 2 cores, 2026-11-29; priced 39 / 32 = 1.22x)
        cast = 7 if self.s.grad_bytes(u) == 2 else 0
        return ((UPDATE_BYTES_PER_PARAM + scale + cast) * self.update_params(u)
                / self.state_bandwidth(u))

    def norm_local(self) -> float:
        """N's own read of the gradients: of the units no SN measured already."""
        # bytes summed per tier, one division each: a plan without device units is priced to
        # the bit as when every unit read at one bandwidth
        read: dict[float, int] = {}
        for u in self.s.units:
            if u not in self.s.host_norms:
                bandwidth = self.state_bandwidth(u)
                read[bandwidth] = (read.get(bandwidth, 0)
                                   + self.s.grad_bytes(u) * self.update_params(u))
        return sum(n / bandwidth for bandwidth, n in read.items())

    def norm_replicas(self) -> float:
        """Sharded: the squared norm summed over the replicas first (a blocking all-reduce of
        one fp32 scalar inside N); 0 otherwise (every replica has the whole sum)."""
        return ring(self.s.shard_link, 4, self.s.shard_replicas) if self.s.shard_state else 0.0

    def grad_sync(self, u: int, link: Link | None = None, dp: int | None = None) -> float:
        """Unit u's gradient sync (GS) over `link` among `dp` replicas (default: those the
        stage sums its gradients over, an island's under --sync diloco's islands): an
        all-reduce, or sharded, a reduce-scatter of the padded gradient (over the shard group,
        with hybrid sharding), which costs an all-reduce on gloo."""
        if self.s.shard_state:
            link, dp = link or self.s.shard_link, dp or self.s.shard_replicas
            scatter = ring if self.s.profile.device.reduce_scatter_all_reduces else ring_half
            return scatter(link, self.grad_sync_bytes(u), dp)
        return ring(link or self.s.sync_ring, self.grad_sync_bytes(u), dp or self.s.sync_replicas)

    def cross_sync(self, u: int) -> float:
        """Hybrid sharding's GX u: an all-reduce of the slice's fp32 gradient over the
        dp / shard_group replicas that hold the same slice."""
        shard = self.s.shard(u)
        groups = self.s.dp // self.s.shard_replicas
        return ring(self.s.cross_ring or self.s.replicas, 4 * shard.size, groups) if shard else 0.0

    def reduced_add(self, u: int) -> float:
        """WRS: the reduced slice added to the shard's gradient (read two, write one)."""
        return 12 * self.s.shard(u).size / self.bandwidth if self.s.shard_state else 0.0

    def gather(self, u: int, link: Link | None = None) -> float:
        """Sharded P u: cast the replica's fp32 slice into its slot of the view (read 4 S,
        write elt S), then all-gather the view over the replicas."""
        shard = self.s.shard(u)
        cast = (4 + self.s.shape.elt) * shard.size / self.bandwidth
        return cast + ring_half(link or self.s.shard_link, self.view_bytes(u),
                                self.s.shard_replicas)

    # -- bytes --------------------------------------------------------------------------------

    def view_bytes(self, u: int) -> int:
        """The compute view: the unit's parameters in the compute dtype; sharded, the flat
        gathered buffer of N_pad elements (the parameters are views into it)."""
        shard = self.s.shard(u)
        return (shard.padded if shard else self.s.params(u)) * self.s.shape.elt

    def view_time(self, u: int) -> float:
        """P u (replicated): from masters on a GPU, a cast there (read 4, write elt bytes a
        parameter); from host-homed masters, their fp32 bytes over the host link, then that
        cast (the copy engine casts on the device: runtime/copy_engine.py); on a CPU, an
        in-memory copy (copy_time)."""
        if self.host_link is None:
            return self.copy_time(self.view_bytes(u))
        n = self.s.params(u)
        cast = (4 + self.s.shape.elt) * n / self.bandwidth
        if self.s.state_on_host(u):  # fp32 views are the masters' bytes: nothing to cast
            return self.host_link.time(4 * n) + (cast if self.s.shape.elt != 4 else 0.0)
        return cast

    def copy_time(self, nbytes: float) -> float:
        """Host<->device copy; without a host link, an in-memory copy (read + write)."""
        if self.host_link is None:
            return 2 * nbytes / self.bandwidth
        return self.host_link.time(nbytes)

    def act_bytes(self) -> int:
        return self._act_bytes

    def grad_sync_bytes(self, u: int) -> int:
        shard = self.s.shard(u)
        if shard:
            return 4 * shard.padded
        # summed on the device: the run's fp32 sum; else the accumulation where it lives
        return (4 if u in self.device_summed else self.s.grad_bytes(u)) * self.s.params(u)
