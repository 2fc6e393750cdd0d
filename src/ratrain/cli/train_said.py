"""What `ratrain train` says at the end of a run: the summary (a line, or JSON), peak memory,
and where its report went."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ratrain.byte_units import decimal_bytes
from ratrain.counts import counted


def say_summary(summary: dict, as_json: bool) -> None:
    """The run's summary on stdout: as JSON, or a line of its figures and one of its peak
    memory."""
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    from ratrain.training.mfu import mfu_in_words

    val = summary.get("val_loss")
    val = ("  val loss: not finite" if summary.get("val_loss_not_finite")
           else f"  val loss: {val:.4f}" if val is not None else "")
    skipped = summary.get("skipped_steps")
    click.echo(f"run: {summary.get('run_dir')}  steps: {summary.get('steps')}  "
               f"loss: {summary.get('final_loss'):.4f}" + val
               + f"  tokens/s: {summary.get('tokens_per_s'):.0f}"
               + (f"  MFU: {mfu_in_words(summary)}" if summary.get("mfu") is not None else "")
               + (f"  skipped (float16 overflow): {counted(len(skipped), 'step')}, loss scale "
                  f"{summary.get('loss_scale')}" if skipped else ""))
    click.echo(memory_line(summary))


def memory_line(summary: dict) -> str:
    """Peak memory per pipeline stage: what the executor held (ledger), what the process grew."""
    ledger = summary.get("ledger_peak_bytes_per_stage")
    if not ledger:
        return f"peak memory: {decimal_bytes(summary.get('peak_memory_bytes') or 0)}"
    rss = summary.get("rss_growth_bytes_per_stage") or [None] * len(ledger)
    parts = [f"stage {s}: {decimal_bytes(held)}"
             + (f" (RSS +{decimal_bytes(grown)})" if grown is not None else "")
             for s, (held, grown) in enumerate(zip(ledger, rss))]
    return "peak memory held (ledger): " + ", ".join(parts)


def write_report_or_warn(run_dir: Path, quiet: bool) -> None:
    """The run's report; the run has succeeded whatever happens here, so a failure is a warning."""
    from ratrain.report import write_report

    try:
        written = write_report(run_dir)
    except Exception as e:  # noqa: BLE001
        click.echo(f"warning: the report was not written ({type(e).__name__}: {e}); "
                   f"try `ratrain report {run_dir}`", err=True)
        return
    if not quiet:
        click.echo(f"report: {written.page}")
