"""Closed-form time and memory of a stage, for the planner to choose partitions and activation
policies before anything is simulated.

Both come from the simulator's own cost model (sim/cost_model.py), unit by unit, so the planner
and the simulator price a unit alike; what is closed-form here is only how a stage adds them
up under 1F1B: stage s of p holds the activations of min(m, p - s) micro-batches when its
first backward begins. The simulated memory timeline stays the authority; `lower_bound`
gives what no plan of these stages can beat, which makes pruning safe.

Sharded state (ZeRO-style, `Lifecycle.shard_state`) changes the units' sizes, not the shape of
the sums: a unit table is made for one data-parallel degree, and the cost model's
`unit_state_owners`, `view_bytes` and `update` give a replica's shard (sim/cost_model.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from ratrain.config import ModelConfig
from ratrain.schedule.builders import one_f_one_b_in_flight, one_f_one_b_order
from ratrain.sim import unit_costs as uc
from ratrain.sim.cost_model import StageCosts, StageSetup
from ratrain.sim.profile import HardwareProfile, Link


@dataclass(frozen=True)
class Lifecycle:
    """Where state lives and how parameter views are made: the choices a stage's memory
    depends on besides its activations."""

    state_home: str  # "device" or "host"
    view_window: int | None  # None: no views (they are the masters); 0: resident; K: window
    policy: str  # "ratrain" or "baseline"
    shard_state: bool = False  # masters and AdamW state sharded over the replicas (device, views)

    def label(self) -> str:
        """The state home and views as the plan table shows them: "device, sharded / window 1"."""
        views = ("-" if self.view_window is None
                 else "resident" if self.view_window == 0 else f"window {self.view_window}")
        return f"{self.state_home}{', sharded' if self.shard_state else ''} / {views}"


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
    backward_s: float  # its backward
    recompute_s: float  # its recomputation (before the backward; it need not wait for it)
    update_s: float  # every unit's update, once per step
    bytes: float  # device-resident peak, estimated
    host_bytes: float = 0.0  # peak in a host tier apart from the device, estimated
    units: tuple[int, int] = (0, 0)  # [a, b)
    recompute_first_s: float = 0.0  # of recompute_s, the stage's last unit's: placed before
    # the wait for the gradient, it can run before the gradient arrives (the others cannot)

    def busy_s(self, n_micro: int) -> float:
        return n_micro * (self.forward_s + self.backward_s + self.recompute_s) + self.update_s


class UnitTable:
    """Per unit of the model, at one micro-batch shape on one profile: times with the action
    overhead, and bytes, as prefix sums so a stage's totals are O(1)."""

    def __init__(self, model: ModelConfig, profile: HardwareProfile, micro_batch_size: int,
                 seq_len: int, dtype: str, n_micro: int, lifecycle: Lifecycle, clip: bool,
                 limit: float = float("inf"), host_limit: float = float("inf"), dp: int = 1):
        """`limit` and `host_limit`: the bytes a stage's estimate may reach on the device and in
        its host tier. `dp`: the replicas a sharded lifecycle splits the state over."""
        self.model, self.profile, self.lifecycle = model, profile, lifecycle
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
                           shard_state=lifecycle.shard_state)
        c = StageCosts(setup)
        self.costs = c
        shape = setup.shape
        o = c.overhead
        self.forward = [c.forward(u) + o for u in units]
        # a recomputation (R) is the forward with autograd again, priced as `forward`
        self.forward_no_grad = [c.forward(u, with_grad=False) + o for u in units]
        self.backward = [c.backward(u) + o for u in units]
        self.update = [c.update(u) + o for u in units]
        self.out = [uc.output_bytes(shape, uc.unit_kind(model, u)) for u in units]
        self.saved = [uc.saved_bytes(shape, uc.unit_kind(model, u)) for u in units]
        owners = [c.unit_state_owners(u) for u in units]
        self.state = [sum(owner[3] for owner in own) for own in owners]
        # masters and gradients: held before the first step, so not part of the ledger's growth
        self.held = [sum(owner[3] for owner in own if owner[1] in ("masters", "gradients"))
                     for own in owners]
        self.view = [c.view_bytes(u) if views else 0 for u in units]
        self.act = c.act_bytes()
        self.table = uc.table_bytes(shape, "block")
        self.tokens = c.tokens_bytes()
        self.host_tier = profile.device.host_link is not None
        self.states_on_device = not (lifecycle.state_home == "host" and self.host_tier)
        self._sums = {name: [0, *accumulate(getattr(self, name))]
                      for name in ("forward", "backward", "update", "out", "saved", "state", "view",
                                   "held")}
        block = 1 if self.n_units > 2 else 0
        self.block_saved = self.saved[block] if block else 0

    def total(self, name: str, a: int, b: int) -> float:
        sums = self._sums[name]
        return sums[b] - sums[a]

    def blocks(self, a: int, b: int) -> int:
        return max(0, min(b, self.n_units - 1) - max(a, 1))

    def in_flight(self, stage: int, pp: int) -> int:
        """Micro-batches whose activations stage `stage` holds at its first backward (1F1B)."""
        return one_f_one_b_in_flight(stage, pp, self.n_micro)

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
        held = states + views + in_flight * per_micro + shared + transient
        host = 0 if self.states_on_device else self.total("state", a, b)
        if choice.offload and self.host_tier:
            host += in_flight * k * (self.block_saved + self.table)
        last_recomputed = not choice.offload and k and k == nb and b - 1 < self.n_units - 1
        return StageEstimate(choice, forward, self.total("backward", a, b), recompute,
                             self.total("update", a, b), held, host, (a, b),
                             self.forward[1] if last_recomputed else 0.0)

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
        estimate is off by up to 2x either way (copies in flight on the copy engine)."""
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


def lower_bound(estimates: list[StageEstimate], n_micro: int, tail_s: float = 0.0,
                lead_s: Sequence[float] | None = None) -> float:
    """A 1F1B step can end no sooner than this (seconds); communication, copies and shared
    cores only add time. Stage 0's last backward comes after every other stage's, and after
    `tail_s` more (its last sync and updates) the step ends. Stage s computes nothing before
    `lead_s[s]` (sharded state: the all-gather of its first unit's view; default 0), so the
    paths below that start at stage 0's first forward start no sooner than `lead_s[0]`, and
    stage s's own work no sooner than `lead_s[s]`. That last backward is no sooner than, for
    each stage s:

    - everything of s on its one walker (every forward, recomputation and backward), begun
      after the stages before it ran their forward of micro-batch 0, followed by the
      backwards of the last micro-batch on the stages before s;
    - micro-batch 0's forward through every stage and backward back to s, then what s
      still has to do: every backward, the recomputations but the first (each is placed
      right before its backward, so only the first can run before a gradient arrives), the
      forwards after its min(m, p - s) warm-up ones; then the backwards before s.
    """
    m, pp = n_micro, len(estimates)
    lead = lead_s or [0.0] * pp
    forward_all = sum(e.forward_s for e in estimates)
    best, before_f, before_b = 0.0, 0.0, 0.0
    after = sum(e.backward_s for e in estimates)
    for s, e in enumerate(estimates):
        after -= e.backward_s  # the backwards of the stages after s
        own = m * (e.forward_s + e.backward_s + e.recompute_s)
        warm = one_f_one_b_in_flight(s, pp, m)  # forwards before its first backward
        first_gradient = lead[0] + forward_all + after
        rest = m * e.backward_s + (m - 1) * e.recompute_s + (m - warm) * e.forward_s
        best = max(best, max(lead[0] + before_f, lead[s]) + own + before_b,
                   first_gradient + rest + before_b, lead[s] + own + e.update_s)
        before_f += e.forward_s
        before_b += e.backward_s
    return best + tail_s


def pipeline_path(estimates: list[StageEstimate], n_micro: int, lead_s: Sequence[float],
                  hop_s: Sequence[float], tail_s: float = 0.0) -> float:
    """A tighter bound than `lower_bound`, at O(stages x micro-batches): the earliest stage 0
    can end its last backward when each stage runs its forwards and backwards in its 1F1B
    order (schedule/builders.one_f_one_b_order, the order the builder gives the programs:
    min(p - s - 1, m) warm-up forwards, then one forward and one backward, then the cool-down
    backwards) on its one walker, a forward no sooner than the
    previous stage's forward of that micro-batch plus `hop_s[s - 1]` (the activation's
    transfer), a backward no sooner than the next stage's backward of it plus `hop_s[s]` (the
    gradient's), and the stage's first forward no sooner than `lead_s[s]`; then `tail_s`.
    The recomputation of a stage's last unit may run before the gradient arrives, the others
    after it (as the programs place them). Everything else (copies, syncs, updates, shared
    links and cores, action overheads outside compute) only adds time."""
    m, pp = n_micro, len(estimates)
    orders = [one_f_one_b_order(s, pp, m) for s in range(pp)]
    f_end = [[0.0] * m for _ in range(pp)]
    b_end = [[0.0] * m for _ in range(pp)]
    done_f = [0] * pp  # forwards finished per stage (in micro-batch order)
    done_b = [0] * pp
    walker = list(lead_s)  # when each stage's walker is next free
    step = [0] * pp  # position in the stage's order: 2m actions
    pending = list(range(pp))
    while pending:
        s = pending.pop()
        e, order = estimates[s], orders[s]
        while step[s] < 2 * m:
            forward, i = order[step[s]]
            if forward:
                if s > 0 and done_f[s - 1] <= i:
                    break  # waits for the previous stage's forward of i
                ready = f_end[s - 1][i] + hop_s[s - 1] if s > 0 else 0.0
                f_end[s][i] = walker[s] = max(walker[s], ready) + e.forward_s
                done_f[s] += 1
                if s + 1 < pp:
                    pending.append(s + 1)
            else:
                if s + 1 < pp and done_b[s + 1] <= i:
                    break  # waits for the next stage's backward of i
                early = walker[s] + e.recompute_first_s
                ready = b_end[s + 1][i] + hop_s[s] if s + 1 < pp else 0.0
                b_end[s][i] = walker[s] = (max(early, ready) + e.backward_s
                                           + e.recompute_s - e.recompute_first_s)
                done_b[s] += 1
                if s > 0:
                    pending.append(s - 1)
            step[s] += 1
    return b_end[0][m - 1] + tail_s


def pipeline_bound(work_per_micro: float, n_micro: int, pp: int) -> float:
    """The least `lower_bound` any partition of `work_per_micro` seconds (forward + backward of
    one micro-batch through the whole model) into `pp` stages can have: the stages' bounds
    s_0 + ... + s_{k-1} + m s_k are all equal when s_k shrinks geometrically by (1 - 1/m)."""
    return work_per_micro / (1.0 - (1.0 - 1.0 / n_micro) ** pp)
