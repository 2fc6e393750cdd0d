"""What can run: one rule that a run's preparation, the planner's search and the command line
all apply, so the planner never returns a plan that training refuses.

The rule is about the combination of choices (the layout, where the state lives, the dtype and
the hardware), not about a single value (a negative --pp, an unknown policy: config.validate
names those). Pure Python: the planner and the CLI call it without torch.
"""

from __future__ import annotations

from ratrain.errors import UserError

SCHEDULE_NAMES = {"1f1b": "1F1B", "gpipe": "GPipe", "zbh1": "ZB-H1"}
GRAD_LIFETIMES = ("step", "transient", "micro-batch")
"""How long a unit's full-size fp32 gradient lives (schedule/plan.PipelinePlan.grad_lifetime)."""


def refusal(*, n_layers: int, pp: int, dp: int, global_batch: int, micro_batch_size: int,
            schedule: str = "1f1b", policy: str = "ratrain", dtype: str = "float32",
            clip: bool = True, state_home: str = "device", shard_state: bool = False,
            view_window: int | None = None, grad_lifetime: str = "step",
            shard_group: int | None = None,
            tie_embeddings: bool = False,
            host_is_separate: bool = False, host_collectives: bool | None = None,
            world: int | None = None) -> str | None:
    """Why this cannot run (one line, as the user's mistake is told), or None when it can.

    `view_window` is the plan's: None where the views are the masters (layout.has_views).
    `host_is_separate`: the state's host tier is not the compute device's memory (a GPU).
    `host_collectives`: the devices' collectives can reduce buffers in the host tier (not so on
    GPUs: NCCL reduces device memory only; a profile says it in `host_collectives`); None:
    not where the host is apart, as on this runtime's GPUs. `world`: the processes already started for the
    run (torchrun's WORLD_SIZE); None where the run starts its own.
    """
    n_units = n_layers + 2
    if world is not None and world != pp * dp:
        return (f"torchrun started {world} processes, but --pp {pp} x --dp {dp} needs "
                f"{pp * dp}")
    if pp > n_units:
        return (f"pp={pp} is more stages than the model has units ({n_units}: embedding, "
                f"{n_layers} decoder blocks, head); lower pp to at most {n_units}")
    if global_batch % dp or (global_batch // dp) % micro_batch_size:
        return (f"global batch {global_batch} does not split into dp={dp} replicas of whole "
                f"micro-batches of {micro_batch_size}")
    reason = micro_batch_refusal(global_batch // (dp * micro_batch_size), pp, schedule)
    if reason:
        return reason
    if tie_embeddings and pp > 1:
        return ("tied embeddings need the embedding and the head on one stage; use --pp 1 "
                "(pipelined tied embeddings are not supported yet)")
    reason = (sharding_refusal(shard_state, dp, state_home, view_window, grad_lifetime, policy)
              or hybrid_refusal(shard_group, shard_state, dp, policy))
    if reason:
        return reason
    if host_collectives is None:
        host_collectives = not host_is_separate
    if state_home == "host" and dp > 1 and host_is_separate and not host_collectives:
        return ("--state-home host with --dp > 1 on GPUs needs the gradient sync on the host, "
                "which NCCL cannot do; use --state-home device")
    if policy == "baseline" and view_window not in (None, 0):  # (a damaged plan's too)
        return (f"baseline keeps parameter views resident (view_window None or 0), got "
                f"view_window={view_window}; --view-window needs --policy ratrain")
    if dtype == "float16" and not clip:
        return ("float16 needs the global gradient norm in the programs (N, WN) to detect an "
                "overflow on any stage; build the plan with clip")
    return None


def micro_batch_refusal(n_micro: int, pp: int, schedule: str = "1f1b") -> str | None:
    """A pipeline schedule fills every stage only with at least as many micro-batches as stages."""
    if n_micro >= pp:
        return None
    name = SCHEDULE_NAMES.get(schedule, schedule)
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


def check_runnable(**setup) -> None:
    """Raise UserError with `refusal`'s line where the setup cannot run."""
    reason = refusal(**setup)
    if reason:
        raise UserError(reason)


def runnable(**setup) -> bool:
    """Whether the setup can run (`refusal` is None): what the planner filters its layouts by."""
    return refusal(**setup) is None
