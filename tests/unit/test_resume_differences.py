"""`--resume auto` under a command of other settings than the run's names every difference at
once, each as the flag that gives the run's (cli/train_resume.check_same_run): until 2026-12-04
it named one a try, as a config field and a Python repr ("data.path = '/x', this run has
None"), and offered only another --run-dir."""

from __future__ import annotations

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.training.metrics import read_metrics

from .cli_runner import run_cli, small_config


def _refusal(cfg: RunConfig, run, config_file: str | None = None) -> str:
    from ratrain.cli.train_resume import check_same_run

    with pytest.raises(UserError) as refused:
        check_same_run(cfg, run, config_file)
    return str(refused.value)


def _run(tmp_path, **train) -> tuple:
    run = tmp_path / "run"
    run.mkdir()
    saved = RunConfig(model=get_preset("tiny"))
    for key, value in train.items():
        setattr(saved.train, key, value)
    return run, saved


def test_every_difference_is_a_flag_on_a_line_of_its_own(tmp_path):
    run, saved = _run(tmp_path, seq_len=32, global_batch=4, weight_decay=0.05)
    texts = tmp_path / "my texts"
    saved.data.path = str(texts)
    saved.save(run / "config.yaml")
    assert _refusal(RunConfig(model=get_preset("tiny")), run) == (
        f"--resume auto: {run} was started with other settings; pass the run's own settings "
        f"again (--config {run}/config.yaml holds them all), or choose another --run-dir:\n"
        f"  --data '{texts}' (this command: none, the standard library)\n"
        "  --seq-len 32 (this command: 256)\n"
        "  --global-batch 4 (this command: 8)\n"
        "  train.weight_decay 0.05 (a --config's; this command: 0.1)")


def test_the_model_is_its_flag_and_two_differences_are_one_line(tmp_path):
    run, saved = _run(tmp_path, lr=0.01)
    saved.save(run / "config.yaml")
    now = RunConfig(model=get_preset("tiny-gqa"))
    now.data.path = "/data/texts"
    lines = _refusal(now, run).splitlines()
    assert lines[1:] == ["  --model tiny (this command: tiny-gqa)",
                         "  no --data: the standard library (this command: /data/texts)",
                         "  --lr 0.01 (this command: 0.003)"]
    now = RunConfig(model=get_preset("tiny"))
    now.train.seq_len = 64
    assert _refusal(now, run) == (
        f"--resume auto: {run} was started with other settings: --seq-len 256 (this command: "
        "64); --lr 0.01 (this command: 0.003). Pass the run's own settings again (--config "
        f"{run}/config.yaml holds them all), or choose another --run-dir")


def test_a_config_given_again_is_refused_for_every_field_it_changes(tmp_path):
    run, saved = _run(tmp_path)
    saved.save(run / "config.yaml")
    now = RunConfig(model=get_preset("tiny"))
    now.train.lr, now.train.seq_len = 0.01, 32
    assert _refusal(now, run, "other.yaml") == (
        "cannot change train.seq_len (256 -> 32), train.lr (0.003 -> 0.01) when resuming: "
        "--config other.yaml (with the flags given) sets them; start a new run instead")


def test_the_command_line_of_another_run_is_told_the_runs_own_and_its_config_resumes(
        monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    train = ("train", "--no-progress", "--no-report", "--no-trace", "--threads", "1",
             "--run-dir", "run", "--resume", "auto")
    code, _, err = run_cli(monkeypatch, capsys, *train, "--config", str(small_config(tmp_path)))
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, *train, "--steps", "3")
    assert code == 2 and "Traceback" not in err, err
    assert err.splitlines() == [
        "error: --resume auto: run was started with other settings; pass the run's own "
        "settings again (--config run/config.yaml holds them all), or choose another --run-dir:",
        "  the model of run/config.yaml, small of 2 layers, dim 32 (a --config's; this "
        "command: tiny)",
        f"  --data {tmp_path / 'text'} (this command: none, the standard library)",
        "  --seq-len 16 (this command: 256)",
        "  --global-batch 4 (this command: 8)"]
    code, _, err = run_cli(monkeypatch, capsys, *train, "--config", "run/config.yaml",
                           "--steps", "3")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
