"""The layouts the planner's search considers: what a request asks for (PlanRequest), and
every pipeline and data-parallel degree, micro-batch size, rank order, lifecycle and schedule
that training can run (`layouts`, by the setup stage's rule, setup/rule.py)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from ratrain.config import ModelConfig
from ratrain.planner.lifecycle import Lifecycle
from ratrain.planner.wording import a_device, memory_is_this_machines
from ratrain.schedule.outer_sync import EVERY_STEP
from ratrain.schedule.plan_rules import GRAD_LIFETIMES, SCHEDULE_NAMES
from ratrain.schedule.weight_grads import schedules
from ratrain.setup import rule
from ratrain.setup.rule import has_views
from ratrain.sim.placement import stage_groups
from ratrain.sim.profile import HardwareProfile
from ratrain.sim.shared_cores import thread_speed, threads_of_rank

DEFAULT_MARGIN = 0.10
"""Fraction of the budget kept free for what no ledger sees: allocator fragmentation and
caching, communication libraries' buffers."""


ANY_OUTER_SYNC = "diloco:1"
"""An outer sync of one fragment, for the rule: what it refuses does not depend on the period."""


@dataclass(frozen=True)
class PlanRequest:
    model: ModelConfig
    profile: HardwareProfile
    devices: int
    global_batch: int
    seq_len: int
    dtype: str = "float32"
    budget: float | None = None  # bytes per device; None: the profile's memory
    margin: float = DEFAULT_MARGIN
    policy: str = "ratrain"
    clip: bool = True
    top: int = 5
    micro_batch_sizes: tuple[int, ...] | None = None  # None: every one that divides the batch
    pipeline_degrees: tuple[int, ...] | None = None  # None: 1 .. units
    # None: every one the policy allows; else only plans with one of these (unsharded: "step")
    grad_lifetimes: tuple[str, ...] | None = None
    time_limit_s: float = 60.0
    min_dp: int = 1  # only layouts of at least this many replicas (the low-communication option's)
    # plans as an outer sync runs them (the low-communication option's): no gradient sum every
    # step, in the plans, their bounds and the rule (state in host memory may then span
    # replicas where the collectives cannot reach it)
    outer_sync: bool = False
    threads_per_rank: int | None = None  # --threads; None: what `ratrain train` gives them
    host_grad_dtype: str = "float32"  # what host-homed lifecycles accumulate gradients in
    steps: int | None = None  # the run's: the low-communication option's H leaves 2 syncs in it

    def threads_of(self, layout: Layout) -> int:
        """The CPU threads each rank of the layout computes on (sim/shared_cores.py)."""
        return threads_of_rank(self.profile, layout.pp * layout.dp, self.threads_per_rank)

    def fastest_compute(self, layout: Layout) -> float:
        """The most the layout's ranks' threads speed their compute over the one thread the
        profile's times are: what the search's lower bounds divide by to stay bounds."""
        cores = self.device().cores
        return thread_speed(min(self.threads_of(layout), cores),
                            self.device().thread_efficiency) if cores else 1.0

    @property
    def sync(self) -> str:
        """The plans' --sync: any outer sync for these (what the period adds is priced apart,
        sim/low_comm.py), else a gradient sum every step."""
        return ANY_OUTER_SYNC if self.outer_sync else EVERY_STEP

    def device(self, group: int = 0):
        return self.profile.for_group(group).device

    def budget_of(self, group: int = 0) -> float:
        """Bytes per device of the group: its memory, or the budget asked for where lower."""
        memory = self.device(group).memory_bytes
        return memory if self.budget is None else min(self.budget, memory)

    @property
    def budget_bytes(self) -> float:
        return self.budget_of(0)

    @property
    def budget_above_memory(self) -> str | None:
        """Where the budget asked for is more than any device of the profile has (the plans are
        held to the devices' memory: the budget bounds nothing), a phrase that says so; None
        otherwise."""
        if self.budget is None:
            return None
        memory = max(self.device(g).memory_bytes for g in range(len(self.profile.groups) or 1))
        if self.budget <= memory:
            return None
        said = (f"{a_device(self.profile.name)} has {memory / 1e9:.2f} GB, less than the "
                f"{self.budget / 1e9:.2f} GB asked")
        if memory_is_this_machines(self.profile):  # the way out below is taken already
            return said + " (this machine's available memory, shared by the devices searched)"
        return said + " (a profile of this machine, with its own memory: `ratrain profile`)"

    def limit_of(self, group: int = 0) -> float:
        """What the simulated device peak of a stage on the group, plus the process's own
        overhead beyond the ledger (a measured profile's), may reach."""
        return self.budget_of(group) * (1.0 - self.margin)

    def host_limit_of(self, group: int = 0) -> float:
        host = self.device(group).host_memory_bytes
        return float("inf") if host is None else host * (1.0 - self.margin)

    @property
    def limit(self) -> float:
        return self.limit_of(0)

    @property
    def host_limit(self) -> float:
        return self.host_limit_of(0)


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    micro_batch_size: int
    n_micro: int
    rank_order: str
    lifecycle: Lifecycle
    activation: str  # "mixed" (per stage, per unit: ratrain) or one uniform choice (baseline)
    groups: tuple[int, ...] = ()  # the device group of each stage (heterogeneous profiles)
    schedule: str = "1f1b"
    weight_grad: str | None = None  # a split schedule's BW placement (schedule/weight_grads.py)

    @property
    def devices(self) -> int:
        return self.pp * self.dp

    @property
    def schedule_label(self) -> str:
        """The schedule as the plan table shows it: "1F1B", "ZB-H1 grouped"."""
        name = SCHEDULE_NAMES.get(self.schedule, self.schedule)
        return f"{name} {self.weight_grad}" if self.weight_grad else name


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _host_is_separate(request: PlanRequest) -> bool:
    """The profile's devices have a host tier apart from their memory (a GPU's: layout.has_views)."""
    return request.profile.device.host_link is not None


def lifecycles(request: PlanRequest) -> list[Lifecycle]:
    """State homes and view windows worth trying on this profile and dtype; views only where
    they differ from the masters (layout.has_views). Sharded state (on the device, with views,
    the gathered weights: always there) for layouts of dp >= 2 (`layouts` leaves it out of the
    others), ratrain's with each gradient lifetime (GRAD_LIFETIMES; `layouts` leaves
    out those that cannot help a layout: `lifetime_helps`). The baseline is GPU-style: state
    on the device, views resident; sharded too, as DeepSpeed's ZeRO-1 with its pipeline
    engine (the gradient accumulated for the step). `request.grad_lifetimes` keeps only the
    lifecycles of those lifetimes, unsharded state counting as "step"."""
    host_tier = _host_is_separate(request)
    windows = (0, 1) if request.policy == "ratrain" else (0,)
    out = _unsharded_lifecycles(request, host_tier, windows)
    if has_views(request.dtype, "device", host_tier, shard_state=True):
        lifetimes = GRAD_LIFETIMES if request.policy == "ratrain" else ("step",)
        out.extend(Lifecycle("device", window, request.policy, shard_state=True,
                             grad_lifetime=lifetime, shard_group=group)
                   for group in _shard_groups(request)
                   for window in windows for lifetime in lifetimes)
    if request.grad_lifetimes is not None:
        out = [life for life in out if life.grad_lifetime in request.grad_lifetimes]
    return out


def _shard_groups(request: PlanRequest) -> tuple[int | None, ...]:
    """Shard over every replica (None); for ratrain, also hybrid sharding within a node's
    replicas (`layouts` keeps it where the replicas span several nodes' worth)."""
    node = request.profile.devices_per_node
    return (None, node) if request.policy == "ratrain" and node >= 2 else (None,)


def _hybrid_applies(shard_group: int | None, dp: int) -> bool:
    return shard_group is None or (shard_group < dp and dp % shard_group == 0)


def _unsharded_lifecycles(request: PlanRequest, host_tier: bool,
                          windows: tuple[int, ...]) -> list[Lifecycle]:
    out = []
    for home in ("device", "host") if host_tier else ("device",):
        if request.policy == "baseline" and home == "host":
            continue
        if not has_views(request.dtype, home, host_tier):
            out.append(Lifecycle(home, None, request.policy))
            continue
        low = request.host_grad_dtype if home == "host" else "float32"
        for window in windows:
            out.append(Lifecycle(home, window, request.policy, host_grad_dtype=low))
    return out


def lifetime_helps(lifetime: str, n_micro: int, pp: int, weight_grad: str | None) -> bool:
    """Whether a gradient lifetime shorter than the step can make a plan of this layout fit
    where "step" does not, or "micro-batch" where "transient" does not; where not, it only
    adds exposed syncs (each waited after one more compute action) and, for "micro-batch",
    m - 1 more reduce-scatters per unit and a slice-sized buffer, so the search leaves it out.

    - "transient" always: it frees each unit's full-size gradient once its sync has
      reduced it, which lowers a stage's peak where that comes during the last micro-batch's
      backward (the compute's working bytes on top: sim/working_bytes.py) or, under ZB-H1
      with BWs in the bubble, before the first BW. (Until 2026-11-28 it was left out under
      1F1B with more micro-batches than stages, where every unit holds its gradient from its
      first backward to its last: the ledger's peak alone came no later.)
    - "micro-batch" with one micro-batch, or with BWs grouped per unit (each unit's backwards
      of the step consecutive): "transient" holds the same buffers whenever a backward runs
      (one micro-batch: freed at the same waits; grouped: "micro-batch" frees a unit's only
      between its own BWs), with one reduce-scatter per unit, no wait before each BW of the
      unit, and no slice-sized output held besides the shard's.

    tests/unit/test_planner.py simulates both sides of each of these on tiny.
    """
    if lifetime == "micro-batch":
        return n_micro > 1 and weight_grad != "grouped"
    return True


def grouped(life: Lifecycle, pp: int, n_micro: int) -> list[Lifecycle]:
    """The lifecycle, and on one stage with views and ratrain's policy, the same with each
    unit-major group g > 1 dividing the micro-batches (schedule/unit_major.py): fewer views
    and folds for g times the activations in flight. Not yet over a pipeline: the bounds
    (planner/bounds.py) walk 1F1B in whole micro-batches, which a group's forward, unit by
    unit, can lag."""
    if pp > 1 or life.view_window is None or life.policy != "ratrain" or life.shard_state:
        return [life]
    return [life] + [dataclasses.replace(life, micro_batch_group=g)
                     for g in range(2, n_micro + 1) if n_micro % g == 0]


def refusal(request: PlanRequest, pp: int, dp: int, micro_batch_size: int,
            life: Lifecycle, micro_batch_group: int | None = None) -> str | None:
    """Why training would refuse this layout (setup/rule.refusal: the rule `ratrain train`
    applies; with `request.outer_sync`, under --sync diloco, whose rule is the same at every
    period), or None. `micro_batch_group` None: judged for each group later (`grouped`)."""
    return rule.refusal(sync=request.sync,
        n_layers=request.model.n_layers, pp=pp, dp=dp, global_batch=request.global_batch,
        micro_batch_size=micro_batch_size, policy=life.policy, dtype=request.dtype,
        clip=request.clip, state_home=life.state_home, shard_state=life.shard_state,
        view_window=life.view_window, grad_lifetime=life.grad_lifetime,
        shard_group=life.shard_group, tie_embeddings=request.model.tie_embeddings,
        host_is_separate=_host_is_separate(request),
        host_collectives=request.profile.device.host_collectives,
        micro_batch_group=micro_batch_group, host_grad_dtype=life.host_grad_dtype)


def needs_device_grad_sum(request: PlanRequest, state_home: str, dp: int) -> bool:
    """Whether a layout's host-homed gradients are summed on the device before they fold
    (rule.device_grad_sum_for: GPUs, whose collectives cannot reach the host)."""
    return rule.device_grad_sum_for(state_home, dp, request.sync, _host_is_separate(request),
                                    request.profile.device.host_collectives)


def layouts(request: PlanRequest, refused: list[str] | None = None) -> list[Layout]:
    """Every layout on at most `devices` devices that training can run (`refusal`): pp x dp x
    micro-batch size dividing the global batch into at least pp micro-batches per replica,
    sharded state only over dp >= 2, state on the host only where collectives can reach it.
    `refused`, where given, collects the reasons of those left out."""
    n_units = request.model.n_layers + 2
    g = request.global_batch
    activations = ("mixed",) if request.policy == "ratrain" else ("keep", "recompute")
    out = []
    for pp in request.pipeline_degrees or range(1, min(n_units, request.devices) + 1):
        for dp in _divisors(g):
            if pp * dp > request.devices:
                break
            if dp < request.min_dp:
                continue
            for mbs in request.micro_batch_sizes or _divisors(g // dp):
                orders = ("pp-dp", "dp-pp") if pp > 1 and dp > 1 else ("pp-dp",)
                for life in lifecycles(request):
                    if not _hybrid_applies(life.shard_group, dp):
                        continue  # (not a refusal: a layout of that dp shards over all)
                    n_micro = g // (dp * mbs)
                    # a gradient summed on the device wants each unit's backwards of the
                    # step in one run: one micro-batch, or one group of them all
                    one_run = needs_device_grad_sum(request, life.state_home, dp) and n_micro > 1
                    reason = refusal(request, pp, dp, mbs, life,
                                     1 if one_run and pp > 1 else None)
                    if reason:
                        if refused is not None:
                            refused.append(reason)
                        continue
                    for order, act, (schedule, weight_grad), each in itertools.product(
                            orders, activations, schedules(pp, dp),
                            grouped(life, pp, g // (dp * mbs))):
                        if not lifetime_helps(each.grad_lifetime, g // (dp * mbs), pp,
                                              weight_grad):
                            continue
                        if each.micro_batch_group > 1 and schedule != "1f1b":
                            continue  # groups run 1F1B's order (unit_major.group_refusal)
                        if one_run and each.micro_batch_group != n_micro:
                            continue
                        groups = stage_groups(pp, dp, order, request.profile)
                        if groups is not None:
                            out.append(Layout(pp, dp, mbs, g // (dp * mbs), order, each, act,
                                              tuple(groups), schedule, weight_grad))
    return out
