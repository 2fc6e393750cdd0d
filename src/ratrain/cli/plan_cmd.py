"""`ratrain plan`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ratrain.cli.group import cli
from ratrain.cli.options import build_config, config_options


@cli.command()
@config_options
@click.option("--out", type=click.Path(), help="Write the plan as JSON here (for `ratrain train --plan`).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON on stdout.")
def plan(out, as_json, **opts) -> None:
    """Show the per-rank programs of a run's pipeline plan (step x rank table).

    Today this is the plan the flags describe; the resource-aware search comes with the planner.
    """
    from ratrain.schedule import format_table
    from ratrain.train import plan_for

    cfg = build_config(opts)
    cfg.validate()
    pipeline_plan = plan_for(cfg)
    if out:
        Path(out).write_text(json.dumps(pipeline_plan.to_dict(), indent=2))
    if as_json:
        click.echo(json.dumps(pipeline_plan.to_dict(), indent=2))
        return
    units = ", ".join(f"stage {s}: units {r.start}-{r.stop - 1}" for s, r in enumerate(pipeline_plan.stage_units))
    click.echo(f"{pipeline_plan.policy} {pipeline_plan.schedule}, pp={cfg.parallel.pp} dp={cfg.parallel.dp} "
               f"rank order {pipeline_plan.rank_order}, "
               f"n_micro={cfg.n_micro}; {units}")
    views = ("none (the views are the masters)" if pipeline_plan.view_window is None
             else "all resident" if pipeline_plan.view_window == 0
             else f"window {pipeline_plan.view_window}")
    activation = "; ".join(f"stage {s}: " + ",".join(choices)
                           for s, choices in enumerate(pipeline_plan.activation))
    click.echo(f"activations per unit: {activation}; views: {views}; "
               f"state home: {pipeline_plan.state_home}")
    click.echo(format_table(pipeline_plan.programs))
