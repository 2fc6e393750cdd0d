"""`ratrain report` of run directories that are not a finished run's: stopped partway (no
summary.json, no trace.json), a trace.json cut short, a plan.json gone; a report that fails
leaves the old one; a --sync diloco run's traced step is simulated with its outer sync. The
run directories are written here, as `ratrain train` writes them, without training."""

from __future__ import annotations

import json

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.report import write_report
from ratrain.report.memory import measured_per_stage, stage_ledgers
from ratrain.report.run import load_run, simulate_run
from ratrain.runtime.trace import chrome_trace
from ratrain.schedule.plan import build_plan

TOKENS = 8 * 256  # a step's: the default global batch x seq_len


def _row(step: int) -> dict:
    tps = 1000.0 + 100 * step
    row = {"step": step, "loss": 6.0 - 0.1 * step, "tokens_per_s": tps,
           "step_time_s": TOKENS / tps, "peak_memory_bytes": 400e6 + step, "mfu": tps * 1e-4,
           # stage 0 grows past stage 1: a max over the ranks is stage 0's
           "rss_growth_bytes_per_rank": [90e6 + 6e6 * step, 120e6 + 3e6 * step]}
    if step <= 2:  # the ledger's peaks stop moving: later rows leave them out
        row["ledger_peak_bytes_per_rank"] = [60e6 + step, 65e6 + step]
    if step % 10 == 0:
        row["val_loss"] = 3.5 - 0.01 * step
    return row


def _run_dir(tmp_path, rows: int = 15, pp: int = 2, dp: int = 1, sync: str = "step",
             plan: bool = True, steps: int = 30, name: str = "run"):
    """A run of `steps` stopped after `rows` of them (Ctrl-C): no summary.json, no trace.json."""
    run = tmp_path / name
    run.mkdir()
    cfg = RunConfig()
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.sync = pp, dp, sync
    cfg.train.steps, cfg.train.eval_every = steps, 10
    cfg.save(run / "config.yaml")
    if plan:
        n_micro = cfg.train.global_batch // dp // cfg.train.micro_batch_size
        (run / "plan.json").write_text(json.dumps(
            build_plan(cfg.model.n_layers, pp, dp, n_micro, sync=sync).to_dict()))
    (run / "metrics.jsonl").write_text("".join(json.dumps(_row(s)) + "\n"
                                               for s in range(1, rows + 1)))
    return run


def test_an_unfinished_runs_figures_come_from_its_metrics(tmp_path):
    run_dir = _run_dir(tmp_path)
    table = dict(write_report(run_dir).table)
    later = [_row(s) for s in range(2, 16)]
    mean = TOKENS * len(later) / sum(r["step_time_s"] for r in later)  # not step 15's 2,500
    assert table["tokens/s"] == (f"{mean:,.0f} (tokens of steps 2-15 over their time, the run "
                                 "stopped at step 15 of 30)")
    assert table["MFU"].startswith(f"{100 * mean * 1e-4:.1f}% of ")
    assert "step 15 of 30" in table["training"]
    assert table["peak memory"].startswith(
        "stage 0: held 60.00 MB, RSS +180.00 MB; stage 1: held 65.00 MB, RSS +165.00 MB; ")
    assert table["final loss"] == "4.5000, validation loss 3.4000 (after step 10)"
    run = load_run(run_dir)
    assert measured_per_stage(run) == ("measured: peak RSS growth", [180e6, 165e6])
    assert stage_ledgers(run) == [{"total": 60e6 + 2}, {"total": 65e6 + 2}]


def test_what_a_run_without_a_timeline_says(tmp_path):
    run_dir = _run_dir(tmp_path)
    assert ("no measured step timeline: the run did not reach its end, where trace.json is "
            "written") in load_run(run_dir).notes
    whole = chrome_trace({0: [(14, "F1.0", 0.0, 10.0)]}, {0: "rank 0"})
    (run_dir / "trace.json").write_text(json.dumps(whole)[:40])  # cut short
    (run_dir / "summary.json").write_text(json.dumps({"steps": 15}))
    notes = load_run(run_dir).notes
    assert any(n.startswith("no measured step timeline: trace.json could not be read (")
               for n in notes)
    (run_dir / "trace.json").unlink()
    assert any("--no-trace" in n for n in load_run(run_dir).notes)
    plain = _run_dir(tmp_path, rows=30, pp=1, plan=False, name="plain")
    (plain / "summary.json").write_text(json.dumps({"steps": 30}))
    assert ("no measured step timeline: no trace.json (a single process on the plain engine "
            "records none)") in load_run(plain).notes


def test_a_pipeline_run_without_its_plan_says_so(tmp_path):
    report = write_report(_run_dir(tmp_path, plan=False))
    table = dict(report.table)
    assert table["layout"] == "pp=2 x dp=1 (pp-dp) by config.yaml; plan.json is missing"
    assert "plain engine" not in " ".join(report.notes + [v for _, v in report.table])


def test_a_failed_report_leaves_the_old_one(tmp_path):
    run_dir = _run_dir(tmp_path)
    write_report(run_dir, profile="cpu-local")
    out = run_dir / "report"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"index.html", "memory.png", "timeline.png"} <= set(before)
    with pytest.raises(UserError, match="nosuchprofile"):
        write_report(run_dir, profile="nosuchprofile")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    write_report(run_dir)  # no profile: no simulated step, no timeline; its old picture goes
    assert "timeline.png" not in {p.name for p in out.iterdir()}
    assert "timeline.png" not in (out / "index.html").read_text()


def test_a_diloco_runs_traced_step_is_simulated_with_its_outer_sync(tmp_path):
    run_dir = _run_dir(tmp_path, rows=20, pp=1, dp=2, sync="diloco:5", steps=20)
    (run_dir / "summary.json").write_text(json.dumps({"steps": 20, "threads_per_rank": 1}))
    traced = {r: [(19, "F1.0", 0.0, 10.0), (19, "WOS1", 10.0, 300.0)] for r in (0, 1)}
    (run_dir / "trace.json").write_text(json.dumps(chrome_trace(traced, {})))
    step_time = dict(write_report(run_dir, profile="cpu-local").table)["step time"]
    assert "(step 20, the timeline's)" in step_time and "with its outer sync" in step_time
    run = load_run(run_dir)
    synced, inner = simulate_run(run, "cpu-local", 20), simulate_run(run, "cpu-local", 17)
    assert synced.of == "step 20, with its outer sync" and inner.of == "step 17, no outer sync"
    ops = lambda sim: {a.op.value for a, _, _ in sim.result.ranks[0].actions}
    assert "WOS" in ops(synced) and "WOS" not in ops(inner)
    assert synced.result.step_time > inner.result.step_time
    assert f"simulated {synced.result.step_time * 1e3:,.1f} ms" in step_time


def test_a_resumes_first_step_is_left_out_of_the_mean_as_the_runs_is(tmp_path):
    """A resume's first step pays for warm-up as step 1 does (metrics.jsonl marks it
    `resumed`); summary.json's steps are named, not "the steps after the first"."""
    run_dir = _run_dir(tmp_path)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows[7]["resumed"] = True  # step 8
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    later = [_row(s) for s in range(2, 16) if s != 8]
    mean = TOKENS * len(later) / sum(r["step_time_s"] for r in later)
    assert dict(write_report(run_dir).table)["tokens/s"].startswith(f"{mean:,.0f} (tokens of ")
    (run_dir / "summary.json").write_text(json.dumps({
        "tokens_per_s": 1234.0, "tokens_per_s_of_steps": "2-7, 9-15", "final_loss": 4.0}))
    assert dict(write_report(run_dir).table)["tokens/s"] == (
        "1,234 (tokens of steps 2-7, 9-15 over their time)")
