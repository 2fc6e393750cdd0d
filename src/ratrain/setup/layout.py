"""The pipeline plan a run config asks for, without touching a device: what `ratrain train`
runs, `ratrain plan` shows and `ratrain simulate` predicts; and the plan a plan file holds,
checked against the run. Both pass the one rule of what can run (runnable.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.errors import UserError
from ratrain.setup.rule import check_runnable, has_views
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.plan import PipelinePlan, build_plan, weight_grad_of


def _clip(cfg: RunConfig) -> bool:
    # float16 needs the global norm to see an overflow anywhere, clipping or not
    return cfg.train.grad_clip > 0 or cfg.train.dtype == "float16"


def _view_window(cfg: RunConfig, host_is_separate: bool) -> int | None:
    p = cfg.parallel
    views = has_views(cfg.train.dtype, p.state_home, host_is_separate, p.shard_state)
    return p.view_window if views else None


def check_config(cfg: RunConfig, host_is_separate: bool, world: int | None = None,
                 host_collectives: bool | None = None) -> None:
    """The rule of what can run (runnable.refusal), for the plan cfg's flags ask for on a
    device whose host is apart (`host_is_separate`) or not; `world`: processes already
    started (torchrun); `host_collectives`: a profile's word on whether its collectives reduce
    host buffers (None: runnable.refusal's default).
    A UserError says why not."""
    p, t = cfg.parallel, cfg.train
    check_runnable(n_layers=cfg.model.n_layers, pp=p.pp, dp=p.dp, global_batch=t.global_batch,
                   micro_batch_size=t.micro_batch_size, schedule=p.schedule, policy=p.policy,
                   dtype=t.dtype, clip=_clip(cfg), state_home=p.state_home,
                   shard_state=p.shard_state, view_window=_view_window(cfg, host_is_separate),
                   grad_lifetime=p.grad_lifetime, shard_group=p.shard_group,
                   tie_embeddings=cfg.model.tie_embeddings, host_is_separate=host_is_separate,
                   host_collectives=host_collectives,
                   world=world)


def check_plan(plan: PipelinePlan, cfg: RunConfig, host_is_separate: bool,
               world: int | None = None, host_collectives: bool | None = None) -> None:
    """The same rule for a plan read from a file: its own layout and lifecycle, cfg's batch
    (load_plan has checked that the two agree), dtype and model."""
    t = cfg.train
    check_runnable(n_layers=plan.n_layers, pp=plan.pp, dp=plan.dp, global_batch=t.global_batch,
                   micro_batch_size=t.micro_batch_size, schedule=plan.schedule,
                   policy=plan.policy, dtype=t.dtype, clip=plan.clip,
                   state_home=plan.state_home, shard_state=plan.shard_state,
                   view_window=plan.view_window, grad_lifetime=plan.grad_lifetime,
                   shard_group=plan.shard_group, tie_embeddings=cfg.model.tie_embeddings,
                   host_is_separate=host_is_separate,
                   host_collectives=host_collectives,
                   world=world)


def resolve_schedule(cfg: RunConfig, host_is_separate: bool,
                     host_collectives: bool | None = None, profile=None,
                     budget: float | None = None, device_name: str | None = None):
    """Where cfg's schedule is `auto`, choose it (schedule_choice.py) and write the choice
    into cfg, so that the run records and every rank runs what was chosen. `profile`: a
    HardwareProfile to simulate on (default: the run's --profile, else the preset of the
    device, `device_name` on a GPU); `budget`: bytes a stage may hold (default: the
    profile's). Returns the Choice, or None where the schedule was given."""
    if cfg.parallel.schedule != AUTO_SCHEDULE:
        return None
    from ratrain.setup.choice import choose, default_profile
    from ratrain.sim.profile import load_profile

    if profile is None:
        profile = load_profile(cfg.train.profile or default_profile(
            (device_name or "GPU") if host_is_separate else None))
    choice = choose(cfg, lambda c: plan_for_config(c, host_is_separate, host_collectives),
                    profile, budget)
    cfg.parallel.schedule, cfg.parallel.weight_grad = choice.schedule, choice.weight_grad
    return choice


def plan_for_config(cfg: RunConfig, host_is_separate: bool,
                    host_collectives: bool | None = None) -> PipelinePlan:
    """The plan of cfg's layout and lifecycle flags (a request that cannot run, or that the
    schedule can't satisfy, is a UserError), with views where they differ from the masters
    (has_views). A schedule `auto` is chosen first (resolve_schedule), into cfg."""
    resolve_schedule(cfg, host_is_separate, host_collectives)
    check_config(cfg, host_is_separate, host_collectives=host_collectives)
    p = cfg.parallel
    policies = p.activation_per_stage
    try:
        return build_plan(
            cfg.model.n_layers, p.pp, p.dp, cfg.n_micro, schedule=p.schedule, policy=p.policy,
            activation=policies[0] if len(policies) == 1 else policies,
            units_per_stage=p.partition, clip=_clip(cfg), rank_order=p.rank_order,
            view_window=_view_window(cfg, host_is_separate), state_home=p.state_home,
            shard_state=p.shard_state, weight_grad=p.weight_grad, grad_lifetime=p.grad_lifetime,
            shard_group=p.shard_group)
    except ScheduleError as e:
        raise UserError(str(e)) from None
