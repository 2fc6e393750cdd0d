"""`ratrain simulate --plan RUN/plan.json`: a run's record of its programs holds no "run"
settings, as a plan file does; it is simulated with the run's config.yaml beside it (its
model, sequence, batch and profile). Until 2026-12-04 it simulated the default 256 tokens on
cpu-local without a word."""

from __future__ import annotations

import json

from .cli_runner import run_cli, run_cli_ok, small_config


def test_a_runs_own_plan_is_simulated_as_the_run_ran(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    cfg = small_config(tmp_path, steps=1, checkpoint_every=0)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(cfg), "--pp", "2",
                           "--run-dir", "run", "--no-progress", "--no-report", "--no-checkpoints",
                           "--profile", "cpu-local", "--threads", "1")
    assert code == 0, err
    said = json.loads(run_cli_ok(monkeypatch, capsys, "simulate", "--plan", "run/plan.json",
                                 "--json"))
    assert (said["seq_len"], said["global_batch"]) == (16, 4), said  # small_config's, not 256
    assert said["profile"] == "cpu-local"
