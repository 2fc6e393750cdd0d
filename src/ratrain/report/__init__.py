"""`ratrain report`: one HTML page and its PNG pictures in RUN_DIR/report/ (run.py reads the
run; curves.py, memory.py and timeline.py draw; page.py writes the page)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    name = run.cfg.model.name
    pictures = [("", plot_loss(run.metrics, out / "loss.png", f"{name}: loss"),
                 "Training loss per step; validation loss where measured."),
                ("", plot_throughput(run.metrics, out / "throughput.png", f"{name}: throughput"),
                 "Tokens per second of each step and its MFU (model FLOPs over the peak).")]
    sim = simulate_run(run, profile)
    memory = plot_memory(run, sim, out / "memory.png")
    if memory:
        pictures.append(("Memory per stage", memory, _memory_caption(run, sim)))
    timeline_times = None
    measured = measured_step(run.trace) if run.trace else None
    if measured is None:
        run.notes.append("no measured step timeline: no trace.json (single-process runs on the "
                         "plain engine and --no-trace runs record none)")
    simulated = simulated_step(*sim) if sim else None
    if measured or simulated:
        index = measured[0] if measured else None
        measured_s = _measured_step_time(run, index, measured[1] if measured else None)
        timeline_times = (measured_s, sim[0].step_time if sim else None,
                          f"step {index + 1}, the timeline's" if measured
                          else "the mean of the steps after the first")
        title = (f"Step {index + 1}: measured {measured_s * 1e3:,.1f} ms" if measured else
                 f"A step: measured {measured_s * 1e3:,.1f} ms (mean)")
        if sim:
            title += (f", simulated {sim[0].step_time * 1e3:,.1f} ms on {sim[1]} "
                      f"(step-time error {(sim[0].step_time - measured_s) / measured_s:+.1%})")
        path = plot_timeline(measured[1] if measured else None, simulated, out / "timeline.png",
                             title)
        pictures.append(("One step's timeline", path,
                         "A row per rank (measured) and per stage (simulated), actions coloured "
                         "by kind; asynchronous work from its start to its completion on the "
                         "async lanes; hatched: waits. The Perfetto trace (trace.json) zooms in."))
    table = run_table(run, sim, timeline_times)
    page = write_page(run, out, table, pictures)
    return Report(page, [p for _, p, _ in pictures], table, run.notes)


def _memory_caption(run, sim) -> str:
    parts = []
    if run.summary.get("ledger_at_peak_by_kind_per_rank"):
        parts.append("what the executor's memory ledger held at its peak, by kind")
    if sim:
        parts.append(f"the simulator's prediction of it (hatched) and of the RSS growth "
                     f"(dashed), on {sim[1]}")
    parts.append("what the process measured (CPU: its peak resident set over its size before "
                 "the first step; CUDA: max_memory_allocated)")
    if run.budget_bytes:
        parts.append("the plan's memory budget")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _measured_step_time(run, index: int | None, step) -> float:
    """The traced step's time as the loop measured it (metrics.jsonl), else its trace's span;
    without a trace, the mean of the steps after the first."""
    if index is not None:
        for row in run.metrics:
            if row["step"] == index + 1 and row.get("step_time_s"):
                return row["step_time_s"]
        return step.duration
    times = [r["step_time_s"] for r in run.metrics[1:] or run.metrics if r.get("step_time_s")]
    return sum(times) / len(times) if times else float("nan")
