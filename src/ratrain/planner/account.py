"""When no plan fits: the closest plan, where and by how much it overfills, and what would
make a plan fit."""

from __future__ import annotations

import dataclasses
import math

from ratrain.byte_units import decimal_bytes
from ratrain.counts import counted
from ratrain.planner.bounds import lower_bound
from ratrain.planner.candidate import Candidate, evaluate
from ratrain.planner.layouts import Layout, PlanRequest
from ratrain.planner.partition import least_excess
from ratrain.planner.unit_tables import UnitTables
from ratrain.planner.wording import a_device, memory_is_this_machines, share_of_budget
from ratrain.planner.what_fits import devices_hint, fits_with, pinned_hints, smallest_layouts
from ratrain.planner.lifecycle import Lifecycle
from ratrain.planner.unit_table import UnitTable
from ratrain.sim import unit_costs as uc

GROUPS = {"states": ("masters", "gradients", "optimizer", "views"),
          "activations": ("activations",), "offloaded": ("offloaded",), "buffers": ("buffers",),
          "compute's working bytes": ("working",)}


def budget_to_hold(held: float, margin: float) -> float:
    """The budget, as decimal_bytes prints it (rounded up, not to nearest), whose limit after
    `margin` holds `held` bytes: a budget rounded down to print would not."""
    need = held / (1.0 - margin)
    scale = next((s for s in (1e12, 1e9, 1e6) if need >= s), 1e3)
    step = scale / (100 if scale > 1e3 else 10)
    return math.ceil(need / step) * step


def _least(request: PlanRequest) -> tuple[float, Layout, list] | None:
    """Over the layouts that hold the least, the partition that overfills its devices the
    least by the estimate: (that excess in bytes, the layout, the partition). A layout that
    cannot beat the best so far is left after one greedy pass."""
    tables = UnitTables(request)
    best = None
    for layout in smallest_layouts(request):
        found = least_excess(tables(layout), layout.activation,
                             below=None if best is None else best[0])
        if found and (best is None or found[0] < best[0]):
            best = (found[0], layout, found[1])
    return best


def closest(request: PlanRequest) -> tuple[Candidate, float] | None:
    """The plan whose largest stage is smallest, simulated, and the bytes by which the search's
    estimate says it overfills its worst stage (the search admits a plan by that estimate, so
    that, not the simulation alone, says what budget would let it in)."""
    best = _least(request)
    if best is None:
        return None
    excess, layout, part = best
    candidate = Candidate(layout, part, lower_bound([e for _, _, e in part], layout.n_micro))
    return evaluate(request, candidate), excess


def account(request: PlanRequest) -> str:
    """Why nothing fits, in a few lines: the first says what was asked."""
    r, dev = request, request.profile.device
    above = f"; {r.budget_above_memory}" if r.budget_above_memory else ""
    head = (f"no plan fits {decimal_bytes(r.budget_bytes)} per device ({decimal_bytes(r.limit)} "
            f"after the {r.margin:.0%} margin{above}) for {r.model.name} on "
            f"{counted(r.devices, f'{r.profile.name} device')}{_whose_memory(r.profile)}, "
            f"global batch {r.global_batch} x {r.seq_len} tokens, "
            f"{r.dtype}, policy {r.policy}")
    found = closest(request)
    if found is None:
        host = dev.host_memory_bytes
        return (head + f"\n  even one unit per stage overfills the host tier "
                f"({decimal_bytes(host or 0)} per device)")
    c, estimated_excess = found
    lines = [head]
    groups = c.layout.groups
    worst = max(range(len(c.stage_bytes)), key=lambda s: c.stage_bytes[s] - r.limit_of(groups[s]))
    rank = c.result.ranks[worst]
    held = rank.at_device_peak  # what the budget limits: the device's bytes at their peak
    by_kind = ", ".join(f"{name} {decimal_bytes(sum(held.get(k, 0) for k in kinds))}"
                        for name, kinds in GROUPS.items() if sum(held.get(k, 0) for k in kinds))
    L = c.layout
    lines.append(
        f"  closest: pp={L.pp} dp={L.dp}, micro-batch {L.micro_batch_size}, "
        f"{'/'.join(sorted(set(c.choices(r.model.n_layers + 2))))}, state on the "
        f"{L.lifecycle.state_home}{_on_device(c)}{_sharded(L.lifecycle)}: "
        f"stage {worst} needs {decimal_bytes(c.stage_bytes[worst])}, "
        f"{_over(c.stage_bytes[worst] - r.limit_of(groups[worst]), estimated_excess)} ({by_kind}"
        + (f", process beyond the ledger {decimal_bytes(c.stage_bytes[worst] - rank.device_peak)}"
           if c.stage_bytes[worst] > rank.device_peak else "")
        + ")")
    over_host = [s for s, g in enumerate(groups) if c.host_bytes[s] > r.host_limit_of(g)]
    if over_host:
        s = over_host[0]
        lines.append(f"  its host tier holds {decimal_bytes(c.host_bytes[s])} for stage {s}; the "
                     f"profile allows {decimal_bytes(r.host_limit_of(groups[s]))} per device after "
                     f"the margin")
    lines.extend("  " + hint for hint in _hints(request, c, worst, estimated_excess))
    return "\n".join(lines)


def _whose_memory(profile) -> str:
    """Said where the devices' memory is this machine's, not the profile's (no --profile)."""
    return " with this machine's memory" if memory_is_this_machines(profile) else ""


def _over(simulated: float, estimated: float) -> str:
    """How far the closest plan's worst stage is over its limit: by its simulation, or, where
    that fits, by the estimate the search admits plans by (a little above the simulation)."""
    if simulated > 0:
        return f"{decimal_bytes(simulated)} over"
    if estimated > 0:
        return (f"within the limit as simulated, but {decimal_bytes(estimated)} over by the "
                f"search's estimate, which every plan must fit")
    return "within the device's limit"


def _on_device(c: Candidate) -> str:
    """Host-homed state's units kept on the device (planner/device_units.py)."""
    n = len(c.device_units)
    return f" ({n} unit{'s' if n > 1 else ''} on the device)" if n else ""


def _sharded(life: Lifecycle) -> str:
    if not life.shard_state:
        return ""
    return (", sharded" + (f" within groups of {life.shard_group} replicas"
                           if life.shard_group else "")
            + (f" (gradient lifetime {life.grad_lifetime})" if life.grad_lifetime != "step"
               else ""))


def _lifetime_hint(request: PlanRequest, c: Candidate, worst: int) -> str | None:
    """What the gradient lifetimes did, or would do, for the closest plan's fullest stage: the
    full-size fp32 gradients it holds at its peak (freed early already), or for the whole step
    (and whether --policy ratrain, whose lifetimes free them early, fits)."""
    r, life = request, c.layout.lifecycle
    if not life.shard_state:
        return None
    rank = c.result.ranks[worst]
    a, b, _ = c.partition[worst]
    if life.grad_lifetime != "step":
        # what the ledger held before training is the masters and the shards' gradients
        full = (rank.at_peak.get("gradients", 0) + rank.at_peak.get("masters", 0)
                - rank.held_before_training)
        how = ("each micro-batch's reduce-scattered after its backward" if
               life.grad_lifetime == "micro-batch" else "each freed once reduce-scattered")
        whole_step = _full_grads(r, c, a, b)
        text = (f"the full-size fp32 gradients are already freed early (gradient lifetime "
                f"{life.grad_lifetime}: {how}): stage {worst} holds "
                f"{decimal_bytes(max(0, full))} of them at its peak")
        if decimal_bytes(max(0, full)) == decimal_bytes(whole_step):  # as printed: no saving
            return text + ", which is all of them: its peak comes before any is freed"
        return text + f", instead of {decimal_bytes(whole_step)} for the whole step"
    full = _full_grads(r, c, a, b)
    text = (f"the full-size fp32 gradients take {decimal_bytes(full)} on stage {worst} for the "
            f"whole step")
    if r.policy == "ratrain":
        return text  # (shorter lifetimes were searched: this one was closest)
    text += ("; --policy ratrain frees each once reduce-scattered (gradient lifetimes transient, "
             "micro-batch)")
    fits = fits_with(r, policy="ratrain")
    return text + (": it fits" if fits else ", which does not fit either")


def _full_grads(request: PlanRequest, c: Candidate, a: int, b: int) -> float:
    """Bytes of units [a, b)'s full-size fp32 gradient buffers, sharded over the layout's dp
    (padded to it)."""
    over = c.layout.lifecycle.shard_group or c.layout.dp
    return sum(4 * uc.shard(request.model, u, over).padded for u in range(a, b))


def _sharded_block(request: PlanRequest, dp: int) -> float:
    """Bytes of one decoder block's state and view, sharded over `dp` replicas (resident view)."""
    r = request
    life = Lifecycle("device", 0, r.policy, shard_state=True)
    table = UnitTable(r.model, r.profile, 1, r.seq_len, r.dtype, 1, life, r.clip, dp=dp)
    return table.state[1] + table.view[1]


def _state_home_note(c: Candidate) -> str:
    """Sharded state lives on the device (layouts.lifecycles): said where the closest plan keeps
    its state on the host, so the sharding that follows is not read as that plan's."""
    if c.layout.lifecycle.state_home != "host":
        return ""
    return ("the closest plan keeps it on the host; sharding it over replicas keeps it on the "
            "device (--state-home device): ")


def _sharding_hint(request: PlanRequest) -> str:
    """What sharding a block's state over the replicas (ZeRO-style) makes of it: the least dp
    (dividing the global batch) that brings it under half the budget, and whether the devices
    allow that dp."""
    r = request
    stages = min(r.pipeline_degrees or (1,))  # a replica's stages need a micro-batch each
    degrees = [d for d in range(2, r.global_batch + 1)
               if r.global_batch % d == 0 and r.global_batch // d >= stages]
    if not degrees:
        if stages > 1:
            return (f"sharding it needs 2 or more data-parallel replicas, each with a micro-batch "
                    f"for each of the --pp {stages} stages: the global batch has "
                    f"{r.global_batch} sequences")
        return "sharding it needs 2 or more data-parallel replicas: the global batch has 1 sequence"
    for dp in degrees:
        sharded = _sharded_block(r, dp)
        if sharded <= 0.5 * r.limit:
            break
    else:
        whole = ("the view and the full-size fp32 gradient (alive from the block's backward to "
                 "its reduce-scatter, with the gradient lifetimes) stay whole"
                 if r.policy == "ratrain" else "the fp32 gradient buffer and the view stay whole")
        needs = (f" (dp={dp} needs {dp} devices, more than the {r.devices})"
                 if dp > r.devices else "")
        return (f"even sharded over dp={dp} replicas{needs} it takes {decimal_bytes(sharded)} "
                f"({share_of_budget(sharded, r.limit)}): {whole}")
    what = (f"sharded across dp={dp} data-parallel replicas (ZeRO-style) it would take "
            f"{decimal_bytes(sharded)} ({share_of_budget(sharded, r.limit)})")
    if dp > r.devices:
        return what + f": dp={dp} needs more than the {r.devices} devices"
    pinned = r.pipeline_degrees
    if pinned and dp * min(pinned) > r.devices:
        return what + (f": dp={dp} with --pp {min(pinned)} needs {dp * min(pinned)} devices, "
                       f"more than the {r.devices}")
    stages = f"--pp {'/'.join(map(str, pinned))}" if pinned else f"at most {r.devices // dp} stages"
    return what + f"; the search tried dp >= {dp} with {stages}, which did not fit"


def _budget_hint(request: PlanRequest, need: float, group: int) -> str:
    """The budget that would fit the closest plan, where the worst stage's device has that much
    memory: a budget above it is held to it, so suggesting one would repeat this account."""
    memory = request.device(group).memory_bytes
    if need <= memory:
        return f"a budget of {decimal_bytes(need)} per device would fit the closest plan"
    return (f"no budget {a_device(request.profile.name)} can give fits the closest plan: it needs "
            f"{decimal_bytes(need)}, the device has {decimal_bytes(memory)}")


def _hints(request: PlanRequest, closest_candidate: Candidate, worst: int,
           estimated_excess: float) -> list[str]:
    r = request
    hints = []
    n_units = r.model.n_layers + 2
    # the search admits the plan by its estimate and its simulation both: the larger counts
    held = max(max(closest_candidate.stage_bytes), r.limit + estimated_excess)
    hints.extend(pinned_hints(r))  # first: it is the flag the user typed that keeps them out
    hints.append(_budget_hint(r, budget_to_hold(held, r.margin),
                              closest_candidate.layout.groups[worst]))
    hints.append(devices_hint(r))
    seq = r.seq_len // 2
    while seq >= 128:
        if fits_with(r, seq_len=seq):
            hints.append(f"--seq-len {seq} would fit")
            break
        seq //= 2
    life = dataclasses.replace(closest_candidate.layout.lifecycle, shard_state=False)
    table = UnitTable(r.model, r.profile, 1, r.seq_len, r.dtype, 1, life, r.clip)
    block = table.state[1] + table.view[1] if n_units > 2 else 0
    if block > 0.5 * r.limit:
        hints.append(f"one decoder block's training state ({decimal_bytes(block)}: fp32 masters, "
                     f"gradients, AdamW moments and its view) takes "
                     f"{share_of_budget(block, r.limit)}; " + _state_home_note(closest_candidate) + _sharding_hint(r))
    host = r.profile.device.host_memory_bytes
    if host is not None and table.state[1] > r.host_limit:
        hints.append(f"state on the host would need {decimal_bytes(table.state[1])} per block; "
                     f"the profile's host tier allows {decimal_bytes(r.host_limit)} per device")
    elif host is not None:  # the whole model's state is the same bytes wherever it lives
        hints.extend(_host_state_hint(r, closest_candidate, sum(table.state)))
    lifetime = _lifetime_hint(r, closest_candidate, worst)
    if lifetime:
        hints.append(lifetime)
    if r.profile.device.host_link is not None and r.policy == "baseline":
        if fits_with(r, policy="ratrain"):
            hints.append("--policy ratrain fits: it can keep state on the host, per-stage "
                         "recompute, offload and views in a window")
    if (host is not None and r.profile.device.host_link is not None and r.policy == "ratrain"
            and r.host_grad_dtype == "float32" and fits_with(r, host_grad_dtype="bfloat16")):
        hints.append("--host-grad-dtype bfloat16 would fit (host-homed gradients in 2 bytes a "
                     "parameter, each fold rounded to bfloat16)")
    if r.dtype == "float32" and "bfloat16" in r.profile.device.compute:
        if fits_with(r, dtype="bfloat16"):
            hints.append("--dtype bfloat16 would fit (views and activations at half the size)")
    return hints


def _host_state_hint(request: PlanRequest, closest_candidate: Candidate,
                     whole: float) -> list[str]:
    """Where a host tier could not hold the whole model's state (`whole` bytes, unsharded) on
    one stage: how much it would take against the host tier's limit, beside a closest plan
    that keeps its state on the device, or that keeps its first units' there for that reason
    (a host-homed plan's device side is small, so its host tier is what refused it)."""
    r = request
    if r.profile.device.host_link is None or r.policy != "ratrain" or whole <= r.host_limit:
        return []
    units = len(closest_candidate.device_units)
    host_homed = closest_candidate.layout.lifecycle.state_home == "host"
    if host_homed and not units:
        return []
    line = (f"state on the host (--state-home host) would hold {decimal_bytes(whole)} of host "
            f"memory on one stage (16 bytes a parameter: fp32 masters, gradients and AdamW); the "
            f"profile's host tier allows {decimal_bytes(r.host_limit)} per device")
    return [line + (f", so the first {units} units keep theirs on the device" if host_homed
                    else "")]
