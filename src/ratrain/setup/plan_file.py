"""A plan file: its JSON read once, and the plan it holds checked against the run."""

from __future__ import annotations

import json
from pathlib import Path

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.errors import UserError
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.plan import PipelinePlan
from ratrain.schedule.plan_rules import weight_grad_of

SEARCHED_PLAN = "(searched: --memory-budget)"
"""A run's plan_file while the plan `ratrain train --memory-budget` searched for has no file
yet: training.run.train writes it to RUN/plan.json and records that path instead."""


def read_plan_file(path: str | Path) -> dict:
    """A plan file's plain data (JSON), read once: the CLI takes its layout and run settings
    from it, and `load_plan` makes it the plan."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"plan file not found: {path}") from None
    except (OSError, ValueError) as e:  # not text, not JSON
        raise UserError(f"{path} is not a ratrain plan: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a ratrain plan: expected a JSON object, got "
                        f"{type(data).__name__}")
    return data


def load_plan(cfg: RunConfig, data: dict | None = None) -> PipelinePlan:
    """The plan in cfg.parallel.plan_file (`data`: its contents, where already read), checked
    against the config and by the schedule checks."""
    path = Path(cfg.parallel.plan_file)
    if data is None:
        data = read_plan_file(path)
    try:
        plan = PipelinePlan.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise UserError(f"{path} is not a ratrain plan: {type(e).__name__}: {e}") from None
    if cfg.parallel.schedule == AUTO_SCHEDULE:  # a plan without one (older files): the plan's
        cfg.parallel.schedule = plan.schedule
        cfg.parallel.weight_grad = cfg.parallel.weight_grad or plan.weight_grad
    want = {"pp": cfg.parallel.pp, "dp": cfg.parallel.dp, "n_micro": cfg.n_micro,
            "n_layers": cfg.model.n_layers, "rank_order": cfg.parallel.rank_order,
            "policy": cfg.parallel.policy, "shard_state": cfg.parallel.shard_state,
            "grad_lifetime": cfg.parallel.grad_lifetime, "shard_group": cfg.parallel.shard_group,
            "schedule": cfg.parallel.schedule, "sync": cfg.parallel.sync,
            "micro_batch_group": cfg.parallel.micro_batch_group or plan.micro_batch_group,
            "host_grad_dtype": cfg.parallel.host_grad_dtype,
            "weight_grad": weight_grad_of(cfg.parallel.schedule, cfg.parallel.weight_grad)}
    # a window releases views (a tied head needs the embedding's kept); across stages the
    # programs sum the tied weight's gradient (TS)
    if plan.view_window or cfg.parallel.pp > 1:
        want["tie_embeddings"] = cfg.model.tie_embeddings
    have = {k: getattr(plan, k) for k in want}
    if have != want:
        diff = ", ".join(f"{k}={have[k]} (run has {want[k]})" for k in want if have[k] != want[k])
        raise UserError(f"plan {path} does not fit this run: {diff}")
    try:
        plan.validate()
    except ScheduleError as e:
        raise UserError(f"plan {path} fails the schedule checks: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise UserError(f"plan {path} is damaged: {type(e).__name__}: {e}") from None
    return plan
