"""Lines said to the user that named a wrong way out, a false reason, or a run it knew but did
not name (run directory locks, lost checkpoints, a tokenizer file that is JSON of another kind)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError

from .test_checkpoint_dir_sharing import _HOLD, _steps
from .test_checkpoint_options import _config, _refused, _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def held_run(tmp_path):
    """tmp_path/run, whose lock another process holds."""
    from ratrain.training.run_lock import release_run_dirs

    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run / ".lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield run
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        release_run_dirs()


def test_a_resume_of_a_running_run_says_only_to_wait(held_run):
    """It said 'or choose another --run-dir': a resume goes on in its own directory."""
    from ratrain.training.run_dir import open_run_dir

    with pytest.raises(UserError, match=r"is in use by another run .*; wait for it to end$"):
        open_run_dir(held_run, RunConfig(), resume=True)


def test_resume_auto_on_a_running_run_is_refused_before_a_start_is_said(held_run, capsys):
    """It said 'starting the run from step 0', then that the directory was in use."""
    from ratrain.cli.train_resume import auto_resume

    with pytest.raises(UserError, match=r"is in use by another run .*; wait for it to end$"):
        auto_resume(held_run, RunConfig())
    assert "starting the run" not in capsys.readouterr().err


def test_a_new_run_on_a_finished_runs_checkpoint_dir_names_that_run(monkeypatch, capsys,
                                                                     tmp_path):
    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "a",
                  "--checkpoint-dir", "ckpts")[0] == 0
    _refused(monkeypatch, capsys, f"continue that run with --resume {tmp_path / 'a'}, or choose "
             "another directory", "--config", cfg, "--run-dir", "b", "--checkpoint-dir", "ckpts")


def test_a_resume_over_lost_checkpoints_says_a_way_out_that_works(monkeypatch, capsys,
                                                                  tmp_path):
    """--resume RUN said to remove RUN/metrics.jsonl, after which --resume RUN said the run
    'had not reached' a checkpoint (its summary.json said it had)."""
    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run")[0] == 0
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    (tmp_path / "run" / "checkpoints").mkdir()
    line = _refused(monkeypatch, capsys, "past 2 of its save points", "--resume", "run",
                    "--steps", "6")
    assert line.endswith("to start the run over, remove run/metrics.jsonl and train with "
                         "--resume auto --run-dir run (or start a new run in another --run-dir)")
    (tmp_path / "run" / "metrics.jsonl").unlink()
    line = _refused(monkeypatch, capsys, "no checkpoint in run/checkpoints, though "
                    "run/summary.json shows the run reached step 4 (it saves one every 2 steps "
                    "and at its end): its checkpoints were moved or deleted", "--resume", "run",
                    "--steps", "6")
    assert "had not reached" not in line
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", "--resume",
                       "auto")  # the way out said
    assert code == 0, err
    assert _steps(tmp_path / "run") == [1, 2, 3, 4]


def test_a_run_saving_every_step_is_said_to(monkeypatch, capsys, tmp_path):
    cfg = str(_config(tmp_path, checkpoint_every=1))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run")[0] == 0
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    for name in ("metrics.jsonl", "summary.json"):
        (tmp_path / "run" / name).unlink()
    _refused(monkeypatch, capsys, "the run saves one every step and at its end, and had not "
             "reached one", "--resume", "run", "--steps", "6")


def test_a_tokenizer_file_of_other_json_is_said_to_be_no_tokenizer(tmp_path):
    from ratrain.data.tokenizer import load_tokenizer

    (tmp_path / "a.json").write_text('{"a": 1}')
    with pytest.raises(UserError, match=r"^tokenizer .*a.json is JSON but not a Hugging Face "
                       r"tokenizer.json; --tokenizer takes"):
        load_tokenizer(str(tmp_path / "a.json"))


def test_a_peak_over_the_budget_says_what_is_outside_the_plan():
    """It said a budget smaller by the process's own would help (in a test: the same plan, the
    same peak), and to profile the machine where --profile was given."""
    from ratrain.cli.train_budget import over_budget

    plan = {"prediction": {"stage_peak_bytes": [200_000_000, 300_000_000]}}
    said = over_budget({"peak_memory_bytes": 524_000_000}, "480MB", plan, profiled=True)
    assert said.endswith("; 224.00 MB of the peak is outside the plan's predicted 300.00 MB"), said
    assert "smaller" not in said and "ratrain profile" not in said
    assert "`ratrain profile`, then --profile" in over_budget(
        {"peak_memory_bytes": 524_000_000}, "480MB", plan)


def test_a_budget_the_process_alone_fills_is_said_at_the_start(monkeypatch, capsys, tmp_path):
    import ratrain.runtime.process_memory
    import ratrain.training.run

    from .test_budget_said import _fake_run
    from .cli_runner import run_cli

    monkeypatch.setattr(ratrain.runtime.process_memory, "resident_bytes", lambda: 700_000_000)
    monkeypatch.setattr(ratrain.training.run, "train", _fake_run(400_000_000))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--memory-budget", "600MB",
                           "--no-progress", "--no-report", "--run-dir", "run")
    assert code == 0, err
    first = err.splitlines()[0]
    assert first == ("warning: the process's own memory, 700.00 MB (Python, torch), is at or "
                     "over --memory-budget 600.00 MB by itself: no plan can hold a rank's "
                     "process to the budget"), err


def test_a_resumed_diloco_run_counts_the_meetings_it_has_left():
    """A resume from step 4 under diloco:4 over 6 steps meets once, at step 6: the note said
    "twice, after step 4 and at the last", counting from step 0."""
    from ratrain.training.prepare import meetings_note

    cfg = RunConfig()
    cfg.parallel.sync, cfg.train.steps = "diloco:4", 6
    assert "over 6 steps: the replicas meet twice, after step 4 and at the last" in meetings_note(cfg)
    assert "over steps 5-6: the replicas meet once, at the last step" in meetings_note(cfg, 4)
    cfg.parallel.sync = "diloco:3"
    assert meetings_note(cfg) is None  # twice in 6 steps, every 3: H is no surprise there
    cfg.parallel.sync = "diloco:1000000000"  # (a huge H counts no steps one by one)
    assert "over steps 3-6: the replicas meet once" in meetings_note(cfg, 2)
