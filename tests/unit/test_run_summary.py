"""What a run records of itself: summary.json of the whole run across a resume (tokens/s,
memory peaks, the MFU peak, its directory), metrics.jsonl a strict JSON parser reads, RSS
peaks that do not fall, and a progress bar that shows the step it counts and ends before the
run's last word."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from tqdm import tqdm

from ratrain import checkpoint
from ratrain.runtime import process_memory
from ratrain.training import loop, mfu
from ratrain.training.metrics import MetricsLog, read_metrics

from .cli_runner import run_cli, small_config

HUGE = 2**40  # an earlier part's peak no small run reaches


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _train(monkeypatch, capsys, *args: str) -> str:
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-report", "--no-trace", *args)
    assert code == 0, err
    return err


def _strict_rows(path: Path) -> list[dict]:
    """metrics.jsonl as a parser without Python's NaN and Infinity reads it."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def _rewrite(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_resumed_runs_summary_is_of_the_whole_run(monkeypatch, capsys, tmp_path):
    cfg = str(small_config(tmp_path, steps=4, checkpoint_every=2))
    _train(monkeypatch, capsys, "--no-progress", "--config", cfg, "--run-dir", "run")
    log = tmp_path / "run" / "metrics.jsonl"
    rows = read_metrics(log)
    assert "rss_growth_bytes_per_rank" in rows[-1]
    # the first part, as if its step 3 had stalled and its peaks had been far higher
    rows[2].update(tokens_per_s=2.0, step_time_s=40.0)
    rows[1]["peak_memory_bytes"] = 2 * HUGE
    rows[-1]["rss_growth_bytes_per_rank"] = [HUGE]
    _rewrite(log, rows)
    _train(monkeypatch, capsys, "--no-progress", "--resume", "run", "--steps", "6")

    rows = _strict_rows(log)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["step"] for r in rows if r.get("resumed")] == [5]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["run_dir"] == str(tmp_path / "run")  # resumed as "run": absolute all the same
    # every part's steps but its first: the first's 2-4 (the stall too) and the resume's 6
    timed = [r for r in rows if r["step"] in (2, 3, 4, 6)]
    want = (sum(r["tokens_per_s"] * r["step_time_s"] for r in timed)
            / sum(r["step_time_s"] for r in timed))
    assert summary["tokens_per_s"] == pytest.approx(want, rel=1e-9)
    assert summary["tokens_per_s_of_steps"] == "2-4, 6"
    # the run's peaks: the resumed part's rows and the summary keep the first part's
    assert all(r["peak_memory_bytes"] == 2 * HUGE for r in rows[4:])
    assert all(r["rss_growth_bytes_per_rank"] == [HUGE] for r in rows[4:]
               if "rss_growth_bytes_per_rank" in r)
    assert summary["peak_memory_bytes"] == 2 * HUGE
    assert summary["rss_growth_bytes_per_stage"] == [HUGE]
    assert "memory_peaks_from_step" not in summary


def test_a_resume_on_the_same_machine_keeps_the_measured_peak(monkeypatch, capsys, tmp_path):
    measured = []

    def measure(dtype="float32"):  # each start's measurement would differ, as on a busy machine
        measured.append(dtype)
        return 1e9 * len(measured)

    monkeypatch.setattr(mfu, "measure_cpu_core_peak", measure)
    cfg = str(small_config(tmp_path, steps=2, checkpoint_every=2))
    _train(monkeypatch, capsys, "--no-progress", "--config", cfg, "--run-dir", "run")
    saved = checkpoint.load_meta(tmp_path / "run" / "checkpoints" / "step_000002")
    assert saved["cpu_core_peak"]["flops_per_core"] == 1e9
    _train(monkeypatch, capsys, "--no-progress", "--resume", "run", "--steps", "4")
    assert len(measured) == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["peak_flops_source"].startswith("measured at an earlier start of the run: ")
    assert " 1 GFLOP/s per core x " in summary["peak_flops_source"]
    # one denominator for every row: MFU over tokens/s is the same ratio before and after
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    ratios = [r["mfu"] / r["tokens_per_s"] for r in rows]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-9)
    # another machine measures its own
    monkeypatch.setattr(mfu.platform, "node", lambda: "another-host")
    _train(monkeypatch, capsys, "--no-progress", "--resume", "run", "--steps", "6")
    assert len(measured) == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["peak_flops_source"].startswith("measured: ")
    assert " 2 GFLOP/s per core x " in summary["peak_flops_source"]


def test_metrics_jsonl_writes_what_is_not_finite_as_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"step": 1, "loss": 5.5, "grad_norm": math.inf, "loss_per_replica": [5.5, math.nan]})
    assert _strict_rows(path) == [{"step": 1, "loss": 5.5, "grad_norm": None,
                                   "loss_per_replica": [5.5, None]}]
    # a file of before this was written that way: a resume's cut-back rewrites it strictly
    with path.open("a") as f:
        f.write('{"step": 2, "loss": 5.4, "grad_norm": NaN}\n')
    kept = MetricsLog(path, resume_step=2).kept
    assert _strict_rows(path) == kept == [
        {"step": 1, "loss": 5.5, "grad_norm": None, "loss_per_replica": [5.5, None]},
        {"step": 2, "loss": 5.4, "grad_norm": None}]


def test_the_rss_peak_does_not_fall_with_the_kernels_high_water_mark(monkeypatch):
    # VmHWM read at the top of the resident set, then the kernel's lagging record of it
    status = {"VmRSS": [100], "VmHWM": [200, 180, 190]}
    monkeypatch.setattr(process_memory, "_status_bytes", lambda field: status[field].pop(0))
    monkeypatch.setattr(process_memory.Path, "write_text", lambda self, text: len(text))
    rss = process_memory.RssGrowth()
    rss.start()
    assert [rss.peak(), rss.peak(), rss.peak()] == [100, 100, 100]


def _bar_states(err: str) -> list[str]:
    return [s for s in re.split(r"[\r\n]", err) if "step/s" in s or "s/step" in s]


def test_the_progress_bar_shows_the_loss_of_the_step_it_counts(monkeypatch, capsys, tmp_path):
    class EveryStep(tqdm):  # a redraw at every update
        def __init__(self, *args, **kwargs):
            super().__init__(*args, mininterval=0, miniters=1, **kwargs)

    monkeypatch.setattr(loop, "tqdm", EveryStep)
    cfg = str(small_config(tmp_path, steps=4, checkpoint_every=0))
    err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    losses = {r["step"]: f"loss={r['loss']:.3f}" for r in rows}
    shown = [(int(m.group(1)), m.group(2)) for s in _bar_states(err)
             if (m := re.search(r" (\d+)/4 \[.*(loss=[-\d.]+)", s))]
    assert {step for step, _ in shown} == {1, 2, 3, 4}
    assert all(loss == losses[step] for step, loss in shown), (shown, losses)


def test_a_diverged_runs_error_is_said_after_its_bar(monkeypatch, capsys, tmp_path):
    cfg = str(small_config(tmp_path, steps=6, checkpoint_every=0))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-report", "--no-trace",
                           "--config", cfg, "--run-dir", "run", "--lr", "1e20")
    assert code == 2 and _bar_states(err), err
    assert err.rstrip().splitlines()[-1].startswith("error: loss is nan at step "), err


def test_a_float16_runs_summary_says_its_skips_and_a_validation_that_is_not_finite(tmp_path):
    """summary.json held a bare NaN validation loss (no strict parser reads it) and said
    nothing of the steps float16's overflow skipped."""
    from types import SimpleNamespace

    from ratrain.config import RunConfig
    from ratrain.schedule.grid import RankGrid
    from ratrain.training.run_summary import write_summary
    from ratrain.training.whole_run import RunPeaks, Throughput

    cfg = RunConfig()
    cfg.train.dtype = "float16"
    rows = [{"step": s, "loss": 5.0, "tokens_per_s": 100.0, "step_time_s": 1.0,
             "skipped": s in (1, 3), "loss_scale": 65536.0 / (2 ** (s >= 1) * 2 ** (s >= 3))}
            for s in range(1, 5)]
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for row in rows:
        log.write(row)
    last = {**rows[-1], "val_loss": math.nan}
    throughput = Throughput([])
    for row in rows[1:]:
        throughput.add(row["step"], 100.0, 1.0)
    write_summary(tmp_path, cfg, RankGrid(1, 1, "pp-dp"), last, throughput,
                  RunPeaks([], False, 0), [], [], SimpleNamespace(finish=lambda summary: None))
    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=pytest.fail)
    assert summary["skipped_steps"] == [1, 3] and summary["loss_scale"] == 16384.0
    assert summary["val_loss"] is None and summary["val_loss_not_finite"] is True
