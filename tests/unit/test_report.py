"""`ratrain report`: the page and its pictures for a pp=2 dp=2 run and a planned run (the
default run's: tests/e2e/test_default_run.py); the timeline's reading of a trace; MFU in what a run writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ratrain.data.corpus import stdlib_files
from ratrain.report.timeline import KIND_COLORS, kind_of, lanes, measured_step
from ratrain.runtime.trace import chrome_trace
from ratrain.schedule.ops import SPECS, Op

from .cli_runner import run_cli
from .report_checks import check_mfu, check_page

SHORT = ["--steps", "3", "--seq-len", "64", "--no-progress"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A small corpus and its token cache."""
    root = tmp_path_factory.mktemp("report")
    data = root / "text"
    data.mkdir()
    for f in [f for f in stdlib_files() if f.name in ("textwrap.py", "shlex.py", "glob.py")]:
        shutil.copy(f, data / f.name)
    return root


def _ratrain(workdir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RATRAIN_CACHE": str(workdir / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "ratrain.cli", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.dist
def test_pp2_dp2_run_report_with_simulated_step(workdir, monkeypatch, capsys):
    _ratrain(workdir, "train", "--data", "text", *SHORT, "--pp", "2", "--dp", "2", "--profile",
             "cpu-local", "--run-dir", "pp2dp2", "--no-report")
    run = workdir / "pp2dp2"
    assert not (run / "report").exists()
    code, out, err = run_cli(monkeypatch, capsys, "report", str(run), "--json")
    assert code == 0, err
    written = json.loads(out)
    html = check_page(run / "report", {"loss.png", "throughput.png", "memory.png", "timeline.png"})
    assert {os.path.basename(p) for p in written["pictures"]} == {
        "loss.png", "throughput.png", "memory.png", "timeline.png"}
    assert "simulated" in written["table"]["step time"] and "error" in written["table"]["step time"]
    assert "pp=2 x dp=2" in written["table"]["layout"]
    assert "stage 1: held" in written["table"]["peak memory"]
    assert "cpu-local" in html
    check_mfu(run)


def test_the_simulated_step_computes_on_the_runs_threads(workdir):
    """The summary records the threads each rank computed on (here 1: OMP_NUM_THREADS), and
    the report's simulated step is the simulator's on that many: a single process on a CPU
    keeps torch's default of every core, while the profile's times are one thread's."""
    from ratrain.report.run import load_run, simulate_run
    from ratrain.sim.profile import load_profile
    from ratrain.sim.simulator import simulate

    _ratrain(workdir, "train", "--data", "text", *SHORT, "--activation", "recompute",
             "--profile", "cpu-local", "--run-dir", "threads", "--no-report")
    run = load_run(workdir / "threads")
    assert run.summary["threads_per_rank"] == 1 and run.plan is not None
    t = run.cfg.train

    def simulated(threads):
        return simulate(run.plan, run.cfg.model, load_profile("cpu-local"),
                        micro_batch_size=t.micro_batch_size, seq_len=t.seq_len, dtype=t.dtype,
                        threads_per_rank=threads).step_time

    assert simulate_run(run, None)[0].step_time == pytest.approx(simulated(1))
    run.summary["threads_per_rank"] = 2
    assert simulate_run(run, None)[0].step_time == pytest.approx(simulated(2))
    assert simulated(2) < 0.7 * simulated(1)


@pytest.mark.dist
def test_planned_run_report_shows_the_budget(workdir):
    _ratrain(workdir, "plan", "--model", "tiny", "--seq-len", "64", "--profile", "cpu-local",
             "--devices", "2", "--memory-budget", "60e6", "--out", "plan.json")
    _ratrain(workdir, "train", "--plan", "plan.json", "--data", "text", *SHORT, "--run-dir", "planned")
    html = check_page(workdir / "planned" / "report",
                       {"loss.png", "throughput.png", "memory.png", "timeline.png"})
    assert "plan.json" in html and "plan&#x27;s budget" in html
    assert "simulated" in html  # on the profile the plan was made with


def test_report_of_a_directory_that_is_no_run(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "report", str(tmp_path))
    assert code == 2 and "not a ratrain run directory" in err


def test_kinds_of_actions():
    assert kind_of("F3.0") == ("forward", False)
    assert kind_of("WGS3") == ("gradient sync", True)
    assert kind_of("WRA2.1") == ("receive", True)
    assert kind_of("SG4.1") == ("send", False)
    assert kind_of("U2") == ("update", False)
    assert kind_of("WOS3") == ("outer sync", True)
    assert kind_of("ZZ1") == ("other", False)


def test_every_op_has_a_kind_and_its_wait_is_drawn_as_one():
    """OS and WOS (--sync diloco) were drawn as "other", their wait not hatched, as were RS,
    GX, SU, SN and TS with their waits (until 2026-12-02): a new op needs a kind."""
    for op in Op:
        kind, wait = kind_of(op.value + "1")
        assert kind in KIND_COLORS and kind != "other", op
        assert wait == (SPECS[op].waits is not None), op
        if wait:
            assert kind == kind_of(SPECS[op].waits.value + "1")[0], op


def test_the_last_traced_step_from_a_chrome_trace():
    # the executor's step 5 (0-based) is metrics.jsonl's step 6
    events = {0: [(4, "F1.0", 0.0, 10.0), (5, "F1.0", 100.0, 130.0), (5, "B1.0", 130.0, 190.0)],
              1: [(5, "WRA1.0", 105.0, 140.0)]}
    spans = {0: [(5, "SA1.0", 130.0, 150.0), (5, "GS1", 140.0, 200.0)], 1: []}
    trace = chrome_trace(events, {0: "rank 0", 1: "rank 1"}, spans)
    assert {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"} == {5, 6}
    step, measured = measured_step(trace)
    assert step == 6
    assert [r.label for r in measured.rows] == ["rank 0", "rank 1"]
    assert measured.rows[0].actions == [("F1.0", 0.0, pytest.approx(30e-6)),
                                        ("B1.0", pytest.approx(30e-6), pytest.approx(90e-6))]
    assert measured.rows[1].actions == [("WRA1.0", pytest.approx(5e-6), pytest.approx(40e-6))]
    assert lanes(measured.rows[0].spans) == [0, 1]  # they overlap: two lanes
    assert measured.duration == pytest.approx(100e-6)
    # a trace written before 2026-12-02 counts its steps from 0, and says nothing of it
    old = {"traceEvents": [{**e, "args": {"step": e["args"]["step"] - 1}} if e["ph"] == "X"
                           else e for e in trace["traceEvents"]]}
    assert measured_step(old)[0] == 6


def test_the_table_says_what_changes_the_algorithm_and_the_schedule(tmp_path):
    """A DiLoCo run's table named neither its sync nor what its losses are of (until
    2026-11-27), nor micro-batch groups or a split schedule's placement; a plan's gradients
    summed on the device are said."""
    from ratrain.config import RunConfig
    from ratrain.report.page import run_table
    from ratrain.report.run import Run
    from ratrain.schedule.plan import build_plan

    cfg = RunConfig()
    row = {"step": 4, "loss": 2.0, "tokens_per_s": 1.0, "peak_memory_bytes": 1}
    tables = {}
    for name, plan in (("diloco", build_plan(4, 1, 2, 4, sync="diloco:4:2")),
                       ("groups", build_plan(4, 1, 1, 4, micro_batch_group=2)),
                       ("zbh1", build_plan(4, 2, 1, 4, schedule="zbh1", weight_grad="grouped")),
                       ("summed", build_plan(4, 1, 2, 4, micro_batch_group=4, view_window=1,
                                             state_home="host", device_grad_sum=True))):
        tables[name] = dict(run_table(Run(tmp_path, cfg, [row], {}, plan), None, None))
    sync = tables["diloco"]["sync"]
    assert sync.startswith("--sync diloco:4:2: no gradient sum every step; outer Nesterov lr 0.7")
    assert "mix 0.5" in sync and "the validation loss the outer parameters'" in sync
    assert "1f1b in groups of 2" in tables["groups"]["layout"] and "sync" not in tables["groups"]
    assert "zbh1 (grouped)" in tables["zbh1"]["layout"]
    assert "summed over the replicas on the device" in tables["summed"]["plan"]
    assert "summed" not in tables["groups"]["plan"]
