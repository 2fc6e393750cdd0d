"""`ratrain train --memory-budget` on a CPU holds a rank's whole process to the budget: the
search counts the process's own bytes (Python, torch) beside the plan's, says so, refuses a
budget they fill alone, and the run warns at its end where a rank's peak passed the budget.
Until 2026-12-02 a 200 MB budget searched the model's bytes alone and its ranks peaked at
524 MB, unsaid."""

from __future__ import annotations

import pytest

from ratrain.cli.plan_search import MARGIN, TIME_LIMIT_S, best_plans, search_request
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.setup.memory_fit import over_budget, with_process_base
from ratrain.sim.profile import load_profile

from .cli_runner import run_cli

BASE = 300_000_000  # a process's own bytes, fixed: the test process's own are pytest's


@pytest.fixture
def base(monkeypatch):
    import ratrain.runtime.process_memory

    monkeypatch.setattr(ratrain.runtime.process_memory, "resident_bytes", lambda: BASE)


def _peak(hw, budget: str) -> float:
    """The searched plan's largest stage, with the process's overhead, for `tiny` on 2 CPUs."""
    cfg = RunConfig(model=get_preset("tiny"))
    request = search_request(cfg, {}, hw, 2, budget, MARGIN, 1, TIME_LIMIT_S, "--memory-budget")
    return max(best_plans(request).best[0].stage_bytes)


def test_the_search_counts_the_process_on_a_cpu():
    cpu = load_profile("cpu-local")
    counted, said = with_process_base(cpu, "2GB", BASE)
    assert said == BASE
    assert counted.device.process_overhead_bytes == cpu.device.process_overhead_bytes + BASE
    alone = _peak(cpu, "2GB")  # tiny's fastest plan: about 150 MB a device
    assert _peak(counted, "2GB") == pytest.approx(alone + BASE)
    # 400 MB (360 after the margin) held the fastest plan beside nothing; beside the process
    # only a plan of 60 MB fits
    assert _peak(cpu, "400MB") == alone > 60e6
    assert BASE < _peak(with_process_base(cpu, "400MB", BASE)[0], "400MB") <= 360e6
    assert _peak(cpu, "320MB") == alone
    with pytest.raises(UserError, match="no plan fits 320.00 MB"):
        _peak(with_process_base(cpu, "320MB", BASE)[0], "320MB")


def test_a_gpus_memory_is_not_the_process():
    gpu = load_profile("h100-80g-ib")
    assert with_process_base(gpu, "20GB", BASE) == (gpu, None)


def test_a_budget_the_process_fills_alone_is_refused():
    with pytest.raises(UserError, match=r"--memory-budget 200.00 MB cannot hold a rank on this "
                       r"machine: its process holds 300.00 MB before any model"):
        with_process_base(load_profile("cpu-local"), "200MB", BASE)


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
    assert "a device with its process's own 300.00 MB" in err, err
    assert ("warning: the largest rank's peak memory, 700.00 MB, passed --memory-budget "
            "600.00 MB" in err) == warned, err


def test_train_refuses_a_budget_below_the_process(base, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--memory-budget", "200MB", "--steps",
                           "1", "--threads", "1", "--no-progress", "--no-report", "--run-dir",
                           "run")
    assert code == 2 and "error: --memory-budget 200.00 MB cannot hold a rank" in err, err
    assert not (tmp_path / "run").exists()
