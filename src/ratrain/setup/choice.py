"""`--schedule auto` (the default): the schedule and weight-gradient placement a run takes when
the user names neither, chosen by simulating the run's own plan under each candidate the
planner would weigh for its layout (planner.layouts.schedules) on a hardware profile, and taking
the fastest whose every stage's memory estimate fits the device (its device peak with the
process's own overhead, as `ratrain simulate`'s table and the planner judge it; until
2026-12-02 the device peak alone, so a choice said "fits" above a table that said NO), and
the profile's host tier per device, where it has one, and whose ranks' bytes fit
the machine the run starts on (its host memory: the state kept there, offloaded activations;
on a CPU the whole run's).

Candidates predicted within the margin below of the fastest cannot be told apart (the
simulator's error out of sample is several per cent, docs/benchmarks.md): of those the one
that holds least is taken. So 1F1B stays unless a split schedule is predicted clearly faster,
and of two split placements predicted alike the one that keeps fewer micro-batches for BW
wins (ZB-H1 in the bubble rather than grouped, which holds every micro-batch). A single
process has one candidate (nothing waits for its input gradients and there is no sync to
hide), nor has the `baseline` policy (GPU-style 1F1B, what ratrain is measured
against), so nothing is simulated there.

Where the plan has views (they differ from the masters) and the run names no
--micro-batch-group, 1F1B's unit-major groups (schedule/unit_major.py) are candidates too:
each divisor g > 1 of the micro-batches. They hold g times the activations in flight, so the
margin keeps 1F1B unless fewer views and folds are predicted clearly faster.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ratrain.byte_units import decimal_bytes
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.schedule.weight_grads import schedules

AUTO = "auto"
MARGIN = 0.03  # candidates predicted within this of the fastest count as alike
CPU_PROFILE = "cpu-local"
GPU_PROFILES = {"H100": "h100-80g-ib", "H200": "h100-80g-ib", "A100": "a100-40g-10gbe"}


@dataclass
class Candidate:
    schedule: str
    weight_grad: str | None
    step_s: float
    peak_bytes: float  # the largest stage's device peak with the process's own overhead
    micro_batch_group: int = 1
    refused_here: str | None = None  # why its bytes cannot fit the machine the run starts on
    host_peak_bytes: int = 0  # the largest stage's peak in the host tier

    @property
    def label(self) -> str:
        return _label(self.schedule, self.weight_grad, self.micro_batch_group)


@dataclass
class Choice:
    schedule: str
    weight_grad: str | None
    why: str  # one line for the start of the run
    candidates: list[Candidate]
    micro_batch_group: int = 1


def default_profile(device_name: str | None) -> str:
    """The preset a choice is simulated on when the run names no --profile: the CPU one, or
    the GPU preset of the device's family (the H100 one for an unknown GPU)."""
    if device_name is None:
        return CPU_PROFILE
    upper = device_name.upper()
    return next((p for key, p in GPU_PROFILES.items() if key in upper), GPU_PROFILES["H100"])


def choose(cfg: RunConfig, build_plan, profile, budget: float | None = None,
           views: bool = False, refusal_here=None, threads_per_rank: int = 1) -> Choice:
    """The schedule for cfg (whose schedule is `auto`; a --weight-grad given keeps only the
    split candidates with that placement). `build_plan(cfg)` makes a candidate's plan (a
    UserError drops it); `profile` a HardwareProfile; `budget` the bytes a stage may hold, its
    device peak with the process's own overhead (default: the profile's device memory);
    `views`: the plan has views, so micro-batch groups are weighed where the run names none;
    `refusal_here(cfg, plan)`: why a candidate's bytes cannot fit the machine the run starts
    on, its host memory included (memory_fit.machine_refusal), or None; `threads_per_rank`:
    each rank's CPU threads."""
    from ratrain.sim.simulator import simulate

    p, t = cfg.parallel, cfg.train
    budget = budget or profile.device.memory_bytes
    # a host tier over its bytes fails the run as surely as the device (`simulate`'s NO: host)
    host = profile.device.host_memory_bytes if profile.device.host_link else None
    options = [(s, w) for s, w in schedules(p.pp, p.dp)
               if p.weight_grad is None or w == p.weight_grad]
    if p.policy == "baseline" and p.weight_grad is None:  # the GPU-style 1F1B it stands for
        options = [("1f1b", None)]
    if p.weight_grad is not None and not options:  # pp = dp = 1: grouped has nothing to group
        options = [("zbh1", p.weight_grad)]
    options = [(s, w, 1) for s, w in options]
    if p.micro_batch_group is not None:
        options = [(s, w, p.micro_batch_group) for s, w, _ in options
                   if s == "1f1b" or p.micro_batch_group == 1]
        if not options:  # (it said "no schedule can run this layout: " and no reason)
            raise UserError(f"--micro-batch-group {p.micro_batch_group} runs 1F1B over groups, "
                            f"and --weight-grad {p.weight_grad} places the weight gradients of "
                            "a split schedule (zbh1), which has its own order: give one of them")
    elif p.policy == "ratrain" and p.weight_grad is None and views:
        options += [("1f1b", None, g) for g in range(2, cfg.n_micro + 1) if cfg.n_micro % g == 0]
    if len(options) == 1:
        s, w, g = options[0]
        return Choice(s, w, f"schedule {_label(s, w, g)} (the only candidate)", [], g)
    found, refused = [], {}  # why a candidate cannot run -> the candidates it refused
    for s, w, g in options:
        trial = copy.deepcopy(cfg)
        trial.parallel.schedule, trial.parallel.weight_grad = s, w
        trial.parallel.micro_batch_group = g
        try:
            plan = build_plan(trial)
        except UserError as e:
            refused.setdefault(str(e), []).append(_label(s, w, g))
            continue
        result = simulate(plan, cfg.model, profile, micro_batch_size=t.micro_batch_size,
                          seq_len=t.seq_len, dtype=t.dtype, threads_per_rank=threads_per_rank)
        peak = max(r.peak_with_process(profile.device) for r in result.ranks)
        found.append(Candidate(s, w, result.step_time, peak,
                               g, refusal_here(trial, plan) if refusal_here else None,
                               max(r.host_peak for r in result.ranks)))
    if not found:
        raise UserError("no schedule can run this layout: " + _refusals(refused))
    # where no schedule fits the host tier (its state, the same under each), it does not choose
    fits = ([c for c in found if _fits(c, budget, host)] or
            [c for c in found if _fits(c, budget, None)] or
            [min(found, key=lambda c: (c.refused_here is not None, c.peak_bytes))])
    fastest = min(c.step_s for c in fits)
    alike = [c for c in fits if c.step_s * (1 - MARGIN) < fastest]
    best = min(alike, key=lambda c: (c.peak_bytes, c.step_s))
    return Choice(best.schedule, best.weight_grad, _why(best, found, budget, host, profile.name),
                  found, best.micro_batch_group)


def _label(schedule: str, weight_grad: str | None, group: int = 1) -> str:
    return (schedule + (f" {weight_grad}" if weight_grad else "")
            + (f" in groups of {group}" if group > 1 else ""))


def _refusals(refused: dict[str, list[str]]) -> str:
    """Why the candidates could not run: a reason they share said once (a layout every
    schedule refuses was said once per split placement)."""
    if len(refused) == 1:
        return next(iter(refused))
    return "; ".join(f"{', '.join(labels)}: {why}" for why, labels in refused.items())


def _fits(c: Candidate, budget: float, host: float | None) -> bool:
    return (c.peak_bytes <= budget and c.refused_here is None
            and (host is None or c.host_peak_bytes <= host))


def _why(best: Candidate, found: list[Candidate], budget: float, host: float | None,
         profile: str) -> str:
    others = ", ".join(f"{c.label} {c.step_s:.3g} s" + ("" if _fits(c, budget, host) else
                                                        " (does not fit)")
                       for c in found if c is not best)
    others = others or "the only candidate that can run here"
    fit = ("fits" if _fits(best, budget, host) else
           "fits the device but not the host tier, as no candidate does"
           if _fits(best, budget, None) else "the least memory of none that fit")
    held = (f" and {decimal_bytes(best.host_peak_bytes)} of a {decimal_bytes(host)} host tier"
            if host is not None else "")
    return (f"schedule {best.label}: simulated {best.step_s:.3g} s/step on {profile} "
            f"({others}); its largest stage holds {decimal_bytes(best.peak_bytes)} (with the "
            f"process's own) of a {decimal_bytes(budget)} budget{held}, {fit}. --schedule "
            "overrides")
