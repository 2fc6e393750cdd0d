"""Whether a run fits the memory of the machine it starts on, before anything is allocated.

Each stage's bytes are those the simulator's ledger predicts for the plan (sim/stage_memory.py:
the account the executor keeps of real tensors, kind by kind), summed over the ranks that share
this machine's memory. A run that cannot fit is refused in one line that says what holds the
bytes and what lowers them; without it, a 7B run on a 23 GB machine built its model for minutes
and grew until the kernel killed it (2026-11-27). The ledger leaves out torch itself, the
allocator's slack and autograd's temporaries, so a run it passes may still not fit; one it
refuses cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.byte_units import decimal_bytes
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.plan import PipelinePlan

SMALL_KIND = 50e6  # bytes: a kind that holds less is not named, not to bury the large ones


@dataclass(frozen=True)
class StageBytes:
    """One rank of a stage, at its predicted peaks: the whole (`total`, where the host is the
    device), the compute device's share and the host tier's (a GPU's host memory); by kind, at
    the whole's peak and at the device's."""

    total: int
    device: int
    host: int
    at_peak: dict[str, int]
    at_device_peak: dict[str, int]


def stage_bytes(cfg: RunConfig, plan: PipelinePlan, profile) -> list[StageBytes]:
    """Each stage's predicted peaks on `profile` (a HardwareProfile: whether the host tier is
    apart from the device), as the ledger would count them in one training step."""
    from ratrain.sim.cost_model import StageCosts
    from ratrain.sim.placement import stage_setups
    from ratrain.sim.stage_memory import StageMemory

    t = cfg.train
    setups = stage_setups(plan, cfg.model, profile, micro_batch_size=t.micro_batch_size,
                          seq_len=t.seq_len, dtype=t.dtype)
    out = []
    for s, setup in enumerate(setups):
        costs = StageCosts(setup)
        peaks = [StageMemory(costs, program, plan.view_window == 0)
                 for program in _programs_of_each_step(plan, s)]
        out.append(StageBytes(max(m.peak for m in peaks), max(m.device_peak for m in peaks),
                              max(m.host_peak for m in peaks),
                              dict(max(peaks, key=lambda m: m.peak).at_peak),
                              dict(max(peaks, key=lambda m: m.device_peak).at_device_peak)))
    return out


def _programs_of_each_step(plan: PipelinePlan, stage: int) -> list:
    """Stage `stage`'s programs over a step of each kind: the one program, or under an outer
    sync the inner step's and each fragment's synced step's (which also hold the deltas in
    flight)."""
    from ratrain.schedule.outer_sync import parse_sync, step_programs

    outer = parse_sync(plan.sync)
    synced = outer.synced_steps() if outer else []
    return [plan.programs[stage], *(step_programs(plan, step)[stage] for step in synced)]


def check_memory_fits(cfg: RunConfig, plan: PipelinePlan, machine) -> None:
    """Refuse (UserError) a run whose predicted bytes cannot fit `machine` (setup.Machine)."""
    reason = machine_refusal(cfg, plan, machine)
    if reason:
        raise UserError(reason)


def machine_refusal(cfg: RunConfig, plan: PipelinePlan, machine) -> str | None:
    """Why the run's predicted bytes cannot fit `machine` (setup.Machine), or None: predicted
    on the preset of the machine's device, whatever --profile the schedule was chosen on,
    since what matters here is whether the host memory is the device's. Nothing to weigh
    where the machine's memory is not known."""
    if machine.host_available_bytes is None and not machine.memory_bytes:
        return None
    profile = machine.preset_profile(cfg.train.dtype)
    return memory_refusal(
        cfg, plan, stage_bytes(cfg, plan, profile),
        local_ranks=list(machine.local_ranks or range(plan.pp * plan.dp)),
        host_available=machine.host_available_bytes, device_bytes=machine.memory_bytes,
        host_is_separate=machine.host_is_separate)


def memory_refusal(cfg: RunConfig, plan: PipelinePlan, stages: list[StageBytes], *,
                   local_ranks: list[int], host_available: int | None,
                   device_bytes: int | None, host_is_separate: bool) -> str | None:
    """Why the run's predicted bytes (`stages`) cannot fit, or None. `local_ranks`: the global
    ranks on this machine, which share its `host_available` bytes (None: not known); on a GPU
    (`host_is_separate`) each rank also has a device of `device_bytes`."""
    grid = RankGrid(plan.pp, plan.dp, plan.rank_order)
    here = [stages[grid.coords(r)[0]] for r in local_ranks]
    if host_is_separate and device_bytes:
        worst = max(range(len(stages)), key=lambda s: stages[s].device)
        need = stages[worst].device
        if need > device_bytes:
            return (f"this run does not fit the GPU: stage {worst} would hold about "
                    f"{decimal_bytes(need)} on it ({_kinds(stages[worst].at_device_peak)}), the "
                    f"GPU has {decimal_bytes(device_bytes)}; keep the state in host memory "
                    "(--state-home host, --view-window 1), recompute activations (--activation "
                    "recompute), or let `ratrain plan --memory-budget` find a plan that fits")
    if host_available is None:
        return None
    need = sum(s.host if host_is_separate else s.total for s in here)
    if need <= host_available:
        return None
    what = "host memory" if host_is_separate else "memory"
    peak = max(here, key=lambda s: s.host if host_is_separate else s.total)
    ranks = ("its rank here would hold" if len(here) == 1 else
             f"its {len(here)} ranks here would hold")
    largest = "" if len(here) == 1 else "the largest rank: "
    return (f"this run does not fit this machine's {what}: {ranks} about {decimal_bytes(need)} "
            f"({largest}{_kinds(peak.at_peak)}), {decimal_bytes(host_available)} is available; "
            f"{_hint(cfg, plan, peak.at_peak)}")


def _kinds(at_peak: dict[str, int]) -> str:
    """The kinds that hold SMALL_KIND bytes or more, largest first."""
    held = sorted(((b, k) for k, b in at_peak.items() if b >= SMALL_KIND), reverse=True)
    return (", ".join(f"{k} {decimal_bytes(b)}" for b, k in held)
            or f"each kind under {decimal_bytes(SMALL_KIND)}")


def _hint(cfg: RunConfig, plan: PipelinePlan, at_peak: dict[str, int]) -> str:
    from ratrain.sim.stage_memory import STATE_KINDS

    state = sum(at_peak.get(k, 0) for k in STATE_KINDS)
    if at_peak.get("activations", 0) > state:
        return ("recompute activations (--activation recompute) or use a smaller "
                "--micro-batch-size or --seq-len")
    ways = []
    if plan.dp > 1 and not plan.shard_state:
        ways.append(f"shard the training state over the {plan.dp} replicas (--shard-state)")
    ways.append("spread the model over more machines (torchrun with --pp or --dp)")
    ways.append("or train a smaller model")
    return (f"the training state ({cfg.model.name}: 16 bytes a parameter, masters, gradients "
            f"and AdamW) is most of it; " + ", ".join(ways))
