"""Small gaps of `ratrain train`'s flags: --val-fraction and --eval-batches (settable only in
a --config YAML before), refusals of --keep-checkpoints and --comm-timeout that name the flag,
and byte sizes in decimal units (the planner's) in the disk check, the report and the
profile's table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError

from .cli_runner import run_cli, train_refused


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _opts(**given) -> dict:
    from ratrain.cli.options import _FIELDS

    return {**dict.fromkeys([*_FIELDS, "model", "config_file", "partition"]), **given}


def test_val_fraction_and_eval_batches_are_flags_with_their_defaults(monkeypatch, capsys):
    from ratrain.cli.options import build_config

    cfg = build_config(_opts(val_fraction=0.2, eval_batches=1))
    assert (cfg.data.val_fraction, cfg.train.eval_batches) == (0.2, 1)
    code, out, _ = run_cli(monkeypatch, capsys, "train", "--help")
    assert code == 0
    words = " ".join(out.split())  # (click wraps the help)
    assert "--val-fraction FLOAT" in words and "--eval-batches INTEGER" in words
    assert "[default: 0.05]" in words and "[default: 4]" in words


@pytest.mark.parametrize("args,line", [
    (["--val-fraction", "1"], "error: --val-fraction (data.val_fraction) must be in [0, 1), got 1.0"),
    (["--eval-batches", "-1"], "error: --eval-batches (train.eval_batches) must be >= 0, got -1"),
    (["--keep-checkpoints", "0"],
     "error: --keep-checkpoints (train.keep_checkpoints) must be positive, got 0"),
    (["--comm-timeout", "nan"],
     "error: --comm-timeout (parallel.comm_timeout_s) must be in (0, 604800] seconds, got nan"),
    # (--grad-clip and --warmup-steps: flags since 2026-12-04, config keys before)
    (["--grad-clip", "-1"], "error: --grad-clip (train.grad_clip) must be >= 0, got -1.0"),
    (["--grad-clip", "inf"], "error: --grad-clip (train.grad_clip) must be a finite number, got inf"),
    (["--warmup-steps", "-1"], "error: --warmup-steps (train.warmup_steps) must be >= 0, got -1"),
])
def test_a_bad_value_is_refused_naming_its_flag(monkeypatch, capsys, tmp_path, args, line):
    assert train_refused(monkeypatch, capsys, *args) == line
    assert not (tmp_path / "runs").exists()


def test_a_resume_may_change_eval_batches_but_not_the_split(monkeypatch, capsys, tmp_path):
    from ratrain.cli.options import build_config
    from ratrain.cli.train_resume import check_same_run

    run = tmp_path / "run"
    run.mkdir()
    RunConfig().save(run / "config.yaml")
    resume = ("--resume", "run", "--steps", "4")
    assert train_refused(monkeypatch, capsys, *resume, "--val-fraction", "0.1") == (
        "error: cannot change --val-fraction (0.05 -> 0.1) when resuming; start a new run instead")
    # the run's own split again, and another validation size: past the settings, to the
    # missing checkpoint
    assert "no checkpoint in run/checkpoints" in train_refused(
        monkeypatch, capsys, *resume, "--val-fraction", "0.05", "--eval-batches", "2")
    assert build_config(_opts(eval_batches=2), str(run)).train.eval_batches == 2
    # --resume auto and a --config given again hold the same fields fixed
    again = RunConfig()
    again.train.eval_batches = 2
    check_same_run(again, run)
    again.data.val_fraction = 0.1
    with pytest.raises(UserError, match=r"was started with other settings: --val-fraction 0.05 "
                                        r"\(this command: 0.1\)"):
        check_same_run(again, run)


def _free(monkeypatch, free_bytes: float) -> None:
    monkeypatch.setattr("ratrain.training.disk_room.shutil.disk_usage",
                        lambda path: shutil._ntuple_diskusage(1 << 45, 0, int(free_bytes)))


def test_the_disk_check_says_sizes_in_decimal_units(monkeypatch):
    """It said "77115.0 MiB" for llama2-7b's checkpoint where the planner says GB."""
    from ratrain.models.presets import get_preset
    from ratrain.training.run_dir import check_run_dir

    cfg = RunConfig(model=get_preset("llama2-7b"))  # 6.74B parameters x 12 bytes
    _free(monkeypatch, 100e9)
    with pytest.raises(UserError) as refused:
        check_run_dir(Path("run"), cfg)
    said = str(refused.value)
    assert ("100.00 GB free, a checkpoint of llama2-7b takes about 80.86 GB and this run needs "
            "room for 3 at once (the newest 2 kept while the next is written): 242.58 GB") in said
    assert "MiB" not in said


def test_the_report_and_the_profile_table_say_sizes_in_decimal_units():
    from ratrain.profiling.table import summary_rows
    from ratrain.report.memory import axis_unit
    from ratrain.sim.profile import MeasuredShape, UnitTimes, load_profile

    profile = load_profile("cpu-local")
    times = UnitTimes(1e-3, 2e-3)
    profile.measured = [MeasuredShape("tiny", 256, 2, "float32", times, times, times, 9e-4)]
    profile.device.memory_bytes, profile.device.process_overhead_bytes = 20e9, 37e6
    rows = dict(summary_rows(profile)[1])
    assert rows["memory per device"] == "20.00 GB"
    assert rows["process memory beyond the ledger"].startswith("37.00 MB + ")
    assert axis_unit(5e8) == (1e6, "MB") and axis_unit(2e9) == (1e9, "GB")
