"""A stage's closed-form time and memory, for the planner to choose partitions and activation
policies before anything is simulated.

Each unit is priced by the simulator's own cost model (planner/unit_table.py), so the planner
and the simulator price a unit alike; what is closed-form here is only how a stage adds them
up under its schedule: under 1F1B stage s of p holds the activations of min(m, p - s)
micro-batches when its first backward begins; under ZB-H1 (BWs in the bubble) every stage
holds min(m, p), and with BWs grouped per unit, all m; a split backward also keeps, between
BI and BW, the gradients BW starts from. The simulated memory timeline stays the authority;
planner/bounds.py gives what no plan of these stages can beat, which makes pruning safe.

A gradient lifetime (`Lifecycle.grad_lifetime`, schedule/plan.PipelinePlan.grad_lifetime)
shorter than the step moves each unit's full-size fp32 gradient out of the state held all step
into what the stage holds while it computes: `grad_buffers.alive_at_peak` says how many are
alive at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.planner.grad_buffers import alive_at_peak
from ratrain.planner.unit_table import UnitTable
from ratrain.schedule.weight_grads import deferral_lag, is_bubble


@dataclass(frozen=True)
class StageChoice:
    """How a stage recovers its blocks' activations: every block keeps, the first `recompute`
    blocks recompute (the rest keep), or every block offloads. With host-homed state, the
    stage's first `on_device` units keep theirs on the device instead, where the host tier
    would overfill otherwise (planner/device_units.py adds more where there is room)."""

    recompute: int = 0
    offload: bool = False
    on_device: int = 0

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


def estimate(t: UnitTable, a: int, b: int, stage: int, pp: int,
             choice: StageChoice) -> StageEstimate:
    """Time and device bytes of units [a, b) of table `t` as stage `stage` of `pp`."""
    nb = t.blocks(a, b)
    k = nb if choice.offload else min(choice.recompute, nb)
    forward = t.total("forward", a, b)
    recompute = 0.0
    if not choice.offload and k:
        # a recomputed block's forward runs without autograd, and again (with it) as R
        forward -= k * (t.forward[1] - t.forward_no_grad[1])
        recompute = k * t.forward[1]
    on_host = a + choice.on_device  # the stage's first unit whose state is on the host
    states = t.total("state", a, b) if t.states_on_device else t.total("state", a, on_host)
    window = t.lifecycle.view_window
    if window is None or window == 0:
        views = t.total("view", a, b)
    else:
        views = min(b - a, window + 1) * max(t.view[a:b])
    saved = t.total("saved", a, b)
    dropped = k * t.block_saved if (not choice.offload or t.host_tier) else 0
    per_micro = (t.act if a > 0 else 0) + t.total("out", a, b) + saved - dropped
    shared = ((t.table if nb else 0) + (t.tokens if a == 0 else 0)
              + (t.tokens if b == t.n_units else 0))
    # During the backward: gradient buffers, and what a recovery briefly holds on top of
    # the micro-batches in flight. Recomputed blocks are the stage's first, backwarded
    # last: a kept block after them has freed its own saved tensors by then.
    if choice.offload:
        recovering = min(k, 2) * t.block_saved  # a reload overlaps the next backward
    else:
        recovering = t.block_saved if k and k == nb else 0
    # unit-major groups of g: a unit's backward run holds its g input gradients until the run
    # below takes them, where 1F1B holds one; and its run's fp32 sum
    runs = t.run_grad[a:b] if t.holds_runs or b - a == 1 else [0] * (b - a)
    if t.sums_on_device:  # each sum waited after one more compute action: two alive
        runs = [2 * max(runs)] * (b - a)
    # and what the compute makes while it runs (sim/working_bytes.py): each unit's backward
    # beside its own run sum and, for a block recovered, the recovery; a recomputed block's
    # forward without autograd where no recomputation is held
    recovered = set(choice.per_unit(range(a, b), t.n_units)) if k else set()
    busiest = max(t.working_backward[u] + runs[u - a] + (recovering if u in recovered else 0)
                  for u in range(a, b))
    if k and not choice.offload:
        busiest = max(busiest, t.working_forward[1] + max(runs))
    transient = (2 + t.lifecycle.micro_batch_group) * t.act + busiest
    in_flight = t.in_flight(stage, pp)
    full_most = full_fewer = 0.0
    if t.full_sized:
        recomputed = frozenset(choice.per_unit(range(a, b), t.n_units)
                               if k and not choice.offload else ())
        full_most, full_fewer = alive_at_peak(t, a, b, stage, pp, recomputed, recovering)

    def whole(f: int) -> float:  # f micro-batches' activations, and full-size gradients
        return max(f * per_micro + full_most, (f - 1) * per_micro + full_fewer) if f > 0 \
            else full_most

    # between BI and BW a split backward keeps what BW needs: its seeds, what the ops
    # that read a weight saved (recomputed or reloaded ones too), and each unit's input
    past_bi = (t.total("seeds", a, b) + t.total("wsaved", a, b)
               + (t.act if a > 0 else 0) + t.total("out", a, b - 1))
    kept = max(whole(f) + k * past_bi for f, k in t.peak_candidates(stage, pp))
    held = states + views + shared + transient + kept
    host = 0 if t.states_on_device else _host_state(t, on_host, b)
    if choice.offload and t.host_tier:
        host += in_flight * k * (t.block_saved + t.table)
    last_recomputed = not choice.offload and k and k == nb and b - 1 < t.n_units - 1
    return StageEstimate(choice, forward, t.total("backward", a, b), recompute,
                         t.total("update", a, b), held, host, (a, b),
                         t.forward[1] if last_recomputed else 0.0,
                         t.total("weight", a, b))


def _fits(t: UnitTable, est: StageEstimate, limit: float) -> StageEstimate | None:
    """The estimate if it fits `limit` with the process's overhead beyond the ledger."""
    a, b = est.units
    growth = est.bytes - t.total("held", a, b if t.states_on_device else a + est.choice.on_device)
    device = t.profile.device
    total = est.bytes + device.process_overhead(max(0.0, growth))
    return est if total <= limit and est.host_bytes <= t.host_limit else None


def cheapest_fit(t: UnitTable, a: int, b: int, stage: int, pp: int, limit: float,
                 choices: str) -> StageEstimate | None:
    """The fastest activation choice of the stage that fits `limit` bytes: keep, else the
    fewest recomputed blocks (`choices` "mixed"), else None. `choices` "keep"/"recompute"/
    "offload" allows only that uniform choice. The search does not choose offload yet: its
    estimate is off by up to 2x either way (copies in flight on the copy engine).
    Remembered: a partition's bisection asks for the same stages again and again."""
    key = (_fit_key(t, stage), a, b, stage, pp, limit, choices)
    if key not in t.fit_cache:
        t.fit_cache[key] = _cheapest_fit(t, a, b, stage, pp, limit, choices)
    return t.fit_cache[key]


def _fit_key(t: UnitTable, stage: int) -> tuple:
    """The schedule as a stage's estimate sees it: the bubble placements differ only in how
    many micro-batches the stage defers, so a cap at or above the stage's index shares the
    uncapped placement's estimates (most of a deep pipeline's stages, for the larger caps)."""
    if not is_bubble(t.weight_grad):
        return t.schedule, t.weight_grad
    return t.schedule, "bubble", deferral_lag(t.weight_grad, stage)


def _cheapest_fit(t: UnitTable, a: int, b: int, stage: int, pp: int, limit: float,
                  choices: str) -> StageEstimate | None:
    nb = t.blocks(a, b)
    if choices == "offload":
        return _fits(t, estimate(t, a, b, stage, pp, StageChoice(offload=True)), limit)
    on_device = _host_overflow(t, a, b)
    if choices in ("keep", "recompute"):
        choice = StageChoice(recompute=nb if choices == "recompute" else 0, on_device=on_device)
        return _fits(t, estimate(t, a, b, stage, pp, choice), limit)
    keep = estimate(t, a, b, stage, pp, StageChoice(on_device=on_device))
    if _fits(t, keep, limit):
        return keep
    if not nb or not t.block_saved:
        return None
    per_block = t.in_flight(stage, pp) * t.block_saved
    # each recomputed block frees per_block bytes (recomputing all adds a transient back)
    for k in range(max(1, math.ceil((keep.bytes - limit) / per_block)), nb + 1):
        est = _fits(t, estimate(t, a, b, stage, pp, StageChoice(k, on_device=on_device)), limit)
        if est:
            return est
    return None


def _host_overflow(t: UnitTable, a: int, b: int) -> int:
    """How many of units [a, b)'s first units must keep their state on the device for the
    rest's to fit the host tier by the stage's own bytes (what else the host holds counts in
    the simulation): 0 where it fits, or the state is not host-homed."""
    if t.states_on_device:
        return 0
    return next(k for k in range(b - a + 1) if _host_state(t, a + k, b) <= t.host_limit)


def _host_state(t: UnitTable, a: int, b: int) -> float:
    """Host-homed units [a, b)'s state, and where their gradients are bf16 the update's fp32
    scratch (the model's largest parameter's or a chunk's: a bound on the stage's)."""
    return t.total("state", a, b) + (t.update_scratch if b > a else 0)
