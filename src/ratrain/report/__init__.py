"""`ratrain report`: one HTML page and its PNG pictures in RUN_DIR/report/ (run.py reads the
run; curves.py, memory.py and timeline.py draw; page.py writes the page)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ratrain.errors import UserError
from ratrain.report import run_figures
from ratrain.report.curves import plot_loss, plot_throughput
from ratrain.report.memory import plot_memory
from ratrain.report.page import run_table, write_page
from ratrain.report.run import load_run, simulate_run
from ratrain.report.timeline import measured_step, plot_timeline, simulated_step


@dataclass
class Report:
    page: Path
    pictures: list[Path]
    table: list[tuple[str, str]]
    notes: list[str] = field(default_factory=list)


def write_report(run_dir: str | Path, profile: str | None = None,
                 out_dir: str | Path | None = None) -> Report:
    """Writes the report of the run in `run_dir` (into `out_dir`, default RUN_DIR/report/);
    `profile`: the hardware profile to simulate the run's plan on (default: the run's, or its
    plan's)."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir else run.run_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        # drawn beside the old report, which it replaces once whole: a report that fails (on
        # a profile that does not load, say) leaves the old one as it was
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=out))
    except OSError as e:
        raise _cannot_write(out, e) from None
    try:
        table, pictures = _draw(run, profile, staging)
        page = write_page(run, staging, table, pictures)
        for _, path, _ in pictures:
            os.replace(path, out / path.name)
        os.replace(page, out / page.name)
        shown = {path.name for _, path, _ in pictures}
        for old in out.glob("*.png"):  # what the new page does not show (a run redone)
            if old.name not in shown:
                old.unlink()
    except OSError as e:
        # the run was read whole by load_run: what fails here is a write, unless it names a
        # file elsewhere (a --profile YAML that cannot be read)
        if e.filename is not None and out.resolve() not in Path(e.filename).resolve().parents:
            raise
        raise _cannot_write(out, e) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Report(out / page.name, [out / path.name for _, path, _ in pictures], table,
                  run.notes)


def _cannot_write(out: Path, e: OSError) -> UserError:
    return UserError(f"cannot write the report into {out}: {e.strerror or e}")


def _draw(run, profile: str | None, out: Path):
    """(the run's table, its pictures as (heading, file, caption)) drawn into `out`."""
    name = run.cfg.model.name
    pictures = [("", plot_loss(run.metrics, out / "loss.png", f"{name}: loss"),
                 "Training loss per step; validation loss where measured."),
                ("", plot_throughput(run.metrics, out / "throughput.png", f"{name}: throughput"),
                 "Tokens per second of each step and its MFU (model FLOPs over the peak).")]
    measured = measured_step(run.trace) if run.trace else None
    if run.trace and measured is None:
        run.notes.append("no measured step timeline: trace.json holds no step")
    # the traced step's own programs: a --sync diloco run's last step holds an outer sync
    sim = simulate_run(run, profile, measured[0] if measured else None)
    memory = plot_memory(run, sim, out / "memory.png")
    if memory:
        pictures.append(("Memory per stage", memory, _memory_caption(run, sim)))
    timeline_times = None
    simulated = simulated_step(sim.result, sim.profile) if sim else None
    if measured or simulated:
        step = measured[0] if measured else None
        measured_s, which = _measured_step_time(run, step, measured[1] if measured else None)
        timeline_times = (measured_s, sim.result.step_time if sim else None, which)
        title = (f"Step {step}: measured {measured_s * 1e3:,.1f} ms" if measured else
                 f"A step: measured {measured_s * 1e3:,.1f} ms ({which})")
        if sim:
            error = (sim.result.step_time - measured_s) / measured_s
            title += (f", simulated {sim.result.step_time * 1e3:,.1f} ms on {sim.profile} "
                      f"({sim.of + '; ' if sim.of else ''}step-time error {error:+.1%})")
        path = plot_timeline(measured[1] if measured else None, simulated, out / "timeline.png",
                             title)
        pictures.append(("One step's timeline", path,
                         "A row per rank (measured) and per stage (simulated), actions coloured "
                         "by kind; asynchronous work from its start to its completion on the "
                         "async lanes; hatched: waits. The Perfetto trace (trace.json) zooms in."))
    return run_table(run, sim, timeline_times), pictures


def _memory_caption(run, sim) -> str:
    parts = []
    if run.summary.get("ledger_at_peak_by_kind_per_rank"):
        parts.append("what the executor's memory ledger held at its peak, by kind")
    elif run_figures.per_stage(run, "ledger_peak_bytes"):
        parts.append("what the executor's memory ledger held at its peak, in total (by kind: "
                     "gathered at a run's end)")
    if sim:
        parts.append(f"the simulator's prediction of it (hatched) and of the RSS growth "
                     f"(dashed), on {sim.profile}" + (f" ({sim.of})" if sim.of else ""))
    parts.append("what the process measured (CPU: its peak resident set over its size before "
                 "the first step; CUDA: max_memory_allocated)")
    if run.budget_bytes:
        parts.append("the plan's memory budget")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _measured_step_time(run, step: int | None, traced) -> tuple[float, str]:
    """(the traced step's time as the loop measured it (metrics.jsonl), else its trace's span;
    what it is); without a trace, the mean of the steps after the first."""
    if step is not None:
        row = next((r for r in run.metrics if r["step"] == step and r.get("step_time_s")), None)
        return (row["step_time_s"] if row else traced.duration), f"step {step}, the timeline's"
    rows = [r for r in run_figures.timed_rows(run) if r.get("step_time_s")]
    if not rows:
        return float("nan"), "no step recorded its time"
    return (sum(r["step_time_s"] for r in rows) / len(rows),
            f"the mean of {run_figures.steps_text(rows)}")
