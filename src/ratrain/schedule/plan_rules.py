"""The rules a plan's own choices keep among themselves, each refusal worded once: enough
micro-batches for the stages, what sharded state needs, how hybrid sharding groups the
replicas. `build_plan` and a plan read from a file refuse with them, and the setup stage's rule
of what can run (setup/rule.py) applies them to a run's request."""

from __future__ import annotations

from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.outer_sync import grad_sync_replicas
from ratrain.schedule.weight_grads import parse_placement

SCHEDULE_NAMES = {"1f1b": "1F1B", "gpipe": "GPipe", "zbh1": "ZB-H1"}
SPLIT_SCHEDULES = ("zbh1",)
"""Schedules whose backward is split into BI and BW; they take a weight-gradient placement."""
GRAD_LIFETIMES = ("step", "transient", "micro-batch")
"""How long a unit's full-size fp32 gradient lives (schedule/plan.PipelinePlan.grad_lifetime)."""
HOST_GRAD_DTYPES = ("float32", "bfloat16")
"""What a host-homed unit accumulates its gradient in (schedule/plan.PipelinePlan.host_grad_dtype)."""


def micro_batch_refusal(n_micro: int, pp: int, schedule: str = "1f1b") -> str | None:
    """A pipeline schedule fills every stage only with at least as many micro-batches as stages."""
    if n_micro >= pp:
        return None
    name = SCHEDULE_NAMES.get(schedule, "a pipeline schedule" if schedule == "auto" else schedule)
    return (f"n_micro={n_micro} is fewer than pp={pp} stages: {name} needs at least as many "
            f"micro-batches as stages; raise global_batch or lower micro_batch_size/dp")


def sharding_refusal(shard_state: bool, dp: int, state_home: str, view_window: int | None,
                     grad_lifetime: str = "step", policy: str = "ratrain") -> str | None:
    """Sharded state splits each unit's masters over the replicas: it needs more than one, the
    state on the device (the collectives run where the state lives; NCCL only on the device),
    and compute views (the gathered weights) in the programs. A gradient that lives less than
    the step is a sharded state's (only the shard's gradient outlives it) and a lifecycle
    choice (the baseline accumulates for the step)."""
    if grad_lifetime != "step":
        if not shard_state:
            return (f"--grad-lifetime {grad_lifetime} frees the full-size gradient once it is "
                    f"reduce-scattered, which only sharded state does; add --shard-state")
        if policy != "ratrain":
            return (f"--grad-lifetime {grad_lifetime} is a lifecycle choice of --policy "
                    f"ratrain; the baseline accumulates each gradient for the step")
    if not shard_state:
        return None
    if dp < 2:
        return ("--shard-state splits the masters and optimizer state over data-parallel "
                f"replicas; --dp {dp} has none to split over")
    if state_home != "device":
        return ("sharded state (--shard-state) lives on the device; it cannot be combined "
                f"with --state-home {state_home}")
    if view_window is None:
        return ("sharded state needs compute views (the gathered weights): view_window must "
                "be 0 (resident) or a window >= 1, not None")
    return None


def hybrid_refusal(shard_group: int | None, shard_state: bool, dp: int,
                   policy: str = "ratrain") -> str | None:
    """Hybrid sharding shards within groups of replicas and replicates across them: the groups
    must split the replicas evenly into at least two groups of at least two."""
    if shard_group is None:
        return None
    if not shard_state:
        return (f"--shard-group {shard_group} shards the state within groups of replicas, which "
                f"needs --shard-state")
    if policy != "ratrain":
        return (f"--shard-group is a lifecycle choice of --policy ratrain (the cross-group "
                f"all-reduce of each shard is placed per unit)")
    if not 2 <= shard_group < dp or dp % shard_group:
        return (f"--shard-group {shard_group} must divide --dp {dp} into at least two groups of "
                f"at least two replicas (leave it out to shard over all {dp})")
    return None


def check_sharding(shard_state: bool, dp: int, state_home: str, view_window: int | None,
                   grad_lifetime: str = "step", policy: str = "ratrain") -> None:
    """Raise where sharded state cannot run with these choices (sharding_refusal)."""
    reason = sharding_refusal(shard_state, dp, state_home, view_window, grad_lifetime, policy)
    if reason:
        raise ScheduleConfigError(reason)


def check_hybrid(shard_group: int | None, shard_state: bool, dp: int, policy: str) -> None:
    """Raise where hybrid sharding cannot run with these choices (hybrid_refusal)."""
    reason = hybrid_refusal(shard_group, shard_state, dp, policy)
    if reason:
        raise ScheduleConfigError(reason)


UPDATES = ("inline", "carried")
"""Where a unit's optimizer update runs: on the walker (U), or carried to the host update
thread and waited in the next step (SU/WU: schedule/carried_updates.py)."""


def carried_update_refusal(update: str, shard_state: bool, sync: str = "step") -> str | None:
    """Why carried updates cannot run with these choices, or None."""
    if update == "carried" and sync != "step":
        return ("carried updates and --sync diloco do not go together yet: a unit's outer "
                "delta is taken right after its update; use --update inline")
    if update == "carried" and shard_state:
        return ("carried updates need whole state on each replica: a sharded unit's view is "
                "gathered from every replica's slice (--shard-state), so every replica would "
                "wait for every other's update anyway")
    return None


def check_carried_update(update: str, shard_state: bool, sync: str = "step") -> None:
    reason = carried_update_refusal(update, shard_state, sync)
    if reason:
        raise ScheduleConfigError(reason)


def device_units_refusal(device_units, state_home: str, n_units: int) -> str | None:
    """Units whose state stays on the compute device while the rest lives on the host
    (schedule/plan.PipelinePlan.device_units): only beside host-homed state, and real units.
    Under --sync diloco a device unit's outer state and delta live on the device with its
    masters, and its delta is summed over the replicas' group of the device (NCCL on GPUs)."""
    if not device_units:
        return None
    if state_home != "host":
        return (f"--device-units keeps some units' state on the device while the others live "
                f"on the host; with --state-home {state_home} every unit's is there already")
    if not all(isinstance(u, int) and not isinstance(u, bool) for u in device_units):
        return f"device units must be unit indices (integers), got {list(device_units)}"
    outside = sorted(u for u in device_units if not 0 <= u < n_units)
    if outside:
        return f"device units {outside} are not units of the model (0 to {n_units - 1})"
    return None


def check_device_units(device_units, state_home: str, n_units: int) -> None:
    reason = device_units_refusal(device_units, state_home, n_units)
    if reason:
        raise ScheduleConfigError(reason)


def host_grad_refusal(host_grad_dtype: str, state_home: str, shard_state: bool,
                      view_window: int | None) -> str | None:
    """A bf16 gradient accumulation for host-homed state (PipelinePlan.host_grad_dtype) is
    made by the folds of a compute view's gradients into the host's buffer: it needs the state
    on the host, views, and whole (not sharded) units."""
    if host_grad_dtype not in HOST_GRAD_DTYPES:
        return (f"unknown host gradient dtype {host_grad_dtype!r}; available: "
                f"{', '.join(HOST_GRAD_DTYPES)}")
    if host_grad_dtype == "float32":
        return None
    if state_home != "host" or view_window is None:
        return (f"--host-grad-dtype {host_grad_dtype} holds host-homed state's gradients in 2 "
                f"bytes a parameter, folded from the compute views' gradients; it needs "
                f"--state-home host and views apart from the masters: a --view-window, with a "
                f"--dtype other than float32 or on a GPU (a float32 run on a CPU computes on the "
                f"masters themselves)")
    if shard_state:
        return f"--host-grad-dtype {host_grad_dtype} does not go with --shard-state"
    return None


def check_host_grad(host_grad_dtype: str, state_home: str, shard_state: bool,
                    view_window: int | None) -> None:
    reason = host_grad_refusal(host_grad_dtype, state_home, shard_state, view_window)
    if reason:
        raise ScheduleConfigError(reason)


def device_grad_sum_refusal(device_grad_sum: bool, state_home: str, dp: int,
                           shard_state: bool, sync: str, policy: str, view_window: int | None,
                           n_micro: int, micro_batch_group: int | None) -> str | None:
    """Summing host-homed units' gradients on the compute device before they fold to the host
    (PipelinePlan.device_grad_sum: what NCCL, which reduces device memory only, needs) sums
    each unit's gradient once a step, so its backwards of the step must be one run: one
    micro-batch, or unit-major groups of the whole step. The ratrain policy waits for each
    sum after one more compute action, so about two units' sums are on the device at a time;
    the baseline's syncs after the flush would hold every unit's at once. `micro_batch_group`
    None: still to be chosen (--schedule auto weighs only the groups that can run)."""
    if not device_grad_sum:
        return None
    summed = (f"--state-home host over --dp {dp} replicas sums each unit's gradient on the "
              f"device before it folds to the host (on GPUs NCCL cannot reduce host memory)")
    if state_home != "host" or shard_state:
        return ("summing gradients on the device before they fold to the host is for "
                "whole state in host memory (--state-home host, no --shard-state)")
    if grad_sync_replicas(sync, dp) < 2:
        return ("summing gradients on the device before they fold to the host needs a "
                "gradient sum every step: --dp > 1 and --sync step, or --sync diloco with "
                "islands of 2 or more replicas")
    if policy != "ratrain":
        return (f"{summed}, a lifecycle choice of --policy ratrain: the baseline's syncs after "
                f"the flush would hold every unit's fp32 gradient on the device at once")
    if view_window is None:
        return ("summing gradients on the device before they fold to the host needs compute "
                "views (view_window 0 or a window), which host-homed state on a GPU has")
    if n_micro > 1 and micro_batch_group not in (None, n_micro):
        return (f"{summed}, once a step: each unit's backwards of a step must run back to back. "
                f"Use --schedule 1f1b --micro-batch-group {n_micro} (every micro-batch of the "
                f"step in one group, unit by unit) or one micro-batch per replica; or "
                f"--state-home device, or --sync diloco:H (its outer sync of host state runs "
                f"over gloo)")
    return None


def check_device_grad_sum(device_grad_sum: bool, state_home: str, dp: int, shard_state: bool,
                          sync: str, policy: str, view_window: int | None, n_micro: int,
                          micro_batch_group: int | None) -> None:
    reason = device_grad_sum_refusal(device_grad_sum, state_home, dp, shard_state, sync,
                                     policy, view_window, n_micro, micro_batch_group)
    if reason:
        raise ScheduleConfigError(reason)


def weight_grad_of(schedule: str, weight_grad: str | None) -> str | None:
    """The placement of a split schedule's BWs ("bubble" unless chosen); None for the others,
    which refuse one."""
    if schedule not in SPLIT_SCHEDULES:
        if weight_grad is not None:
            raise ScheduleConfigError(
                f"a weight-gradient placement ({weight_grad!r}) needs a schedule that splits the "
                f"backward ({', '.join(SPLIT_SCHEDULES)}); {schedule!r} runs whole backwards")
        return None
    weight_grad = weight_grad or "bubble"
    parse_placement(weight_grad)
    return weight_grad


def shared_views(stage_units: list[range], tie_embeddings: bool) -> dict[int, int]:
    """Unit -> the other unit whose view its compute reads too: a tied head on the embedding's
    stage reads the embedding's weight ({head: 0}). A tied head on another stage computes with
    its own copy (schedule/tied_sync.py): nothing shared."""
    head = stage_units[-1].stop - 1
    if tie_embeddings and any(0 in units and head in units for units in stage_units):
        return {head: 0}
    return {}
