"""A `--plan FILE` taken by `train` and `simulate`: its layout and settings into the config,
the flags that differ from it refused by name, and (train) a note where it was made for
another kind of machine."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.setup.plan_file import read_plan_file, refuse_what_differs


def take_plan(cfg: RunConfig, plan_file: str, opts: dict, note: bool = False,
              run: str = "simulated") -> dict:
    """The plan file's contents, its layout and settings taken into cfg (use_plan; `run`:
    how it is run, _use_its_weights) and checked against the flags before the run's own
    checks meet a clash; with `note` (train's progress), other_machine_note's line on stderr.
    The file is read here once: the setup stage (setup.run_plan) makes its contents the plan."""
    cfg.parallel.plan_file = str(Path(plan_file).resolve())
    data = use_plan(cfg, read_plan_file(cfg.parallel.plan_file), plan_file, opts, run)
    refuse_what_differs(cfg, data, plan_file, opts)
    said = note and other_machine_note(data, plan_file, cfg)
    if said:
        click.echo(said, err=True)
    return data


def use_plan(cfg: RunConfig, layout: dict, plan_file: str, opts: dict,
             run: str = "new") -> dict:
    """Run the plan `layout` (a plan file's contents, or a searched plan's; `plan_file` names
    it in refusals): its layout and the settings it was made for, unless the flags say
    otherwise. A key absent or null (an older plan; a field at its default) leaves cfg's."""
    # (each value of its key's type: read_plan_file checked a file's, to_dict wrote a search's)
    for key in ("pp", "dp", "rank_order", "policy", "shard_state", "schedule", "weight_grad",
                "grad_lifetime", "shard_group", "sync", "micro_batch_group", "host_grad_dtype"):
        if opts[key] is None and layout.get(key) is not None:
            setattr(cfg.parallel, key, layout[key])  # else the plan's checks report the clash
    _refuse_what_the_programs_hold(layout, plan_file, opts)
    if "run" in layout:
        _use_run_settings(cfg, layout["run"], plan_file, opts, run)
    return layout


def take_runs_settings(cfg: RunConfig, plan_data: dict, plan_file: str, opts: dict
                       ) -> str | None:
    """A run directory's plan.json (the programs it ran, without a plan file's "run" settings):
    taken with the model, sequence and batch of the config.yaml beside it (`simulate --plan`),
    and returns the profile that run trained with, if any. Until 2026-12-04 `simulate --plan
    RUN/plan.json` simulated the default 256 tokens on cpu-local without a word."""
    from ratrain.planner.plan_file import run_settings
    from ratrain.schedule.plan import PipelinePlan

    config = Path(plan_file).parent / "config.yaml"
    if "run" in plan_data or Path(plan_file).name != "plan.json" or not config.is_file():
        return None
    ran = RunConfig.load(config)
    plan = PipelinePlan.from_dict(plan_data)
    _use_run_settings(cfg, run_settings(plan, ran, ran.train.micro_batch_size), plan_file, opts,
                      "simulated")
    click.echo(f"{plan_file}: simulated with the settings of {config} beside it", err=True)
    return ran.train.profile


def _refuse_what_the_programs_hold(layout: dict, plan_file: str, opts: dict) -> None:
    """Flags a plan's programs decide, which a run cannot change without another plan; once
    they ran as the plan said while the run's config recorded the flag."""
    du = opts.get("device_units")
    given = {"activation": opts.get("activation") is not None,
             "device_units": du is not None and (du != 0 or bool(layout.get("device_units"))),
             "update": opts.get("update") not in (None, "auto", layout.get("update", "inline"))}
    kept = ", ".join(map(str, layout.get("device_units") or []))
    what = {"activation": "chooses the activations unit by unit",
            "device_units": (f"keeps units {kept}" if kept else "keeps no unit's") +
                            " state on the device",
            "update": f"updates {layout.get('update', 'inline')}"}
    for key, is_given in given.items():
        if is_given:
            raise UserError(f"--{key.replace('_', '-')} is the plan's: {plan_file} {what[key]}; "
                            "leave the flag out or make a new plan")


def _use_run_settings(cfg: RunConfig, run: dict, plan_file: str, opts: dict,
                      taken_by: str) -> None:
    """A planner's plan carries the model and training settings it was made for: the run takes
    them; a flag that says otherwise, or a --model/--config of another model, is refused (the
    plan's memory and speed hold only for what it was made for)."""
    try:
        made_for = RunConfig.from_dict(run)
    except UserError as e:
        raise UserError(f"{plan_file}: run.{e}") from None
    given_model = opts["model"] or opts["config_file"]
    if given_model and _model_of(cfg, made_for, opts) != made_for.model:
        raise UserError(f"{plan_file} was made for model {made_for.model.name} "
                        f"({made_for.model.n_layers} layers, dim {made_for.model.dim}); this run "
                        f"has {cfg.model.name} ({cfg.model.n_layers} layers, dim {cfg.model.dim})")
    cfg.model = made_for.model
    _use_its_weights(cfg, made_for.train.init_from if "init_from" in run["train"] else None,
                     plan_file, opts, taken_by)
    for section, keys in (("train", ("seq_len", "global_batch", "micro_batch_size", "dtype")),
                          ("parallel", ("state_home", "shard_state", "view_window", "partition",
                                        "threads_per_rank"))):
        for key in keys:
            if key not in run[section]:
                continue
            want = getattr(getattr(made_for, section), key)
            name = _FLAG_OF.get(key, key)
            flag = opts.get(name)
            if key == "partition" and flag is not None:  # (until 2026-12-03 the plan's, unsaid)
                flag, want = cfg.parallel.partition, want or None  # as build_config read it
            if flag is not None and flag != want:
                raise UserError(f"--{name.replace('_', '-')} {_as_flag(key, flag)} differs from "
                                f"{_as_flag(key, want)}, which {plan_file} was made for; leave "
                                "the flag out or make a new plan")
            setattr(getattr(cfg, section), key, want)


_FLAG_OF = {"threads_per_rank": "threads"}
"""A run setting whose flag is named otherwise (run.parallel.threads_per_rank: --threads, which
`plan` writes where given; until 2026-12-04 `train`/`simulate --plan` ran the default threads,
the plan's prediction unreproduced)."""


def _model_of(cfg: RunConfig, made_for: RunConfig, opts: dict):
    """The run's model as compared with the plan's: a --model DIR beside a plan made for a
    directory's weights by its fields alone (its name is the directory's, and a moved or
    renamed copy is the way out where the plan's directory is gone)."""
    if made_for.train.init_from and opts["model"] and Path(opts["model"]).is_dir():
        return dataclasses.replace(cfg.model, name=made_for.model.name)
    return cfg.model


def _use_its_weights(cfg: RunConfig, init_from: str | None, plan_file: str, opts: dict,
                     run: str) -> None:
    """The weights a plan made for a Hugging Face directory starts from (run.train.init_from):
    until 2026-12-03 a plan carried none, and `train --plan` trained that model from random
    weights. A --model or --config beside the plan gives its own (its model checked above), a
    `run` "resumed" keeps where it started (its weights are its checkpoint's); a directory
    gone is refused where a "new" run reads it (a "simulated" one reads none)."""
    if (init_from is None or opts["model"] or (opts["config_file"] and cfg.train.init_from)
            or run == "resumed"):
        return
    cfg.train.init_from = init_from
    if run == "new" and not Path(init_from).is_dir():
        raise UserError(f"{plan_file} starts from the weights in {init_from}, which is not a "
                        "directory (moved or deleted?): put it back there, or give --model DIR "
                        "where it is now")


def _as_flag(key: str, value) -> str:
    """`value` of `key` as its flag spells it (a partition's counts comma-separated)."""
    if key == "partition":
        return ",".join(map(str, value)) if value else "an even split"
    return str(value)


def other_machine_note(plan_data: dict, plan_file: str, cfg: RunConfig) -> str | None:
    """Where the plan was made on a profile of a GPU and this machine trains on its CPU (or
    the reverse), a line that says so: the plan's predicted speed and its memory budget are
    that machine's (a plan made for an H200, 868,378 tokens/s predicted, ran here at 1,700
    without a word). None where the kinds agree or the plan's profile cannot be read."""
    from ratrain.byte_units import decimal_bytes
    from ratrain.report.run import plans_profile
    from ratrain.sim.profile import load_profile

    spec, name = plans_profile(plan_data)
    if spec is None or int(os.environ.get("RANK", 0)) != 0:  # (under torchrun: rank 0 says it)
        return None
    try:
        made_on = load_profile(spec)
    except UserError:  # a moved YAML of a measured profile: its kind is not known
        return None
    from ratrain.runtime.process_groups import pick_backend  # (torch: only for a predicted plan)

    made_on_gpu = made_on.device.host_link is not None  # (setup's Machine.of_profile's rule)
    here_gpu = pick_backend(cfg.parallel.backend) == "nccl"
    if made_on_gpu == here_gpu:
        return None
    prediction = plan_data.get("prediction") or {}
    speed, budget = prediction.get("tokens_per_s"), prediction.get("budget_bytes")
    speed = f" ({speed:,.0f} tokens/s)" if isinstance(speed, (int, float)) else ""
    budget = f" ({decimal_bytes(budget)} a device)" if isinstance(budget, (int, float)) else ""
    return (f"note: {plan_file} was made on profile {name} ({made_on.device.name}, a "
            f"{'GPU' if made_on_gpu else 'CPU'}), and this run trains on "
            f"{'a GPU' if here_gpu else 'the CPU'}: its prediction{speed} and memory "
            f"budget{budget} are that machine's, not this one's")
