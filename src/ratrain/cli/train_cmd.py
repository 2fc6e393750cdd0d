"""`ratrain train`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ratrain.cli.format import fmt_bytes
from ratrain.cli.group import cli
from ratrain.cli.options import build_config, config_options, use_plan_file
from ratrain.errors import UserError


@cli.command()
@config_options
@click.option("--plan", "plan_file", type=click.Path(), help="Run this plan (JSON from `ratrain plan --out`) instead of building one.")
@click.option("--run-dir", type=click.Path(), help="Directory for this run.  [default: runs/<time>-<model>, linked from runs/latest]")
@click.option("--resume", "resume_dir", type=click.Path(), help="Continue the run in this directory from its latest checkpoint.")
@click.option("--trace/--no-trace", default=True, show_default=True, help="Write trace.json (pipeline runs).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
def train(plan_file, run_dir, resume_dir, trace, progress, as_json, **opts) -> None:
    """Train a model. With no arguments: the embedded default run."""
    from ratrain.runtime.launch import under_torchrun
    from ratrain.train import train as run_training

    cfg = build_config(opts, resume_dir)
    if plan_file:
        use_plan_file(cfg, plan_file, opts)
    if resume_dir:
        run_dir = Path(resume_dir)
    elif run_dir:
        run_dir = Path(run_dir)
    elif under_torchrun():
        raise UserError("under torchrun, pass --run-dir: every rank must write to the same "
                        "directory (on a filesystem all nodes share)")
    summary = run_training(cfg, run_dir, resume=bool(resume_dir), progress=progress, trace=trace)
    if not summary:  # a torchrun rank other than 0
        return
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        val = summary.get("val_loss")
        click.echo(f"run: {summary.get('run_dir')}  steps: {summary.get('steps')}  "
                   f"loss: {summary.get('final_loss'):.4f}" + (f"  val loss: {val:.4f}" if val else "")
                   + f"  tokens/s: {summary.get('tokens_per_s'):.0f}")
        click.echo(_memory_line(summary))


def _memory_line(summary: dict) -> str:
    """Peak memory per pipeline stage: what the executor held (ledger), what the process grew."""
    ledger = summary.get("ledger_peak_bytes_per_stage")
    if not ledger:
        return f"peak memory: {fmt_bytes(summary.get('peak_memory_bytes') or 0)}"
    rss = summary.get("rss_growth_bytes_per_stage") or [None] * len(ledger)
    parts = [f"stage {s}: {fmt_bytes(held)}" + (f" (RSS +{fmt_bytes(grown)})" if grown is not None else "")
             for s, (held, grown) in enumerate(zip(ledger, rss))]
    return "peak memory held (ledger): " + ", ".join(parts)
