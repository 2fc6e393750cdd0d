"""`ratrain report`."""

from __future__ import annotations

import json

import click

from ratrain.cli.group import cli
from ratrain.cli.json_command import JsonCommand


@cli.command(cls=JsonCommand)
@click.argument("run_dir", type=click.Path())
@click.option("--profile", "profile_spec", help="Hardware profile to simulate the run's plan on, for the simulated step beside the measured one: a preset (cpu-local, mt3000, ...) or a YAML file from `ratrain profile`.  [default: the run's --profile, else the one its --plan was made with]")
@click.option("--out", "out_dir", type=click.Path(), help="Directory for the page and its pictures.  [default: RUN_DIR/report]")
@click.option("--json", "as_json", is_flag=True, help="Print the page's path, its pictures and the run's table as JSON on stdout.")
def report(run_dir, profile_spec, out_dir, as_json) -> None:
    """Write RUN_DIR/report/index.html: the run's table (model, layout, plan, tokens/s, MFU,
    peak memory per stage, losses) and pictures of its loss, throughput and MFU, memory per
    stage, and one step's timeline measured beside simulated."""
    from ratrain.report import write_report

    written = write_report(run_dir, profile_spec, out_dir)
    if as_json:
        click.echo(json.dumps({"page": str(written.page), "pictures": [str(p) for p in written.pictures],
                               "table": dict(written.table), "notes": written.notes}, indent=2))
        return
    width = max(len(k) for k, _ in written.table)
    for key, value in written.table:
        click.echo(f"{key.ljust(width)}  {value}")
    for note in written.notes:
        click.echo(f"note: {note}")
    click.echo(f"wrote {written.page} ({len(written.pictures)} pictures)")
