"""What `ratrain plan --out` writes: the plan, the settings it was made for, and what the
simulator predicts for it; and the search's summary for `--json`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.planner.candidate import Candidate
from ratrain.planner.search import SearchResult


def run_settings(plan, cfg: RunConfig, micro_batch_size: int | None = None) -> dict:
    """The model and the training settings a plan (a PipelinePlan) is for, resolved: `ratrain
    train --plan` takes them where no flag says otherwise. A searched plan's micro-batch size
    is its layout's (`micro_batch_size`); a plan the flags describe (`ratrain plan --out`
    without a search) has the config's: until 2026-12-03 that file had no settings, and `train
    --plan` trained the preset tiny, refusing its n_micro without naming a flag. init_from: the
    Hugging Face directory whose weights the run starts from, absolute (None: random weights);
    until 2026-12-03 the plan had none, and `train --plan` trained its model from random ones."""
    init_from = cfg.train.init_from and str(Path(cfg.train.init_from).resolve())
    return {
        "model": dataclasses.asdict(cfg.model),
        "train": {"seq_len": cfg.train.seq_len, "global_batch": cfg.train.global_batch,
                  "micro_batch_size": (cfg.train.micro_batch_size if micro_batch_size is None
                                       else micro_batch_size),
                  "dtype": cfg.train.dtype, "init_from": init_from or None},
        "parallel": {"pp": plan.pp, "dp": plan.dp, "policy": plan.policy,
                     "rank_order": plan.rank_order, "state_home": plan.state_home,
                     "view_window": plan.view_window or 0, "shard_state": plan.shard_state,
                     "grad_lifetime": plan.grad_lifetime, "shard_group": plan.shard_group,
                     "schedule": plan.schedule, "weight_grad": plan.weight_grad,
                     "micro_batch_group": plan.micro_batch_group,
                     "partition": [len(units) for units in plan.stage_units],
                     # --threads, where given: what the prediction ran on (until 2026-12-04
                     # `simulate`/`train --plan` ran the default threads, its speed unreproduced)
                     **({"threads_per_rank": cfg.parallel.threads_per_rank}
                        if cfg.parallel.threads_per_rank is not None else {})},
    }


def made_from_preset(cfg: RunConfig) -> dict:
    """The plan file's "model_preset": the preset the run's model is, field for field (none
    for a model of its own, which may bear any name: a config file's "small" of 2 layers).
    `train`/`simulate --plan` hold the plan's model to it, so that a name edited alone is
    refused (a plan renamed llama2-7b trained tiny under that name)."""
    from ratrain.models.presets import PRESETS

    preset = PRESETS.get(cfg.model.name)
    return {"model_preset": cfg.model.name} if preset == cfg.model else {}


def prediction(candidate: Candidate, request, profile_file: str | None = None) -> dict:
    """What the simulator predicts for the candidate on the request's profile. `profile_file`:
    the profile's YAML, resolved (None: a preset, which loads by name), which `simulate
    --plan`, `report` and `train --plan`'s note load the profile from (a measured profile's
    name is no preset's)."""
    r = candidate.result
    return {"profile": request.profile.name,
            **({"profile_file": profile_file} if profile_file else {}),
            "step_time_s": r.step_time,
            "tokens_per_s": r.tokens_per_s, "bubble": r.bubble,
            "threads_per_rank": request.threads_of(candidate.layout),
            "budget_bytes": request.budget_bytes, "margin": request.margin,
            # a device's host tier as the plan was bounded by (None: not bounded)
            "host_memory_bytes": request.device().host_memory_bytes,
            "stage_peak_bytes": candidate.stage_bytes, "stage_host_peak_bytes": candidate.host_bytes,
            # what the executor's ledger will hold at most (stage_peak_bytes adds the compute's
            # working bytes and the process's overhead)
            "stage_ledger_peak_bytes": [rank.peak for rank in r.ranks],
            "stage_choices": candidate.choices(request.model.n_layers + 2)}


def to_dict(candidate: Candidate, cfg: RunConfig, request=None,
            profile_file: str | None = None) -> dict:
    """A searched plan's file (`profile_file`: prediction's)."""
    plan = candidate.plan.to_dict()
    plan["run"] = run_settings(candidate.plan, cfg, candidate.layout.micro_batch_size)
    plan.update(made_from_preset(cfg))
    if request is not None:
        plan["prediction"] = prediction(candidate, request, profile_file)
    return plan


def candidate_summary(c: Candidate, request) -> dict:
    """One plan of the search (or the closest of a search that found none), as plain data."""
    return {"pp": c.layout.pp, "dp": c.layout.dp,
            "micro_batch_size": c.layout.micro_batch_size, "n_micro": c.layout.n_micro,
            "rank_order": c.layout.rank_order, "state_home": c.layout.lifecycle.state_home,
            "view_window": c.layout.lifecycle.view_window,
            "shard_state": c.layout.lifecycle.shard_state,
            "grad_lifetime": c.layout.lifecycle.grad_lifetime,
            "shard_group": c.layout.lifecycle.shard_group,
            "schedule": c.layout.schedule, "weight_grad": c.layout.weight_grad,
            "micro_batch_group": c.layout.lifecycle.micro_batch_group,
            "partition": [b - a for a, b, _ in c.partition],
            "device_units": list(c.device_units),
            "host_grad_dtype": c.layout.lifecycle.host_grad_dtype,
            **prediction(c, request)}


def summary(found: SearchResult) -> dict:
    r = found.request
    return {
        "model": r.model.name, "profile": r.profile.name, "devices": r.devices,
        "global_batch": r.global_batch, "seq_len": r.seq_len, "dtype": r.dtype,
        "policy": r.policy, "budget_bytes": r.budget_bytes, "margin": r.margin,
        "layouts": found.layouts, "simulated": found.simulated, "seconds": found.seconds,
        "complete": found.complete, "late": found.late,
        "plans": [candidate_summary(c, r) for c in found.best],
    }
