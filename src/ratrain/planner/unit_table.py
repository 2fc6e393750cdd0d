"""The planner's unit table: each unit of the model's times and bytes at one micro-batch shape
on one profile, from the simulator's own cost model (sim/cost_model.py), so the planner and the
simulator price a unit alike; prefix sums make a stage's totals O(1). How a stage adds them up
under its schedule is planner/stage_cost.py's.

Sharded state (ZeRO-style, `Lifecycle.shard_state`) changes the units' sizes, not the shape of
the sums: a unit table is made for one data-parallel degree, and the cost model's
`unit_state_owners`, `view_bytes` and `update` give a replica's shard (sim/cost_model.py).
"""

from __future__ import annotations

import copy
import dataclasses
from itertools import accumulate
from typing import Any

from ratrain.config import ModelConfig
from ratrain.planner.lifecycle import Lifecycle
from ratrain.schedule.builders import one_f_one_b_in_flight
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.weight_grads import deferral_lag, is_bubble
from ratrain.sim import unit_costs as uc
from ratrain.sim.cost_model import StageCosts
from ratrain.sim.links import Link, ring
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.stage_setup import StageSetup
from ratrain.sim.working_bytes import working_bytes
from ratrain.setup.rule import update_for


class UnitTable:
    """Per unit of the model, at one micro-batch shape on one profile: times with the action
    overhead, and bytes, as prefix sums so a stage's totals are O(1)."""

    def __init__(self, model: ModelConfig, profile: HardwareProfile, micro_batch_size: int,
                 seq_len: int, dtype: str, n_micro: int, lifecycle: Lifecycle, clip: bool,
                 limit: float = float("inf"), host_limit: float = float("inf"), dp: int = 1,
                 schedule: str = "1f1b", weight_grad: str | None = None,
                 sums_on_device: bool = False):
        """`limit` and `host_limit`: the bytes a stage's estimate may reach on the device and in
        its host tier. `dp`: the replicas a sharded lifecycle splits the state over.
        `schedule`, `weight_grad`: the plan's (schedule/plan.py). `sums_on_device`: host-homed
        gradients summed on the device before they fold (PipelinePlan.device_grad_sum: two
        units' run sums at a time)."""
        self.sums_on_device = sums_on_device
        self.model, self.profile, self.lifecycle, self.dp = model, profile, lifecycle, dp
        self.n_units = model.n_layers + 2
        self.n_micro = n_micro
        self.limit, self.host_limit = limit, host_limit
        units = range(self.n_units)
        views = lifecycle.view_window is not None
        dummy = Link(1.0)
        # a carried update (setup/rule.update_for) runs on the host update thread, not on
        # the walker, and so does the unit's part of the norm (SN): a bound counts neither
        carried = update_for("auto", lifecycle.state_home, lifecycle.shard_state,
                             profile.device.host_link is not None) == "carried"
        setup = StageSetup(profile=profile, model=model, micro_batch_size=micro_batch_size,
                           seq_len=seq_len, dtype=dtype, n_micro=n_micro, units=units,
                           activation={}, view_units=frozenset(units) if views else frozenset(),
                           state_home=lifecycle.state_home, dp=dp, pp=1, p2p_prev=None,
                           p2p_next=None, replicas=dummy, pipeline=dummy, clip=clip,
                           shard_state=lifecycle.shard_state,
                           grad_lifetime=lifecycle.grad_lifetime,
                           shard_group=lifecycle.shard_group,
                           micro_batch_group=lifecycle.micro_batch_group,
                           host_grad_dtype=lifecycle.host_grad_dtype,
                           host_norms=frozenset(units) if carried and clip else frozenset())
        c = StageCosts(setup)
        self.costs = c
        shape = setup.shape
        o = c.overhead
        # The blocks of a model are alike, and so are their costs in a table (no unit of a
        # table is kept on the device, no activation choice is made): each figure is priced
        # on the embedding, the first block and the head, and the block's stands for every
        # block (tests/unit/test_unit_table.py holds it against pricing every unit). The
        # search makes a table for each micro-batch shape, replica count and lifecycle: 1,654
        # for llama2-7b on 1,024 devices, which took 7 of the search's 23 s unit by unit.
        like = [u if u in (0, self.n_units - 1) else 1 for u in units]

        def per_unit(price) -> list:
            priced: dict[int, Any] = {}
            return [priced[r] if r in priced else priced.setdefault(r, price(r)) for r in like]

        self.forward = per_unit(lambda u: c.forward(u) + o)
        # a recomputation (R) is the forward with autograd again, priced as `forward`
        self.forward_no_grad = per_unit(lambda u: c.forward(u, with_grad=False) + o)
        self._whole = per_unit(lambda u: c.backward(u) + o)
        # a split backward is two actions, each with the overhead; BW's share as the cost model's
        self._weight = per_unit(lambda u: c.backward_weight(u) + o)
        # grouped BWs run a unit's every micro-batch back to back: one fold a unit (the mean
        # over one group of all of them), and its run's fp32 sum on the device meanwhile
        every = StageCosts(dataclasses.replace(setup, micro_batch_group=n_micro))
        self._weight_grouped = per_unit(lambda u: every.backward_weight(u) + o)
        # and their B + BW, whose folds are those one run's: not 1F1B's m folds (host adds
        # behind a host link outweigh the compute of a small unit)
        self._whole_grouped = per_unit(lambda u: every.backward(u) + o)
        self._run_grad = per_unit(lambda u: 4 * setup.params(u)
                                  if views and c.runs_on_device(u) else 0)
        self._seeds = per_unit(lambda u: sum(
            n for _, n in c.storages("wgrad_seeds", Action(Op.BACKWARD_INPUT, u, 0))))
        self.update = per_unit(lambda u: 0.0 if carried else c.update(u) + o)
        self.out = per_unit(lambda u: uc.output_bytes(shape, uc.unit_kind(model, u)))
        self.saved = per_unit(lambda u: uc.saved_bytes(shape, uc.unit_kind(model, u)))
        self.wsaved = per_unit(lambda u: uc.wgrad_saved_bytes(shape, uc.unit_kind(model, u)))
        # what a backward, and a forward without autograd (a recomputed block's F), make while
        # they run beyond what is held
        self._working_whole = per_unit(
            lambda u: working_bytes(shape, uc.unit_kind(model, u), "backward"))
        # a split backward's BI: its seeds and input gradient too, which the stage's estimate
        # holds apart only for BIs whose BW is deferred (a bound where some are)
        self._working_split = per_unit(
            lambda u: working_bytes(shape, uc.unit_kind(model, u), "backward_input"))
        self.working_forward = per_unit(
            lambda u: working_bytes(shape, uc.unit_kind(model, u), "forward"))
        owners = per_unit(c.unit_state_owners)
        self.state = [sum(owner[3] for owner in own) for own in owners]
        self.update_scratch = setup.update_scratch  # runtime/host_grad.py
        # masters and gradients: held before the first step, so not part of the ledger's growth
        self.held = [sum(owner[3] for owner in own if owner[1] in ("masters", "gradients"))
                     for own in owners]
        # the full-size gradient a backward makes where it lives less than the step (else it
        # is in `state`); unit 0's backward stands for any
        self.full = per_unit(lambda u: sum(
            n for _, n in c.storages("grad_full", Action(Op.BACKWARD, u, 0))))
        self.full_sized = any(self.full)
        self._gathers: dict[tuple[int, float, float], float] = {}
        self._collective_sums: dict[tuple[float, float], tuple[list[float], list[float]]] = {}
        self.view = per_unit(lambda u: c.view_bytes(u) if views else 0)
        self.act = c.act_bytes()
        self.table = uc.table_bytes(shape, "block")
        self.tokens = c.tokens_bytes()
        self.host_tier = profile.device.host_link is not None
        self.states_on_device = not (lifecycle.state_home == "host" and self.host_tier)
        self._sums = {name: [0, *accumulate(getattr(self, name))]
                      for name in ("forward", "update", "out", "saved", "wsaved", "state", "view",
                                   "held", "full")}
        # stage_cost.cheapest_fit's, shared by this table's schedules (`scheduled`), keyed by
        # what the stage's estimate depends on (stage_cost's `_fit_key`)
        self.fit_cache: dict[tuple, Any] = {}
        self._schedule(schedule, weight_grad)
        block = 1 if self.n_units > 2 else 0
        self.block_saved = self.saved[block] if block else 0

    def _schedule(self, schedule: str, weight_grad: str | None) -> None:
        """What depends on the schedule: the backward's actions and what it keeps."""
        self.schedule, self.weight_grad = schedule, weight_grad
        split = weight_grad is not None
        o = self.costs.overhead
        whole = self._whole_grouped if weight_grad == "grouped" else self._whole
        self.backward = [b + o for b in whole] if split else whole
        self.weight = ((self._weight_grouped if weight_grad == "grouped" else self._weight)
                       if split else [0.0] * self.n_units)
        # a run's fp32 gradient sum, where backwards of a unit run back to back (unit_major;
        # a stage of one unit is one run whatever the schedule: stage_cost.estimate)
        self.holds_runs = (weight_grad == "grouped" or self.lifecycle.micro_batch_group > 1
                           or self.sums_on_device)
        self.run_grad = self._run_grad
        self.seeds = self._seeds if split else [0] * self.n_units
        self.working_backward = ([max(w, b) for w, b in zip(self._working_whole, self._working_split)]
                                 if split else self._working_whole)
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
        g = self.lifecycle.micro_batch_group  # unit-major: 1F1B's count of groups of g
        return min(one_f_one_b_in_flight(stage, pp, self.n_micro // g) * g, self.n_micro)

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
