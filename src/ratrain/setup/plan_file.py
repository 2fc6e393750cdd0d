"""A plan file: its JSON read once, and the plan it holds checked against the run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.errors import UserError
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.plan import PipelinePlan
from ratrain.schedule.plan_rules import weight_grad_of
from ratrain.setup.plan_file_shape import check_plan_shape

SEARCHED_PLAN = "(searched: --memory-budget)"
"""A run's plan_file while the plan `ratrain train --memory-budget` searched for has no file
yet: training.run.train writes it to RUN/plan.json and records that path instead."""


def read_plan_file(path: str | Path) -> dict:
    """A plan file's plain data (JSON), read once and its shape checked (plan_file_shape): the
    CLI takes its layout and run settings from it, and `load_plan` makes it the plan."""
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
    check_plan_shape(data, str(path))
    return data


LAYOUT_FLAGS = ("pp", "dp", "rank_order", "policy", "shard_state", "grad_lifetime",
                "shard_group", "micro_batch_group", "host_grad_dtype", "schedule")
"""The plan's layout keys whose flags a run with --plan refuses by name where they differ
(once --pp 3 with a 2-stage plan got "--partition 3,3 gives 2 stages' units for 3 stages", a
flag not given; --dp 2 got "does not fit this run: dp=1 (run has 2)"). --weight-grad and --sync are spelt in more
than one way: load_plan's check compares them once resolved."""


def refuse_what_differs(cfg: RunConfig, data: dict, plan_file: str, opts: dict) -> None:
    """After cli/plan_taken.use_plan: a layout flag that differs from the plan, and a model other
    than the preset it was made for, each refused naming what differs, before the run's checks
    meet them (read_plan_file refused a plan whose own keys disagree)."""
    for key in LAYOUT_FLAGS:
        flag = opts.get(key)
        if key not in data or flag is None or (key == "schedule" and flag == AUTO_SCHEDULE):
            continue
        if flag != data[key]:
            name = ("--shard-state" if flag else "--no-shard-state") if key == "shard_state" \
                else f"--{key.replace('_', '-')} {flag}"
            made = "none" if data[key] is None else data[key]
            raise UserError(f"{name} differs from {key} {made}, which {plan_file} was made for; "
                            "leave the flag out or make a new plan")
    if "run" in data:  # cfg.model is the plan's (use_plan took it)
        _refuse_misnamed_model(cfg, data, plan_file)


def _refuse_misnamed_model(cfg: RunConfig, data: dict, plan_file: str) -> None:
    """A plan made for a preset (its "model_preset": planner/plan_file.made_from_preset) runs
    that preset's model, every field: the name is what the run's directory, its report and
    `simulate` say it trains (a plan whose name alone was edited to llama2-7b trained tiny
    under that name). A model of its own is the plan's fields, whatever its name."""
    from ratrain.models.presets import PRESETS

    preset = PRESETS.get(data.get("model_preset"))
    if preset is None:
        return
    mine, its = dataclasses.asdict(cfg.model), dataclasses.asdict(preset)
    differ = [f"run.model.{k} is {mine[k]} (the preset's is {its[k]})"
              for k in its if mine[k] != its[k]]
    if differ:
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise UserError(f"{plan_file} was made for preset {preset.name}, but "
                        f"{', '.join(differ[:3])}{more}: make a new plan for the model (an "
                        "edited plan's memory and speed are not the edited model's)")


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
        t = cfg.train  # (a dp of 2 in a plan for 1 was "n_micro=2 (run has 1)", dp unnamed)
        how = {"n_micro": f": --global-batch {t.global_batch} / (dp {cfg.parallel.dp} x "
                          f"--micro-batch-size {t.micro_batch_size})"}
        diff = ", ".join(f"{k}={have[k]} (run has {want[k]}{how.get(k, '')})"
                         for k in want if have[k] != want[k])
        raise UserError(f"plan {path} does not fit this run: {diff}")
    try:
        plan.validate()
    except ScheduleError as e:
        raise UserError(f"plan {path} fails the schedule checks: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise UserError(f"plan {path} is damaged: {type(e).__name__}: {e}") from None
    return plan
