"""--warmup-steps and --grad-clip (settable only in a --config YAML before), and the note where
the warmup outlasted the run: the default 30 steps capped a --steps 10 run's lr at a third of
--lr, unsaid."""

from __future__ import annotations

import pytest

from ratrain.config import RunConfig, TrainConfig
from ratrain.training.metrics import read_metrics

from .cli_runner import run_cli, small_config, train_refused


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _trained(monkeypatch, capsys, tmp_path, *args: str, run: str = "run"
             ) -> tuple[str, RunConfig, list[float]]:
    """stderr, config.yaml and the lr of each step of a 2-step run with `args`, in tmp_path/run."""
    run = tmp_path / run
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           "--run-dir", str(run), "--no-report", "--no-checkpoints", *args)
    assert code == 0, err
    lrs = [row["lr"] for row in read_metrics(run / "metrics.jsonl")]
    return err, RunConfig.load(run / "config.yaml"), lrs


def test_the_flags_are_in_the_help_with_their_defaults(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "train", "--help")
    assert code == 0
    words = " ".join(out.split())  # (click wraps the help)
    assert "--warmup-steps INTEGER" in words and "--grad-clip FLOAT" in words
    assert ("0: none. A run of fewer steps never reaches --lr (said at its start, with "
            "--progress). [default: 30]") in words
    assert "0: no clipping. [default: 1.0]" in words


def test_a_warmup_longer_than_the_run_is_said_with_the_lr_it_reaches(monkeypatch, capsys,
                                                                     tmp_path):
    err, _, lrs = _trained(monkeypatch, capsys, tmp_path)  # the default warmup, 30 steps
    note = ("note: the lr warms up over 30 steps, and the run has 2: it reaches 0.0002 of "
            "--lr 0.003 (--warmup-steps N sets the warmup)")
    assert note in err.splitlines(), err
    assert lrs[-1] == pytest.approx(0.0002)
    # a note on a choice made, as the start's: not under --no-progress
    assert "warms up" not in _trained(monkeypatch, capsys, tmp_path, "--no-progress",
                                         run="quiet")[0]


def test_the_flags_set_the_run(monkeypatch, capsys, tmp_path):
    err, cfg, lrs = _trained(monkeypatch, capsys, tmp_path, "--warmup-steps", "2",
                             "--grad-clip", "0")
    assert "warms up" not in err  # two steps of warmup reach --lr at the last
    assert (cfg.train.warmup_steps, cfg.train.grad_clip) == (2, 0.0)
    assert lrs == pytest.approx([0.0015, 0.003])


def test_a_warmup_as_long_as_the_run_is_not_said():
    from ratrain.training.prepare import warmup_note

    assert warmup_note(TrainConfig(steps=10, warmup_steps=10)) is None
    assert warmup_note(TrainConfig(steps=10, warmup_steps=0)) is None
    assert "reaches 0.000909 of --lr 0.001" in warmup_note(
        TrainConfig(steps=10, warmup_steps=11, lr=0.001))


def test_a_resume_refuses_another_warmup_or_clip(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    RunConfig().save(run / "config.yaml")
    resume = ("--resume", "run", "--steps", "40")
    assert train_refused(monkeypatch, capsys, *resume, "--warmup-steps", "5") == (
        "error: cannot change --warmup-steps (30 -> 5) when resuming; start a new run instead")
    assert train_refused(monkeypatch, capsys, *resume, "--grad-clip", "0") == (
        "error: cannot change --grad-clip (1.0 -> 0.0) when resuming; start a new run instead")
    # the run's own values again: past the settings, to the missing checkpoint
    assert "no checkpoint in run/checkpoints" in train_refused(
        monkeypatch, capsys, *resume, "--warmup-steps", "30", "--grad-clip", "1")


def test_a_plan_made_without_clipping_runs_only_unclipped(monkeypatch, capsys, tmp_path):
    """Its programs take no global norm: `train --plan` with the default --grad-clip 1.0
    trained unclipped, its config.yaml saying 1.0."""
    cfg = str(small_config(tmp_path))
    plan = tmp_path / "unclipped.json"
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--config", cfg, "--pp", "2",
                           "--grad-clip", "0", "--out", str(plan))
    assert code == 0, err
    assert train_refused(monkeypatch, capsys, "--config", cfg, "--plan", str(plan)) == (
        f"error: {plan} was made without clipping (--grad-clip 0), and this run clips at 1 "
        "(--grad-clip): give --grad-clip 0, or make a plan that clips")
    _, saved, _ = _trained(monkeypatch, capsys, tmp_path, "--plan", str(plan),
                           "--grad-clip", "0")
    assert saved.train.grad_clip == 0.0
