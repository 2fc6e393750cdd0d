"""A `--plan FILE` taken by `train` and `simulate`: its layout and settings into the config,
the flags that differ from it refused by name, and (train) a note where it was made for
another kind of machine."""

from __future__ import annotations

import os

import click

from ratrain.cli.options import use_plan_file
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.setup.plan_file import refuse_what_differs


def take_plan(cfg: RunConfig, plan_file: str, opts: dict, note: bool = False) -> dict:
    """The plan file's contents, its layout and settings taken into cfg (cli/options.use_plan)
    and checked against the flags before the run's own checks meet a clash; with `note`
    (train's progress), other_machine_note's line on stderr."""
    data = use_plan_file(cfg, plan_file, opts)
    refuse_what_differs(cfg, data, plan_file, opts)
    said = note and other_machine_note(data, plan_file, cfg)
    if said:
        click.echo(said, err=True)
    return data


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
