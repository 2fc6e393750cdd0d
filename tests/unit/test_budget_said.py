"""`ratrain train --memory-budget` on a CPU searches the plan `ratrain plan` would (its bytes held
to the budget), says at its start that the process's own (Python, torch) come on top, and warns
at its end where a rank's peak passed the budget. Until 2026-12-02 a 200 MB budget searched and
its ranks peaked at 524 MB, unsaid."""

from __future__ import annotations

import pytest

from ratrain.cli.train_budget import over_budget

from .cli_runner import run_cli

BASE = 300_000_000  # a process's own bytes, fixed: the test process's own are pytest's


@pytest.fixture
def base(monkeypatch):
    import ratrain.runtime.process_memory

    monkeypatch.setattr(ratrain.runtime.process_memory, "resident_bytes", lambda: BASE)


def test_a_peak_over_the_budget_is_said():
    said = over_budget({"peak_memory_bytes": 524_000_000}, "480MB")
    assert said.startswith("the largest rank's peak memory, 524.00 MB, passed --memory-budget "
                           "480.00 MB"), said
    assert over_budget({"peak_memory_bytes": 480_000_000}, "480MB") is None
    assert over_budget({}, "480MB") is None


def _fake_run(peak: int):
    def train(cfg, run_dir, **kwargs):
        return {"run_dir": str(run_dir), "steps": 1, "final_loss": 5.0, "val_loss": None,
                "tokens_per_s": 100.0, "mfu": None, "peak_memory_bytes": peak}
    return train


@pytest.mark.parametrize("peak,warned", [(700_000_000, True), (400_000_000, False)])
def test_train_says_the_process_at_the_start_and_a_peak_over_at_the_end(
        base, monkeypatch, capsys, tmp_path, peak, warned):
    import ratrain.training.run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ratrain.training.run, "train", _fake_run(peak))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--memory-budget", "600MB",
                           "--no-progress", "--no-report", "--run-dir", "run")
    assert code == 0, err
    assert "a device, beside its process's own 300.00 MB (Python, torch: outside the budget)" in err, err
    assert ("warning: the largest rank's peak memory, 700.00 MB, passed --memory-budget "
            "600.00 MB" in err) == warned, err
