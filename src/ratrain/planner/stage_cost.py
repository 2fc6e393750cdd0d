"""Closed-form time and memory of a stage, for the planner to choose partitions and activation
policies before anything is simulated.

Both come from the simulator's own cost model (sim/cost_model.py), unit by unit, so the planner
and the simulator price a unit alike; what is closed-form here is only how a stage adds them
up under its schedule: under 1F1B stage s of p holds the activations of min(m, p - s)
micro-batches when its first backward begins; under ZB-H1 (BWs in the bubble) every stage
holds min(m, p), and with BWs grouped per unit, all m; a split backward also keeps, between
BI and BW, the gradients BW starts from. The simulated memory timeline stays the authority;
planner/bounds.py gives what no plan of these stages can beat, which makes pruning safe.

Sharded state (ZeRO-style, `Lifecycle.shard_state`) changes the units' sizes, not the shape of
the sums: a unit table is made for one data-parallel degree, and the cost model's
`unit_state_owners`, `view_bytes` and `update` give a replica's shard (sim/cost_model.py).
Its gradient lifetime (`Lifecycle.grad_lifetime`, schedule/plan.PipelinePlan.grad_lifetime)
moves each unit's full-size fp32 gradient out of the state held all step into what the stage
holds while it computes: `UnitTable.full_grads` says how many are alive at once.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from itertools import accumulate

from ratrain.config import ModelConfig
from ratrain.planner import grad_buffers
from ratrain.planner.lifecycle import Lifecycle
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.weight_grads import deferral_lag, is_bubble
from ratrain.schedule.builders import one_f_one_b_in_flight
from ratrain.sim import unit_costs as uc
from ratrain.sim.cost_model import StageCosts, StageSetup, ring
from ratrain.sim.profile import HardwareProfile, Link


@dataclass(frozen=True)
class StageChoice:
    """How a stage recovers its blocks' activations: every block keeps, the first `recompute`
    blocks recompute (the rest keep), or every block offloads."""

    recompute: int = 0
    offload: bool = False

    def per_unit(self, units: range, n_units: int) -> dict[int, str]:
        blocks = [u for u in units if 0 < u < n_units - 1]
        if self.offload:
            return {u: "offload" for u in blocks}
        return {u: "recompute" for u in blocks[:self.recompute]}

    def label(self, units: range, n_units: int) -> str:
        blocks = sum(1 for u in units if 0 < u < n_units - 1)
        if self.offload:
            return "offload"
        if self.recompute == 0 or blocks == 0:
            return "keep"
        return "recompute" if self.recompute == blocks else f"recompute {self.recompute}/{blocks}"


@dataclass(frozen=True)
class StageEstimate:
    choice: StageChoice
    forward_s: float  # one micro-batch through the stage, walker time
    backward_s: float  # its backward (split: BI and BW together)
    recompute_s: float  # its recomputation (before the backward; it need not wait for it)
    update_s: float  # every unit's update, once per step
    bytes: float  # device-resident peak, estimated
    host_bytes: float = 0.0  # peak in a host tier apart from the device, estimated
    units: tuple[int, int] = (0, 0)  # [a, b)
    recompute_first_s: float = 0.0  # of recompute_s, the stage's last unit's: placed before
    # the wait for the gradient, it can run before the gradient arrives (the others cannot)
    weight_s: float = 0.0  # of backward_s, the weight gradients (BW) where the backward is split

    def busy_s(self, n_micro: int) -> float:
        return n_micro * (self.forward_s + self.backward_s + self.recompute_s) + self.update_s


class UnitTable:
    """Per unit of the model, at one micro-batch shape on one profile: times with the action
    overhead, and bytes, as prefix sums so a stage's totals are O(1)."""

    def __init__(self, model: ModelConfig, profile: HardwareProfile, micro_batch_size: int,
                 seq_len: int, dtype: str, n_micro: int, lifecycle: Lifecycle, clip: bool,
                 limit: float = float("inf"), host_limit: float = float("inf"), dp: int = 1,
                 schedule: str = "1f1b", weight_grad: str | None = None):
        """`limit` and `host_limit`: the bytes a stage's estimate may reach on the device and in
        its host tier. `dp`: the replicas a sharded lifecycle splits the state over.
        `schedule`, `weight_grad`: the plan's (schedule/plan.py)."""
        self.model, self.profile, self.lifecycle, self.dp = model, profile, lifecycle, dp
        self.n_units = model.n_layers + 2
        self.n_micro = n_micro
        self.limit, self.host_limit = limit, host_limit
        units = range(self.n_units)
        views = lifecycle.view_window is not None
        dummy = Link(1.0)
        setup = StageSetup(profile=profile, model=model, micro_batch_size=micro_batch_size,
                           seq_len=seq_len, dtype=dtype, n_micro=n_micro, units=units,
                           activation={}, view_units=frozenset(units) if views else frozenset(),
                           state_home=lifecycle.state_home, dp=dp, pp=1, p2p_prev=None,
                           p2p_next=None, replicas=dummy, pipeline=dummy, clip=clip,
                           shard_state=lifecycle.shard_state,
                           grad_lifetime=lifecycle.grad_lifetime,
                           shard_group=lifecycle.shard_group)
        c = StageCosts(setup)
        self.costs = c
        shape = setup.shape
        o = c.overhead
        self.forward = [c.forward(u) + o for u in units]
        # a recomputation (R) is the forward with autograd again, priced as `forward`
        self.forward_no_grad = [c.forward(u, with_grad=False) + o for u in units]
        self._whole = [c.backward(u) + o for u in units]
        # a split backward is two actions, each with the overhead; BW's share as the cost model's
        self._weight = [c.backward_weight(u) + o for u in units]
        self._seeds = [sum(n for _, n in c.storages("wgrad_seeds", Action(Op.BACKWARD_INPUT, u, 0)))
                       for u in units]
        self.update = [c.update(u) + o for u in units]
        self.out = [uc.output_bytes(shape, uc.unit_kind(model, u)) for u in units]
        self.saved = [uc.saved_bytes(shape, uc.unit_kind(model, u)) for u in units]
        self.wsaved = [uc.wgrad_saved_bytes(shape, uc.unit_kind(model, u)) for u in units]
        owners = [c.unit_state_owners(u) for u in units]
        self.state = [sum(owner[3] for owner in own) for own in owners]
        # masters and gradients: held before the first step, so not part of the ledger's growth
        self.held = [sum(owner[3] for owner in own if owner[1] in ("masters", "gradients"))
                     for own in owners]
        # the full-size gradient a backward makes where it lives less than the step (else it
        # is in `state`); unit 0's backward stands for any
        self.full = [sum(n for _, n in c.storages("grad_full", Action(Op.BACKWARD, u, 0)))
                     for u in units]
        self.full_sized = any(self.full)
        self._gathers: dict[tuple[int, float, float], float] = {}
        self._collective_sums: dict[tuple[float, float], tuple[list[float], list[float]]] = {}
        self.view = [c.view_bytes(u) if views else 0 for u in units]
        self.act = c.act_bytes()
        self.table = uc.table_bytes(shape, "block")
        self.tokens = c.tokens_bytes()
        self.host_tier = profile.device.host_link is not None
        self.states_on_device = not (lifecycle.state_home == "host" and self.host_tier)
        self._sums = {name: [0, *accumulate(getattr(self, name))]
                      for name in ("forward", "update", "out", "saved", "wsaved", "state", "view",
                                   "held", "full")}
        # cheapest_fit's, shared by this table's schedules (`scheduled`), keyed by what the
        # stage's estimate depends on (`_fit_key`)
        self._fit_cache: dict[tuple, StageEstimate | None] = {}
        self._schedule(schedule, weight_grad)
        block = 1 if self.n_units > 2 else 0
        self.block_saved = self.saved[block] if block else 0

    def _schedule(self, schedule: str, weight_grad: str | None) -> None:
        """What depends on the schedule: the backward's actions and what it keeps."""
        self.schedule, self.weight_grad = schedule, weight_grad
        split = weight_grad is not None
        o = self.costs.overhead
        self.backward = [b + o for b in self._whole] if split else self._whole
        self.weight = self._weight if split else [0.0] * self.n_units
        self.seeds = self._seeds if split else [0] * self.n_units
        self._sums = {**self._sums, **{name: [0, *accumulate(getattr(self, name))]
                                       for name in ("backward", "weight", "seeds")}}

    def scheduled(self, schedule: str, weight_grad: str | None) -> UnitTable:
        """This table for another schedule (the unit costs shared, not recomputed)."""
        other = copy.copy(self)
        other._schedule(schedule, weight_grad)
        return other

    def total(self, name: str, a: int, b: int) -> float:
        sums = self._sums[name]
        return sums[b] - sums[a]

    def blocks(self, a: int, b: int) -> int:
        return max(0, min(b, self.n_units - 1) - max(a, 1))

    def in_flight(self, stage: int, pp: int) -> int:
        """Micro-batches whose activations stage `stage` holds whole at most: at its first
        backward (1F1B, and the split schedules' BIs, which run in its order); on one stage,
        grouped runs every forward first. What a split backward keeps after BI is counted apart
        (`peak_candidates`)."""
        if self.weight_grad == "grouped" and pp == 1:
            return self.n_micro
        return one_f_one_b_in_flight(stage, pp, self.n_micro)

    def gather(self, u: int, link: Link) -> float:
        """The cost model's all-gather of unit u's view over `link` (sharded), remembered."""
        key = (u, link.bandwidth, link.latency)  # (a Link is not hashable)
        if key not in self._gathers:
            self._gathers[key] = self.costs.gather(u, link)
        return self._gathers[key]

    def collectives(self, a: int, b: int, link: Link, syncs: int) -> float:
        """Sharded: `syncs` gradient syncs (the cost model's reduce-scatters) and one all-gather
        of the view of each of units [a, b) over `link` among the replicas the state is
        sharded over (hybrid: the shard group's)."""
        key = (link.bandwidth, link.latency)
        if key not in self._collective_sums:
            sync = [self.costs.grad_sync(u, link) for u in range(self.n_units)]
            gather = [self.gather(u, link) for u in range(self.n_units)]
            self._collective_sums[key] = ([0.0, *accumulate(sync)], [0.0, *accumulate(gather)])
        sync_sums, gather_sums = self._collective_sums[key]
        return syncs * (sync_sums[b] - sync_sums[a]) + gather_sums[b] - gather_sums[a]

    def cross_syncs(self, a: int, b: int, link: Link) -> float:
        """Hybrid sharding: the all-reduces of units [a, b)'s slices across the shard groups
        over `link` (GX; the cost model's)."""
        groups = self.dp // self.lifecycle.shard_group
        return sum(ring(link, 4 * self.costs.s.shard(u).size, groups)
                   for u in range(a, b) if self.costs.s.shard(u))

    def full_grads(self, a: int, b: int, stage: int, pp: int,
                   recomputed: frozenset[int] = frozenset(),
                   recovering: float = 0.0) -> tuple[float, float]:
        """Bytes of full-size gradients alive at the stage's peak beyond the rest of
        `estimate`'s sum: (with the most micro-batches in flight, with one fewer); see
        planner/grad_buffers.py."""
        return grad_buffers.alive_at_peak(self, a, b, stage, pp, recomputed, recovering)

    def peak_candidates(self, stage: int, pp: int) -> list[tuple[int, int]]:
        """(micro-batches held whole, micro-batches past BI and before BW) at the moments where
        the stage's peak can fall (what BI keeps for BW may be more or less than the whole: a
        recomputed block's whole is its input). 1F1B: none past BI. ZB-H1 defers stage s's
        BWs by s (capped: by min(s, K)), and for a moment after a BI holds one more. Grouped
        runs a unit's BWs after the stage's last BI, so micro-batches pass BI one by one as
        the cool-down starts (on one stage its backwards are whole: none)."""
        n, whole = self.n_micro, self.in_flight(stage, pp)
        if self.weight_grad == "grouped" and pp > 1:
            return [(min(whole, n - k), k) for k in range(n + 1)]
        if is_bubble(self.weight_grad):
            s = min(deferral_lag(self.weight_grad, stage), n - 1)
            return [(whole, s), (whole - 1, s + 1)]
        return [(whole, 0)]

    def estimate(self, a: int, b: int, stage: int, pp: int, choice: StageChoice) -> StageEstimate:
        """Time and device bytes of units [a, b) as stage `stage` of `pp`."""
        nb = self.blocks(a, b)
        k = nb if choice.offload else min(choice.recompute, nb)
        forward = self.total("forward", a, b)
        recompute = 0.0
        if not choice.offload and k:
            # a recomputed block's forward runs without autograd, and again (with it) as R
            forward -= k * (self.forward[1] - self.forward_no_grad[1])
            recompute = k * self.forward[1]
        states = self.total("state", a, b) if self.states_on_device else 0
        window = self.lifecycle.view_window
        if window is None or window == 0:
            views = self.total("view", a, b)
        else:
            views = min(b - a, window + 1) * max(self.view[a:b])
        saved = self.total("saved", a, b)
        dropped = k * self.block_saved if (not choice.offload or self.host_tier) else 0
        per_micro = (self.act if a > 0 else 0) + self.total("out", a, b) + saved - dropped
        shared = ((self.table if nb else 0) + (self.tokens if a == 0 else 0)
                  + (self.tokens if b == self.n_units else 0))
        # During the backward: gradient buffers, and what a recovery briefly holds on top of
        # the micro-batches in flight. Recomputed blocks are the stage's first, backwarded
        # last: a kept block after them has freed its own saved tensors by then.
        if choice.offload:
            recovering = min(k, 2) * self.block_saved  # a reload overlaps the next backward
        else:
            recovering = self.block_saved if k and k == nb else 0
        transient = 3 * self.act + recovering
        in_flight = self.in_flight(stage, pp)
        full_most = full_fewer = 0.0
        if self.full_sized:
            recomputed = frozenset(choice.per_unit(range(a, b), self.n_units)
                                   if k and not choice.offload else ())
            full_most, full_fewer = self.full_grads(a, b, stage, pp, recomputed, recovering)

        def whole(f: int) -> float:  # f micro-batches' activations, and full-size gradients
            return max(f * per_micro + full_most, (f - 1) * per_micro + full_fewer) if f > 0 \
                else full_most

        # between BI and BW a split backward keeps what BW needs: its seeds, what the ops
        # that read a weight saved (recomputed or reloaded ones too), and each unit's input
        past_bi = (self.total("seeds", a, b) + self.total("wsaved", a, b)
                   + (self.act if a > 0 else 0) + self.total("out", a, b - 1))
        kept = max(whole(f) + k * past_bi for f, k in self.peak_candidates(stage, pp))
        held = states + views + shared + transient + kept
        host = 0 if self.states_on_device else self.total("state", a, b)
        if choice.offload and self.host_tier:
            host += in_flight * k * (self.block_saved + self.table)
        last_recomputed = not choice.offload and k and k == nb and b - 1 < self.n_units - 1
        return StageEstimate(choice, forward, self.total("backward", a, b), recompute,
                             self.total("update", a, b), held, host, (a, b),
                             self.forward[1] if last_recomputed else 0.0,
                             self.total("weight", a, b))

    def _fits(self, est: StageEstimate, limit: float) -> StageEstimate | None:
        """The estimate if it fits `limit` with the process's overhead beyond the ledger."""
        growth = est.bytes - (self.total("held", *est.units) if self.states_on_device else 0)
        device = self.profile.device
        total = est.bytes + device.process_overhead(max(0.0, growth))
        return est if total <= limit and est.host_bytes <= self.host_limit else None

    def cheapest_fit(self, a: int, b: int, stage: int, pp: int, limit: float,
                     choices: str) -> StageEstimate | None:
        """The fastest activation choice of the stage that fits `limit` bytes: keep, else the
        fewest recomputed blocks (`choices` "mixed"), else None. `choices` "keep"/"recompute"/
        "offload" allows only that uniform choice. The search does not choose offload yet: its
        estimate is off by up to 2x either way (copies in flight on the copy engine).
        Remembered: a partition's bisection asks for the same stages again and again."""
        key = (self._fit_key(stage), a, b, stage, pp, limit, choices)
        if key not in self._fit_cache:
            self._fit_cache[key] = self._cheapest_fit(a, b, stage, pp, limit, choices)
        return self._fit_cache[key]

    def _fit_key(self, stage: int) -> tuple:
        """The schedule as a stage's estimate sees it: the bubble placements differ only in how
        many micro-batches the stage defers, so a cap at or above the stage's index shares the
        uncapped placement's estimates (most of a deep pipeline's stages, for the larger caps)."""
        if not is_bubble(self.weight_grad):
            return self.schedule, self.weight_grad
        return self.schedule, "bubble", deferral_lag(self.weight_grad, stage)

    def _cheapest_fit(self, a: int, b: int, stage: int, pp: int, limit: float,
                      choices: str) -> StageEstimate | None:
        nb = self.blocks(a, b)
        if choices in ("keep", "recompute", "offload"):
            choice = {"keep": StageChoice(), "recompute": StageChoice(recompute=nb),
                      "offload": StageChoice(offload=True)}[choices]
            return self._fits(self.estimate(a, b, stage, pp, choice), limit)
        keep = self.estimate(a, b, stage, pp, StageChoice())
        if self._fits(keep, limit):
            return keep
        if keep.host_bytes > self.host_limit:
            return None  # the states alone overfill the host tier
        if not nb or not self.block_saved:
            return None
        per_block = self.in_flight(stage, pp) * self.block_saved
        # each recomputed block frees per_block bytes (recomputing all adds a transient back)
        for k in range(max(1, math.ceil((keep.bytes - limit) / per_block)), nb + 1):
            est = self._fits(self.estimate(a, b, stage, pp, StageChoice(recompute=k)), limit)
            if est:
                return est
        return None
