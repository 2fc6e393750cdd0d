"""--sync diloco:...:islands=K said per island: each island's own loss in metrics.jsonl's rows,
the summary, TensorBoard and the report's loss curve (between outer syncs each island trains
its own weights); K islands that do not divide --dp refused in one line naming the flags; and
the report's MFU axis leaves out steps above 100% (a low peak, not a figure)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from ratrain.report import curves
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.outer_sync import OuterSync
from ratrain.training.metrics import read_metrics
from ratrain.training.step_meetings import StepFigures
from ratrain.training.step_rows import StepRows
from ratrain.training.tensorboard_log import scalars_of
from ratrain.training.whole_run import RunPeaks

from .cli_runner import run_cli, small_config


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _row_of(grid: RankGrid, losses_by_rank: list[float], islands: int) -> dict:
    """The row of one step whose ranks said these losses (an engine with only what it reads)."""
    engine = SimpleNamespace(outer=SimpleNamespace(sync=OuterSync(2, islands=islands)),
                             stage=SimpleNamespace(device=torch.device("cpu")))
    figures = [StepFigures(v, 1, None, None, False) for v in losses_by_rank]
    return StepRows(engine, grid, RunPeaks([], True, 0)).row({"step": 1}, figures, final=False)


def test_each_islands_loss_is_the_mean_of_its_own_replicas():
    # pp 2 x dp 4 (pp-dp: rank = stage * dp + replica), islands of replicas {0, 1} and {2, 3};
    # an island's replicas hold its mean (their gradients, and the loss, summed every step)
    per_replica = [1.0, 1.0, 3.0, 3.0]
    row = _row_of(RankGrid(2, 4), per_replica * 2, islands=2)
    assert row["loss_per_replica"] == per_replica
    assert row["loss_per_island"] == [1.0, 3.0]
    assert row["loss"] == pytest.approx(2.0)
    assert "loss_per_island" not in _row_of(RankGrid(1, 2), [1.0, 3.0], islands=None)


def test_a_run_says_each_islands_loss_in_its_rows_summary_and_tensorboard(
        monkeypatch, capsys, tmp_path):
    cfg = small_config(tmp_path, steps=4, checkpoint_every=0)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-progress", "--no-report",
                           "--no-trace", "--no-checkpoints", "--config", str(cfg),
                           "--run-dir", "run", "--dp", "2", "--sync", "diloco:2:islands=2",
                           "--threads", "1")
    assert code == 0, err
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert len(r["loss_per_island"]) == 2, r
        assert sum(r["loss_per_island"]) / 2 == pytest.approx(r["loss"], rel=1e-12), r
    # islands of one replica: each island's loss is its replica's
    assert rows[0]["loss_per_island"] == rows[0]["loss_per_replica"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["loss_per_island"] == rows[-1]["loss_per_island"]
    tags = scalars_of(rows[-1])
    assert [tags["loss/train/island_0"], tags["loss/train/island_1"]] == rows[-1]["loss_per_island"]


@pytest.mark.parametrize("dp, islands, fits", [(3, 2, "3"), (6, 4, "2, 3, 6"), (2, 3, "2")])
def test_islands_that_do_not_divide_dp_are_refused_naming_the_flags(monkeypatch, capsys, dp,
                                                                     islands, fits):
    sync = f"diloco:2:islands={islands}"
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--global-batch",
                           str(2 * dp), "--schedule", "1f1b", "--dp", str(dp), "--sync", sync)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"--sync {sync}" in lines[0] and f"--dp {dp}" in lines[0], lines[0]
    assert f"islands=K with K one of {fits}," in lines[0], lines[0]


def _drawn(monkeypatch) -> list:
    """The figures the curves save, kept open to be looked at."""
    figures = []
    monkeypatch.setattr(curves, "save", lambda fig, path: figures.append(fig) or path)
    return figures


def test_the_loss_curve_draws_one_faint_line_per_island(monkeypatch, tmp_path):
    figures = _drawn(monkeypatch)
    rows = [{"step": s, "loss": 2.0, "loss_per_replica": [1.0, 1.0, 3.0, 3.0],
             "loss_per_island": [1.0, 3.0]} for s in (1, 2)]
    curves.plot_loss(rows, tmp_path / "loss.png", "t")
    lines = figures[0].axes[0].get_lines()
    own = [line for line in lines if line.get_color() == "0.6"]
    assert [list(line.get_ydata()) for line in own] == [[1.0, 1.0], [3.0, 3.0]]
    labels = [line.get_label() for line in lines]
    assert "each island's own" in labels and "training loss (islands' mean)" in labels


def test_the_mfu_axis_leaves_out_steps_above_100_percent(monkeypatch, tmp_path):
    figures = _drawn(monkeypatch)
    rows = [{"step": s, "tokens_per_s": 100.0, "mfu": m} for s, m in ((1, 0.5), (2, 1.16), (3, 0.6))]
    curves.plot_throughput(rows, tmp_path / "throughput.png", "t")
    mfu_axis = figures[0].axes[1]
    drawn = [line for line in mfu_axis.get_lines() if len(line.get_xdata())]
    assert len(drawn) == 1
    shown = {x: y for x, y in zip(drawn[0].get_xdata(), drawn[0].get_ydata()) if math.isfinite(y)}
    assert shown == {1: 50.0, 3: 60.0}  # the line breaks at step 2
    said = [t.get_text() for t in mfu_axis.get_legend().get_texts()]
    assert any("1 step(s) left out" in t and "116%" in t and "peak is low" in t for t in said), said
