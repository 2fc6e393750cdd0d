"""A pipeline plan: the per-stage programs of one training step and the choices that made them.

`build_plan` composes a builder (the compute order) with the passes of a policy and checks the
result; `PipelinePlan.to_dict`/`from_dict` write and read it as plain JSON-able data, programs in
their text form (plan_json.py). Data-parallel replicas run the same programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ratrain.schedule import builders, outer_sync
from ratrain.schedule.activation_choice import (by_unit, check_baseline, check_choice,
                                                resolve_activation)
from ratrain.schedule.checks import validate
from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Op, Program
from ratrain.schedule.carried_updates import carry_updates
from ratrain.schedule.plan_checks import check_plan
from ratrain.schedule.plan_json import plan_from_dict, plan_to_dict
from ratrain.schedule.plan_rules import (GRAD_LIFETIMES, UPDATES, check_carried_update,
                                         check_device_grad_sum, check_device_units,
                                         check_host_grad, check_hybrid, check_sharding,
                                         micro_batch_refusal, shared_views, weight_grad_of)
from ratrain.schedule.policies import POLICIES
from ratrain.schedule.tied_sync import add_tied_sync, check_tied, tied_ends
from ratrain.schedule.unit_major import check_group, post_group_receives, unit_major
from ratrain.schedule.weight_grads import place_weight_grads

SCHEDULES: dict[str, Callable[[list[range], int], list[Program]]] = {
    "1f1b": builders.one_f_one_b,
    "gpipe": builders.gpipe,
    "zbh1": builders.zbh1,
}
STATE_HOMES = ("device", "host")
RANK_ORDERS = ("pp-dp", "dp-pp")


@dataclass
class PipelinePlan:
    pp: int
    dp: int
    n_micro: int
    stage_units: list[range]
    """Stage s owns units [start, stop): 0 = embedding, 1..n = decoder blocks, n+1 = head."""
    programs: list[Program]
    """One program per pipeline stage, for one optimizer step."""
    policy: str
    schedule: str
    activation: list[list[str]]
    """How each unit recovers its activations for the backward ("keep", "recompute" or
    "offload"): activation[s][i] is the choice for stage s's i-th unit (aligned with
    stage_units); the programs carry it out (R, or O/L/WL, for every micro-batch)."""
    clip: bool
    """The programs reduce the global gradient norm (N WN) before the updates: for clipping by
    the global norm, and for detecting an fp16 overflow on any stage."""
    rank_order: str = "pp-dp"
    """Placement of the grid on global ranks: "pp-dp" (a stage's replicas are neighbouring
    ranks) or "dp-pp" (one replica's stages are). It changes no program, only which traffic
    runs between neighbours (under torchrun: inside a node)."""
    view_window: int | None = None
    """Parameter views (view_passes.add_views): None, the view is the master (no view actions); 0,
    every view resident; K >= 1, each view prefetched at most K units ahead of its use (in the
    stage's order of compute) and released after it, so at most K + 1 are live."""
    state_home: str = "device"
    """Tier that holds the master weights and optimizer state: "device" or "host"."""
    shard_state: bool = False
    """Each data-parallel replica holds 1/dp of every unit's masters and optimizer state (a
    contiguous slice of the unit's flattened parameters, ZeRO-style). It changes no program,
    only what three actions do: `GS u` reduce-scatters the gradients (each replica gets the sum
    of its slice), `U u` updates the slice, and `P u` all-gathers the slices into the compute
    view, which therefore always differs from the masters (view_window is not None)."""
    weight_grad: str | None = None
    """Where a split schedule's weight gradients (BW) run (schedule/weight_grads.py):
    "bubble", "bubble:K" or "grouped"; None for a schedule whose backward is whole (B)."""
    grad_lifetime: str = "step"
    """How long a unit's full-size fp32 gradient lives (sharded state only; runnable.py):
    "step", accumulated over the step and reduce-scattered once (GS); "transient", the same
    program, but the buffer exists only from the unit's first backward of the step until its
    reduce-scatter has completed (WGS); "micro-batch", each micro-batch's gradient
    reduce-scattered right after its backward (RS u.m, WRS u.m) and added to the shard's, so
    the buffer lives from one backward to that reduction (m times the traffic)."""
    shard_group: int | None = None
    """Hybrid sharding (sharded state only): each unit's state is sharded over groups of this
    many neighbouring replicas (a node's) and replicated across the dp / shard_group groups;
    the programs add `GX u` / `WGX u`, the all-reduce of the shard's gradient across the groups,
    so only a shard's worth of gradient crosses between groups. None: sharded over all dp."""
    sync: str = outer_sync.EVERY_STEP
    """How the replicas agree (schedule/outer_sync.py): "step", every gradient summed every
    step; "diloco:H[:F][:bf16][:islands=K]", each replica (island) takes H inner steps alone,
    then the units' outer sync (OS/WOS), which `programs` do not hold: step_programs adds it.
    It changes the algorithm, not only the schedule."""
    micro_batch_group: int = 1
    """Micro-batches run through a stage unit by unit, in groups of this many, 1F1B over the
    groups (schedule/unit_major.py); 1: 1F1B itself."""
    update: str = "inline"
    """"inline": each unit's optimizer update runs on the walker (U). "carried": it starts on
    the host update thread as soon as what it reads is final (SU) and the next step waits for
    it before it reads the unit's masters (WU): schedule/carried_updates.py."""
    device_units: tuple[int, ...] = ()
    """With state_home "host": the units whose masters, gradients and AdamW state stay on the
    compute device (where the budget allows: ProTrain's idea), updated there inline (U)."""
    tie_embeddings: bool = False
    """The head computes with the embedding's weight: on one stage, with a view window, the
    embedding's view lives from its first use to the head's last (view_passes.add_views'
    `shared`); across stages the head keeps a copy, summed by TS (schedule/tied_sync.py)."""
    device_grad_sum: bool = False
    """Host-homed units' gradients are summed over the replicas on the compute device, each
    unit's whole step's in fp32, and fold to the host once summed (GPUs: NCCL cannot reduce
    host memory; ZeRO-Offload's order). GS u sums the run of unit_major.fold_roles' SYNC
    role and WGS u folds it (plan_rules.device_grad_sum_refusal: what it needs)."""
    host_grad_dtype: str = "float32"
    """What host-homed units (not the device units) accumulate their gradient in: "float32" or
    "bfloat16" (2 bytes a parameter; runtime/host_grad.py). It changes no program."""

    @property
    def on_device_text(self) -> str:
        """" (units 0, 1 on the device)" where the plan keeps some units' state there, else ""."""
        n = self.device_units
        return (f" (unit{'s' if len(n) > 1 else ''} {', '.join(map(str, n))} on the device)"
                if n else "")

    @property
    def n_layers(self) -> int:
        return self.stage_units[-1].stop - 2

    @property
    def summed_on_device(self) -> frozenset[int]:
        """The units whose gradient device_grad_sum sums on the device: the host-homed ones."""
        if not self.device_grad_sum:
            return frozenset()
        return frozenset(range(self.stage_units[-1].stop)).difference(self.device_units)

    @property
    def unit_activation(self) -> dict[int, str]:
        """Unit -> its activation policy, over every stage."""
        return by_unit(self.stage_units, self.activation)

    def validate(self) -> None:
        """Run every check of the programs and the fields (plan_checks.check_plan); call it on
        a plan read from a file before use."""
        check_plan(self)

    @property
    def shared_views(self) -> dict[int, int]:
        """Unit -> the other unit whose view it computes with (plan_rules.shared_views)."""
        return shared_views(self.stage_units, self.tie_embeddings)

    @property
    def tied_ends(self) -> dict[int, int]:
        """Stage -> its copy of a weight tied across stages (tied_sync.tied_ends)."""
        return tied_ends(self.stage_units, self.tie_embeddings)

    @property
    def grad_sync_dp(self) -> int:
        """The replicas a step's gradients are summed over: all (synchronous), an island's
        (diloco with islands), 1 where they are not (diloco)."""
        return outer_sync.grad_sync_replicas(self.sync, self.dp)

    def to_dict(self) -> dict[str, Any]:
        return plan_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelinePlan:
        """Read `to_dict`'s output (plan_json.plan_from_dict: older plans too)."""
        return plan_from_dict(cls, d)


def build_plan(
    n_layers: int,
    pp: int,
    dp: int,
    n_micro: int,
    schedule: str = "1f1b",
    policy: str = "ratrain",
    activation: str | list[str] = "keep",
    units_per_stage: list[int] | None = None,
    clip: bool = True,
    rank_order: str = "pp-dp",
    view_window: int | None = None,
    state_home: str = "device",
    unit_activation: dict[int, str] | None = None,
    check: bool = True,
    shard_state: bool = False,
    weight_grad: str | None = None,
    grad_lifetime: str = "step",
    shard_group: int | None = None,
    micro_batch_group: int = 1,
    sync: str = outer_sync.EVERY_STEP,
    update: str = "inline",
    device_units=(),
    tie_embeddings: bool = False,
    device_grad_sum: bool = False,
    host_grad_dtype: str = "float32",
) -> PipelinePlan:
    """Build and check the programs of one training step.

    `n_micro` is the number of micro-batches per step per data-parallel replica; it must be at
    least `pp`, or some stage would idle through the whole step's steady state. `activation`
    is one policy for every decoder block or a list of one per stage (for that stage's decoder
    blocks); the embedding and the head keep, and `unit_activation` overrides any unit.
    `view_window`, `clip` and `shard_state`: see PipelinePlan. `state_home` and `shard_state`
    are recorded for the executor; they change no program. `weight_grad` places a split
    schedule's BWs ("bubble", the default, "bubble:K" or "grouped": schedule/weight_grads.py); a schedule
    with whole backwards takes none. `grad_lifetime` and `shard_group` (sharded state): see
    PipelinePlan.
    `micro_batch_group` g > 1 runs 1F1B over groups of g micro-batches, each group unit by
    unit (schedule/unit_major.py).
    `update`: "inline" or "carried" (PipelinePlan.update); `device_units`, `tie_embeddings`,
    `device_grad_sum`, `host_grad_dtype`: PipelinePlan's.
    `check` False skips the checks of the programs (a search that builds
    many plans checks the ones it keeps).
    """
    check_choice("schedule", schedule, SCHEDULES)
    check_choice("policy", policy, POLICIES)
    check_choice("rank order", rank_order, RANK_ORDERS)
    check_choice("state home", state_home, STATE_HOMES)
    if dp < 1:
        raise ScheduleConfigError(f"dp must be >= 1, got {dp}")
    if n_micro < 1:
        raise ScheduleConfigError(f"n_micro must be >= 1, got {n_micro}")
    if view_window is not None and view_window < 0:
        raise ScheduleConfigError(
            f"view_window must be >= 0 (or None: the view is the master), got {view_window}")
    check_choice("gradient lifetime", grad_lifetime, GRAD_LIFETIMES)
    check_sharding(shard_state, dp, state_home, view_window, grad_lifetime, policy)
    check_hybrid(shard_group, shard_state, dp, policy)
    check_choice("update", update, UPDATES)
    check_carried_update(update, shard_state, sync)
    stage_units = builders.partition_units(n_layers, pp, units_per_stage)
    shared = shared_views(stage_units, tie_embeddings)
    check_tied(tie_embeddings, pp, shard_state, sync)
    outer_sync.check_outer(sync, dp, policy, shard_state, stage_units[-1].stop, shard_group)
    device_units = tuple(sorted(device_units))
    check_device_units(device_units, state_home, stage_units[-1].stop)
    check_host_grad(host_grad_dtype, state_home, shard_state, view_window)
    sync_dp = outer_sync.grad_sync_replicas(sync, dp)  # diloco: an island's replicas, or none
    builder = SCHEDULES[schedule]
    weight_grad = weight_grad_of(schedule, weight_grad)
    reason = micro_batch_refusal(n_micro, pp, schedule)
    if reason:
        raise ScheduleConfigError(reason)
    resolved = resolve_activation(activation, unit_activation, stage_units)
    if policy == "baseline":
        check_baseline(activation, resolved, stage_units, view_window)
    check_group(micro_batch_group, n_micro, pp, schedule)
    check_device_grad_sum(device_grad_sum, state_home, dp, shard_state, sync, policy,
                          view_window, n_micro, micro_batch_group)
    programs = (unit_major(stage_units, n_micro, micro_batch_group) if micro_batch_group > 1
                else builder(stage_units, n_micro))
    if weight_grad is not None:
        programs = place_weight_grads(programs, weight_grad)
    programs = POLICIES[policy](programs, stage_units, sync_dp, by_unit(stage_units, resolved),
                                clip, view_window, grad_lifetime, shard_group, shared,
                                early_waits=device_grad_sum)
    programs = add_tied_sync(programs, stage_units, tie_embeddings)
    programs = post_group_receives(programs, micro_batch_group)
    if update == "carried":
        programs = carry_updates(programs, stage_units, frozenset(device_units))
        if not any(a.op is Op.START_UPDATE for program in programs for a in program):
            update = "inline"  # every unit on the device: nothing left to carry
    plan = PipelinePlan(pp, dp, n_micro, stage_units, programs, policy, schedule, resolved, clip,
                        rank_order, view_window, state_home, shard_state, weight_grad,
                        grad_lifetime, shard_group, sync, micro_batch_group,
                        update, device_units, tie_embeddings, device_grad_sum,
                        host_grad_dtype)
    if check:
        for variant in [programs, *outer_sync.every_variant(plan)]:
            validate(variant, stage_units, n_micro, sync_dp, shared=shared)
    return plan
