"""The planner's search as the command line asks for it: `ratrain plan`'s, which lists what it
found, and `ratrain train --memory-budget`'s, which trains the best of it."""

from __future__ import annotations

import click

from ratrain.config import RunConfig
from ratrain.counts import counted, model_units
from ratrain.errors import UserError
# a CPU node's memory shared by its devices: the planner's account hints by it too (simulate
# imports it from here)
from ratrain.planner.node_memory import with_node_memory
from ratrain.schedule.outer_sync import EVERY_STEP

PLANNER_CHOOSES = ("dp", "schedule", "weight_grad", "micro_batch_group", "activation",
                   "view_window", "state_home", "partition", "rank_order", "shard_state",
                   "shard_group", "device_units", "update")
"""Flags whose choice is the search's (the update's: auto, carried where state is host-homed):
refused beside it. (--micro-batch-group and --update were ignored until 2026-12-02.)"""
MARGIN = 0.10
"""The budget's share kept free for allocator fragmentation and library buffers."""
TIME_LIMIT_S = 25.0
"""Seconds a search may take; past it, the best plan found so far."""


def refuse_no_devices(devices: int | None) -> None:
    """--devices below 1, refused before anything is sized by it: 0 is no "not given" (taken
    so, `plan` showed the default programs and `train` searched the default devices)."""
    if devices is not None and devices < 1:
        raise UserError(f"--devices must be at least 1, got {devices}")


def profile_file_of(profile_spec: str | None) -> str | None:
    """The --profile's YAML file, resolved, as every plan file searched on it records it
    (prediction.profile_file); None for a preset or this machine's (they load by name). Until
    2026-12-04 only `plan --out`'s main file had it: its option files and `train
    --memory-budget`'s RUN/plan.json named a measured profile that `simulate --plan` refused."""
    from pathlib import Path

    return str(Path(profile_spec).resolve()) if profile_spec and Path(profile_spec).is_file() \
        else None


def with_this_machines_memory(hw, devices: int | None):
    """The CPU profile `hw` with a device's memory what this machine has available now, shared
    by the `devices` searched (search_request's default on a CPU: 2), where no --profile was
    given: `ratrain train --memory-budget` and `ratrain plan` then search the same memory (the
    preset's 8 GB held a larger budget asked for on a larger machine to 8 GB). Unchanged where
    the available memory cannot be read."""
    import dataclasses

    from ratrain.host_memory import available_host_bytes
    from ratrain.planner.wording import THIS_MACHINES_MEMORY

    available = available_host_bytes()
    if available is None:
        return hw
    shared = devices or hw.device_count or 2
    notes = {**hw.notes, "device.memory_bytes": f"{THIS_MACHINES_MEMORY} "
             f"({available / 1e9:.2f} GB) shared by the "
             f"{counted(shared, 'device')} searched"}
    return dataclasses.replace(hw, notes=notes, device=dataclasses.replace(
        hw.device, memory_bytes=float(available) / shared))


def with_this_machines_host(hw, devices: int):
    """The GPU profile `hw` with each device's host tier at most this machine's available
    memory shared by the `devices` GPUs searched, where no --profile was given: `ratrain train
    --memory-budget` then searches the host memory the run will be checked against (a preset
    assumes a node's: 200 GB a GPU for the H100's, where a machine of one H200 had 125 GB, and
    the search's plan was refused at the start). Unchanged where the memory cannot be read."""
    from ratrain.host_memory import available_host_bytes

    available = available_host_bytes()
    if available is None or not has_host_tier(hw):
        return hw
    return _host_bounded(hw, float(available) / max(1, devices),
                         f"this machine's available memory ({available / 1e9:.2f} GB) shared by "
                         f"the {devices} GPUs searched")


def has_host_tier(hw) -> bool:
    """Whether some device of the profile `hw` has a host tier apart from its memory (a GPU's
    host; a CPU's host memory is the device's)."""
    return hw.device.host_link is not None or any(g.device.host_link for g in hw.groups)


def with_host_budget(hw, host_memory_budget: str | None):
    """The profile `hw` with each device's host tier at most `host_memory_budget` bytes
    (--host-memory-budget: 100GB, 90GiB); unchanged where none is given. A profile without a
    host tier (a CPU's) refuses it: its host memory is the device's."""
    from ratrain.planner.budget import parse_bytes

    if host_memory_budget is None:
        return hw
    budget = parse_bytes(host_memory_budget, "--host-memory-budget")
    if not has_host_tier(hw):
        raise UserError(f"--host-memory-budget: profile {hw.name} has no host tier apart from "
                        f"its devices' memory (a CPU profile): --memory-budget bounds it")
    return _host_bounded(hw, budget, f"--host-memory-budget {host_memory_budget}")


def _host_bounded(hw, limit: float, why: str):
    """`hw` with each device's host memory at most `limit` bytes, the profile's note saying
    `why`."""
    import dataclasses

    def bounded(device):
        host = device.host_memory_bytes
        return dataclasses.replace(device, host_memory_bytes=limit if host is None
                                   else min(host, limit))
    notes = {**hw.notes, "device.host_memory_bytes": f"{why}, or the profile's where less"}
    return dataclasses.replace(hw, notes=notes, device=bounded(hw.device), groups=[
        dataclasses.replace(g, device=bounded(g.device)) for g in hw.groups])


def search_request(cfg: RunConfig, opts: dict, hw, devices: int | None,
                   memory_budget: str | None, margin: float, top: int, time_limit: float,
                   flags: str):
    """The search's PlanRequest for cfg and the flags given, on the HardwareProfile `hw`
    (devices None: the profile's groups, else 2 on a CPU profile, 8 otherwise); `flags` names
    the command's search flags in its refusals."""
    from ratrain.planner import search
    from ratrain.planner.budget import parse_bytes

    for flag in PLANNER_CHOOSES:
        if opts.get(flag) is not None:
            raise UserError(f"--{flag.replace('_', '-')} is the planner's to choose; leave it out "
                            f"of a search ({flags})")
    if opts.get("sync") not in (None, EVERY_STEP):
        raise UserError("--sync is not searched: the planner ranks synchronous plans and, where "
                        "the link is too slow for a sync every step, `ratrain plan` offers "
                        "--sync diloco below them (with --out FILE, written to FILE's "
                        ".diloco.json); leave it out")
    if opts.get("micro_batch_size") is None:  # the search picks it; 1 divides any batch
        cfg.train.micro_batch_size = 1  # (0 was taken as not given: validate refuses it)
    cfg.validate()
    lifetime = opts.get("grad_lifetime")
    if lifetime not in (None, "step") and cfg.parallel.policy != "ratrain":
        raise UserError(f"--grad-lifetime {lifetime} needs --policy ratrain (the baseline "
                        f"accumulates the step's gradient)")
    hw.rate(cfg.train.dtype)
    if cfg.parallel.host_grad_dtype != "float32" and not has_host_tier(hw):
        raise UserError(f"--host-grad-dtype {cfg.parallel.host_grad_dtype} holds host-homed "
                        f"state's gradients; profile {hw.name} has no host tier apart from its "
                        f"devices' memory (a CPU profile), so no plan on it keeps state there")
    if devices is None:
        devices = hw.device_count or (2 if hw.device.cores else 8)
    if hw.device_count and devices > hw.device_count:
        raise UserError(f"--devices {devices}: profile {hw.name} has {hw.device_count} devices "
                        f"in its groups")
    hw = with_node_memory(hw, devices)
    n_units = cfg.model.n_units
    if opts.get("pp") and cfg.parallel.pp > n_units:  # first: more devices or batch can't help
        raise UserError(f"--pp {cfg.parallel.pp} is more stages than the model has units "
                        f"({n_units}: {model_units(cfg.model.n_layers)}); lower --pp to at "
                        f"most {n_units}")
    if opts.get("pp") and cfg.parallel.pp > devices:  # (said as a full host tier before)
        raise UserError(f"--pp {cfg.parallel.pp} needs a device a stage, {cfg.parallel.pp} at "
                        f"least; the search has {devices} (--devices)")
    _refuse_too_few_micro_batches(cfg, opts)
    if top < 1:
        raise UserError(f"--top must be at least 1, got {top}")
    if not 0 <= margin < 1:
        raise UserError(f"--memory-margin must be in [0, 1), got {margin}")
    if time_limit <= 0:
        raise UserError(f"--time-limit must be positive, got {time_limit}")
    t = cfg.train
    return search.PlanRequest(
        model=cfg.model, profile=hw, devices=devices, global_batch=t.global_batch,
        seq_len=t.seq_len, dtype=t.dtype,
        budget=parse_bytes(memory_budget) if memory_budget else None, margin=margin,
        policy=cfg.parallel.policy, clip=t.grad_clip > 0 or t.dtype == "float16", top=top,
        micro_batch_sizes=(t.micro_batch_size,) if opts.get("micro_batch_size") is not None
        else None,
        pipeline_degrees=(cfg.parallel.pp,) if opts.get("pp") else None,
        grad_lifetimes=(lifetime,) if lifetime else None, time_limit_s=time_limit,
        threads_per_rank=cfg.parallel.threads_per_rank,
        host_grad_dtype=cfg.parallel.host_grad_dtype, steps=t.steps)


def _refuse_too_few_micro_batches(cfg: RunConfig, opts: dict) -> None:
    """A pinned --pp deeper than the micro-batches the global batch can give (a stage needs one
    of its own), refused as such: every layout's refusal said to "lower micro_batch_size/dp",
    which at --global-batch 1 are 1 already."""
    pp, batch = cfg.parallel.pp, cfg.train.global_batch
    size = cfg.train.micro_batch_size if opts.get("micro_batch_size") is not None else 1
    if opts.get("pp") and pp > batch // size:
        of = f" of {size} sequences" if size > 1 else " of one sequence"
        raise UserError(f"--pp {pp} needs at least {pp} micro-batches a step (one a stage); "
                        f"--global-batch {batch} gives at most {batch // size} (micro-batches{of}): "
                        f"raise --global-batch to {pp * size} or lower --pp")


def best_plans(request):
    """The search's result, with at least one plan (checked); a UserError that says why
    where there is none: every layout refused, the time limit, or nothing fits (the
    account of what comes closest)."""
    from ratrain.planner import account, search

    with SearchProgress() as progress:
        found = search.search(request, progress=progress)
    if not found.best and not found.layouts:
        refused: list[str] = []
        search.layouts(request, refused)  # training would refuse every one: say why
        if refused:
            raise UserError(f"no layout on {request.devices} devices can run: {refused[0]}")
    if not found.best and not found.complete:  # not "nothing fits": the search did not finish
        raise UserError(f"the search found no plan that fits in {found.seconds:.1f} s, "
                        f"{search.FIRST_PLAN_GRACE}x its --time-limit {request.time_limit_s:g} s "
                        f"({found.simulated} simulated; {found.layouts} layouts); raise "
                        f"--time-limit")
    if not found.best:
        raise UserError(account.account(request))
    search.check(found.best[0])
    if request.budget_above_memory:
        click.echo(f"note: the plans are held to the device's memory: "
                   f"{request.budget_above_memory}", err=True)
    return found


class SearchProgress:
    """A line on stderr while a search runs past two seconds (a terminal's only): layouts
    tried, plans simulated. llama2-70b on 64 GPUs searched 45 s in silence."""

    def __init__(self):
        from tqdm import tqdm

        self.bar = tqdm(desc="searching", unit=" layouts", disable=None, delay=2, leave=False,
                        dynamic_ncols=True)
        self.fit = self.over = 0

    def __call__(self, event: str) -> None:
        if event == "layout":
            self.bar.update(1)
            return
        self.fit += event == "plan"
        self.over += event == "over"
        self.bar.set_postfix_str(f"plans simulated: {self.fit + self.over}, fitting: {self.fit}",
                                 refresh=False)

    def __enter__(self) -> SearchProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def unbounded_host_note(request, plans: list) -> str | None:
    """A line where the profile records no host memory for a host tier that plans use: their
    host bytes were not bounded (a GPU profile from `ratrain profile` had none until
    2026-11-27); None otherwise. `plans`: (name, Candidate) pairs."""
    from ratrain.byte_units import decimal_bytes

    held = []
    for name, c in plans:
        unbounded = [h for h, g in zip(c.host_bytes, c.layout.groups)
                     if request.device(g).host_link is not None
                     and request.device(g).host_memory_bytes is None]
        if unbounded and max(unbounded) > 0:
            held.append(f"{name} holds {decimal_bytes(max(unbounded))} of it a device")
    if not held:
        return None
    return (f"note: profile {request.profile.name} records no host memory "
            f"(device.host_memory_bytes), so the plans' host memory was not bounded: "
            + ", ".join(held) + "; `ratrain train` refuses a run whose host memory does not "
            "fit the machine")
