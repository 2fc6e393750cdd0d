"""`ratrain train`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ratrain.cli.format import fmt_bytes
from ratrain.cli.group import cli
from ratrain.cli.options import build_config, config_options, use_plan_file
from ratrain.config import RunConfig
from ratrain.errors import UserError


# What a run may change when it continues: how long, how often it evaluates and saves, how it
# fails. The rest of the config is the run's math and data.
_FREE_ON_RESUME = {"train": {"steps", "eval_every", "eval_batches", "checkpoint_every",
                             "keep_checkpoints", "checkpoint_on_interrupt"}}


@cli.command()
@config_options
@click.option("--plan", "plan_file", type=click.Path(), help="Run this plan (JSON from `ratrain plan --out`) instead of building one.")
@click.option("--run-dir", type=click.Path(), help="Directory for this run.  [default: runs/<time>-<model>, linked from runs/latest]")
@click.option("--resume", "resume_dir", help="Continue the run in this directory from its newest checkpoint that verifies (newer ones that do not are named and skipped). 'auto', with --run-dir: continue the run there if it has a checkpoint, else start it (for torchrun --max-restarts).")
@click.option("--keep-checkpoints", type=int, help="Keep the newest K complete checkpoints.  [default: 2]")
@click.option("--comm-timeout", type=float, help="Seconds a rank waits for a peer before the run ends, naming the step, the action and the peer.  [default: 300]")
@click.option("--checkpoint-on-interrupt", is_flag=True, default=None, help="On Ctrl-C, finish the step and save a checkpoint before stopping (a second Ctrl-C stops at once).")
@click.option("--trace/--no-trace", default=True, show_default=True, help="Write trace.json (pipeline runs).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
def train(plan_file, run_dir, resume_dir, keep_checkpoints, comm_timeout, checkpoint_on_interrupt,
          trace, progress, as_json, **opts) -> None:
    """Train a model. With no arguments: the embedded default run.

    Checkpoints are verified by a manifest (sizes, sha256) before any is loaded; a hung peer
    ends the run after --comm-timeout; Ctrl-C stops every rank. See docs/reliability.md."""
    from ratrain.runtime.launch import under_torchrun
    from ratrain.train import train as run_training

    if resume_dir == "auto":
        if not run_dir:
            raise UserError("--resume auto needs --run-dir: the directory a restarted job continues")
        cfg = build_config(opts)
        resume_dir = run_dir if _has_checkpoint(Path(run_dir)) else None
        if resume_dir:
            _check_same_run(cfg, Path(run_dir))
    else:
        cfg = build_config(opts, resume_dir)
    if plan_file:
        use_plan_file(cfg, plan_file, opts)
    for value, section, key in ((keep_checkpoints, "train", "keep_checkpoints"),
                                (checkpoint_on_interrupt, "train", "checkpoint_on_interrupt"),
                                (comm_timeout, "parallel", "comm_timeout_s")):
        if value is not None:
            setattr(getattr(cfg, section), key, value)
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


def _has_checkpoint(run_dir: Path) -> bool:
    from ratrain import checkpoint

    return bool(checkpoint.complete_dirs(run_dir))


def _check_same_run(cfg: RunConfig, run_dir: Path) -> None:
    """--resume auto continues a run only with the math and data it was started with."""
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} has checkpoints but no config.yaml: not a ratrain run directory")
    saved, now = RunConfig.load(run_dir / "config.yaml").to_dict(), cfg.to_dict()
    for section in ("model", "data", "train"):
        for key, value in now[section].items():
            if key not in _FREE_ON_RESUME.get(section, ()) and saved[section].get(key) != value:
                raise UserError(f"--resume auto: {run_dir} was started with {section}.{key} = "
                                f"{saved[section].get(key)!r}, this run has {value!r}; use another --run-dir")


def _memory_line(summary: dict) -> str:
    """Peak memory per pipeline stage: what the executor held (ledger), what the process grew."""
    ledger = summary.get("ledger_peak_bytes_per_stage")
    if not ledger:
        return f"peak memory: {fmt_bytes(summary.get('peak_memory_bytes') or 0)}"
    rss = summary.get("rss_growth_bytes_per_stage") or [None] * len(ledger)
    parts = [f"stage {s}: {fmt_bytes(held)}" + (f" (RSS +{fmt_bytes(grown)})" if grown is not None else "")
             for s, (held, grown) in enumerate(zip(ledger, rss))]
    return "peak memory held (ledger): " + ", ".join(parts)
