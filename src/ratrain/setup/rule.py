"""What can run: one rule that the setup stage (entry.run_plan: `ratrain train`, `plan`,
`simulate`) and the planner's search both apply, so the planner never returns a plan that
training refuses.

The rule is about the combination of choices (the layout, where the state lives, the dtype and
the hardware), not about a single value (a negative --pp, an unknown policy: config.validate
names those). The rules a plan keeps within itself are schedule/plan_rules.py's; this one adds
the run's and the machine's. Pure Python: the planner calls it without torch.
"""

from __future__ import annotations

from ratrain.counts import model_units
from ratrain.errors import UserError
from ratrain.schedule.outer_sync import EVERY_STEP, grad_sync_replicas, outer_refusal
from ratrain.schedule.plan_rules import (carried_update_refusal, device_grad_sum_refusal,
                                         host_grad_refusal, hybrid_refusal, micro_batch_refusal,
                                         sharding_refusal)
from ratrain.schedule.tied_sync import tied_refusal

def refusal(*, n_layers: int, pp: int, dp: int, global_batch: int, micro_batch_size: int,
            schedule: str = "1f1b", policy: str = "ratrain", dtype: str = "float32",
            clip: bool = True, state_home: str = "device", shard_state: bool = False,
            view_window: int | None = None, grad_lifetime: str = "step",
            shard_group: int | None = None, sync: str = EVERY_STEP, update: str = "inline",
            tie_embeddings: bool = False,
            host_is_separate: bool = False, host_collectives: bool | None = None,
            world: int | None = None, micro_batch_group: int | None = None,
            device_grad_sum: bool | None = None,
            host_grad_dtype: str = "float32") -> str | None:
    """Why this cannot run (one line, as the user's mistake is told), or None when it can.

    `view_window` is the plan's: None where the views are the masters (has_views).
    `host_is_separate`: the state's host tier is not the compute device's memory (a GPU).
    `host_collectives`: the devices' collectives can reduce buffers in the host tier (not so on
    GPUs: NCCL reduces device memory only; a profile says it in `host_collectives`); None:
    not where the host is apart, as on this runtime's GPUs. Without them host-homed gradients
    are summed on the device before they fold (`device_grad_sum`; None: where the machine
    needs it, device_grad_sum_for), and DiLoCo's outer sync of host state goes over a gloo
    group (runtime Groups.host_replicas). `micro_batch_group`: None where --schedule auto
    chooses it. `world`: the processes already started for the run (torchrun's WORLD_SIZE);
    None where the run starts its own.
    """
    n_units = n_layers + 2
    if world is not None and world != pp * dp:
        return (f"torchrun started {world} processes, but --pp {pp} x --dp {dp} needs "
                f"{pp * dp}")
    if pp > n_units:
        return (f"pp={pp} is more stages than the model has units ({n_units}: "
                f"{model_units(n_layers)}); lower pp to at most {n_units}")
    if global_batch % dp or (global_batch // dp) % micro_batch_size:
        return (f"global batch {global_batch} does not split into dp={dp} replicas of whole "
                f"micro-batches of {micro_batch_size}")
    reason = micro_batch_refusal(global_batch // (dp * micro_batch_size), pp, schedule)
    if reason:
        return reason
    reason = (tied_refusal(tie_embeddings, pp, shard_state, sync)
              or sharding_refusal(shard_state, dp, state_home, view_window, grad_lifetime, policy)
              or hybrid_refusal(shard_group, shard_state, dp, policy)
              or outer_refusal(sync, dp, policy, shard_state, n_units, shard_group)
              or carried_update_refusal(update, shard_state, sync)
              or host_grad_refusal(host_grad_dtype, state_home, shard_state, view_window))
    if reason:
        return reason
    if host_collectives is None:
        host_collectives = not host_is_separate
    needed = device_grad_sum_for(state_home, dp, sync, host_is_separate, host_collectives)
    if device_grad_sum is None:
        device_grad_sum = needed
    if needed and not device_grad_sum:
        return ("this plan sums host-homed gradients over --dp where they live, on the host, "
                "which NCCL cannot do; on GPUs they are summed on the device before they fold "
                "(device_grad_sum): build the plan for this machine")
    reason = device_grad_sum_refusal(device_grad_sum, state_home, dp, shard_state, sync,
                                     policy, view_window, global_batch // (dp * micro_batch_size),
                                     micro_batch_group)
    if reason:
        return reason
    if state_home == "host" and tie_embeddings and pp > 1 and host_is_separate \
            and not host_collectives:
        return ("tied embeddings across pipeline stages with --state-home host on GPUs sum the "
                "tied weight's gradient where it lives, on the host, which NCCL cannot do; use "
                "--state-home device, or --pp 1")
    if policy == "baseline" and view_window not in (None, 0):  # (a damaged plan's too)
        return (f"baseline keeps parameter views resident (view_window None or 0), got "
                f"view_window={view_window}; --view-window needs --policy ratrain")
    if dtype == "float16" and not clip:
        return ("float16 needs the global gradient norm in the programs (N, WN) to detect an "
                "overflow on any stage; build the plan with clip")
    return None


def has_views(dtype: str, state_home: str, host_is_separate: bool,
              shard_state: bool = False) -> bool:
    """Whether compute views differ from the masters: a compute dtype other than fp32, masters
    on a host that is not the compute device's memory (`host_is_separate`: a GPU), or masters
    sharded over the replicas (the view is the gathered whole). Otherwise, as on a CPU-only
    fp32 run, views would be copies of the masters in the same memory: there are none."""
    return (dtype != "float32" or (state_home == "host" and host_is_separate)
            or shard_state)


def device_grad_sum_for(state_home: str, dp: int, sync: str, host_is_separate: bool,
                        host_collectives: bool | None) -> bool:
    """Whether host-homed gradients must be summed on the device before they fold: summed
    every step (all replicas, or --sync diloco's islands) over replicas whose collectives
    cannot reach the host (NCCL on GPUs)."""
    if host_collectives is None:
        host_collectives = not host_is_separate
    return (state_home == "host" and grad_sync_replicas(sync, dp) > 1 and host_is_separate
            and not host_collectives)


def update_for(requested: str, state_home: str, shard_state: bool,
               host_is_separate: bool, sync: str = EVERY_STEP) -> str:
    """Where the updates run when the run says `auto`: carried where the state lives in a
    host apart from the compute device (a GPU's), unsharded; there the update is host work
    the device need not wait for. Elsewhere the host is the compute's own cores: inline."""
    if requested != "auto":
        return requested
    carried = (state_home == "host" and host_is_separate and not shard_state
               and sync == EVERY_STEP)
    return "carried" if carried else "inline"


def check_runnable(**setup) -> None:
    """Raise UserError with `refusal`'s line where the setup cannot run."""
    reason = refusal(**setup)
    if reason:
        raise UserError(reason)


def runnable(**setup) -> bool:
    """Whether the setup can run (`refusal` is None): what the planner filters its layouts by."""
    return refusal(**setup) is None
