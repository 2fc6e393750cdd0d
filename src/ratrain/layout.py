"""The pipeline plan a run config asks for, without touching a device: what `ratrain train`
runs, `ratrain plan` shows and `ratrain simulate` predicts."""

from __future__ import annotations

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.plan import PipelinePlan, build_plan


def has_views(dtype: str, state_home: str, host_is_separate: bool,
              shard_state: bool = False) -> bool:
    """Whether compute views differ from the masters: a compute dtype other than fp32, masters
    on a host that is not the compute device's memory (`host_is_separate`: a GPU), or masters
    sharded over the replicas (the view is the gathered whole). Otherwise, as on a CPU-only
    fp32 run, views would be copies of the masters in the same memory: there are none."""
    return (dtype != "float32" or (state_home == "host" and host_is_separate)
            or shard_state)


def plan_for_config(cfg: RunConfig, host_is_separate: bool) -> PipelinePlan:
    """The plan of cfg's layout and lifecycle flags (a request the schedule can't satisfy is a
    UserError), with views where they differ from the masters (has_views)."""
    p = cfg.parallel
    views = has_views(cfg.train.dtype, p.state_home, host_is_separate, p.shard_state)
    policies = p.activation_per_stage
    try:
        return build_plan(
            cfg.model.n_layers, p.pp, p.dp, cfg.n_micro, schedule=p.schedule, policy=p.policy,
            activation=policies[0] if len(policies) == 1 else policies,
            units_per_stage=p.partition,
            # float16 needs the global norm to see an overflow anywhere, clipping or not
            clip=cfg.train.grad_clip > 0 or cfg.train.dtype == "float16",
            rank_order=p.rank_order, view_window=p.view_window if views else None,
            state_home=p.state_home, shard_state=p.shard_state)
    except ScheduleError as e:
        raise UserError(str(e)) from None
