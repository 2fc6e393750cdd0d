"""The run directory a run starts in or goes on in (training/run_dir.py, run_lock.py,
cli/train_resume.py): a new run does not take another's, one run at a time, --resume goes on
in its own directory, from its own checkpoints, with its own settings and files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.metrics import read_metrics

from .cli_runner import small_config
from .test_checkpoint_options import _refused, _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl")]


def _trained(monkeypatch, capsys, tmp_path, *args: str) -> str:
    """A run of 4 steps in tmp_path/run, a checkpoint every 2; its config file."""
    cfg = str(small_config(tmp_path, steps=4, checkpoint_every=2))
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", *args)
    assert code == 0, err
    return cfg


def test_a_new_run_does_not_take_a_run_directory_that_holds_a_run(monkeypatch, capsys, tmp_path):
    """It rewrote config.yaml and metrics.jsonl, and its keep-K removed the run's checkpoints."""
    cfg = _trained(monkeypatch, capsys, tmp_path)
    _refused(monkeypatch, capsys, "run directory run holds a run already (its checkpoints "
             "(step_000004)); continue it with --resume run (or --resume auto --run-dir run), or "
             "choose another --run-dir", "--config", cfg, "--run-dir", "run")
    assert _steps(tmp_path / "run") == [1, 2, 3, 4]
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "fresh", "--resume",
                       "auto")  # a new directory: --resume auto starts the run there
    assert code == 0, err
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", "--resume",
                       "auto", "--steps", "6")  # and on a run, continues it
    assert code == 0, err
    assert _steps(tmp_path / "run") == list(range(1, 7))
    # metrics without a checkpoint (--no-checkpoints) are a run's too
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "none",
                  "--no-checkpoints")[0] == 0
    _refused(monkeypatch, capsys, "(the metrics of a run that reached step 4)", "--config", cfg,
             "--run-dir", "none")


def test_resume_auto_with_a_new_checkpoint_dir_resumes_from_the_runs_own(monkeypatch, capsys,
                                                                       tmp_path):
    """It looked in the new directory only, found none, and started the run over."""
    cfg = _trained(monkeypatch, capsys, tmp_path)
    own = tmp_path / "run" / "checkpoints"
    own.rename(tmp_path / "away")
    _refused(monkeypatch, capsys, f"--resume auto: the run's checkpoint directory {own.relative_to(tmp_path)} "
             "does not exist (moved or deleted?), though the run reached step 4", "--config", cfg,
             "--run-dir", "run", "--resume", "auto", "--checkpoint-dir", "new", "--steps", "6")
    (tmp_path / "away").rename(own)
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", "--resume",
                       "auto", "--checkpoint-dir", "new", "--steps", "6")
    assert code == 0, err
    assert f"--checkpoint-dir {tmp_path / 'new'} holds no checkpoint: resuming from the run's " \
           f"own, in run/checkpoints; the new ones go to {tmp_path / 'new'}" in err
    assert _steps(tmp_path / "run") == list(range(1, 7))
    assert [p.name for p in checkpoint.complete_dirs(checkpoint.Elsewhere(tmp_path / "new"))] == [
        "step_000006"]


def _saved(root: Path, step: int, **train) -> None:
    files = checkpoint.save_units(root, step, {0: {"weights": {"w": torch.zeros(2)},
                                                   "optim": None}})
    checkpoint.finalize(root, step, {"config": {"train": train, "data": {"path": "text"}},
                                     "loader": {}, "rng": {}}, files, keep=2)


def test_a_checkpoint_of_another_run_of_the_model_is_refused(tmp_path):
    """Only the model was compared: --checkpoint-dir holding another run's checkpoints (other
    seq-len, lr, batch or seed) was resumed from. (The run's own checkpoints are not held to
    the settings: the Python API resumes them with others, as test_diloco does at lr 1e-30.)"""
    from ratrain.training.run_dir import resume_point

    (tmp_path / "text").write_text("x")
    cfg = RunConfig()
    cfg.data.path = str(tmp_path / "text")  # the relative "text" it was saved with, from here
    _saved(tmp_path, 2)
    cfg.save(tmp_path / "config.yaml")  # the run's own checkpoints: in RUN/checkpoints
    assert resume_point(tmp_path, cfg).name == "step_000002"
    _saved(tmp_path / "other", 2, seq_len=32, lr=0.5)
    cfg.train.checkpoint_dir = str(tmp_path / "other" / "checkpoints")
    with pytest.raises(UserError, match=r"step_000002 is of another run: it was saved with "
                       r"train.seq_len = 32, this run has 256$"):
        resume_point(tmp_path, cfg)
    # every setting of the run's math is held to it (until 2026-12-02 only seq-len, batch,
    # lr, seed, dtype and data: a run of another warmup was resumed from), but not the
    # micro-batch, which a resume on more replicas fits to a replica's share
    _saved(tmp_path / "warm", 2, warmup_steps=5)
    cfg.train.checkpoint_dir = str(tmp_path / "warm" / "checkpoints")
    with pytest.raises(UserError, match=r"saved with train.warmup_steps = 5, this run has 30$"):
        resume_point(tmp_path, cfg)
    _saved(tmp_path / "micro", 2, micro_batch_size=1)
    cfg.train.checkpoint_dir = str(tmp_path / "micro" / "checkpoints")
    assert resume_point(tmp_path, cfg).parent == tmp_path / "micro" / "checkpoints"


def test_every_way_of_resuming_holds_the_same_settings_fixed(tmp_path):
    """--resume RUN refused a flag's change by one list, --resume auto and a --config given
    again by another: `--resume RUN --outer-lr 0.3` was taken and `--resume auto ... --outer-lr
    0.3` refused. One table now (training/resume_settings.py), read by both."""
    from ratrain.cli.options import _FIELDS, build_config
    from ratrain.cli.train_resume import check_same_run

    run = tmp_path / "run"
    run.mkdir()
    RunConfig().save(run / "config.yaml")
    for changed, fixed in (({"outer_lr": 0.3}, False), ({"steps": 9}, False),
                           ({"lr": 0.5}, True), ({"micro_batch_size": 4}, True)):
        again = RunConfig()
        for key, value in changed.items():
            setattr(again.train, key, value)
        opts = dict.fromkeys([*_FIELDS, "model", "config_file", "partition"])
        opts.update(changed)
        if fixed:
            with pytest.raises(UserError, match="was started with other settings: --"):
                check_same_run(again, run)
            with pytest.raises(UserError, match="cannot change --"):
                build_config(opts, str(run))
        else:
            check_same_run(again, run)
            assert build_config(opts, str(run)).train == again.train


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"4242 on elsewhere")
print("held", flush=True)
time.sleep(60)
"""


def test_one_run_at_a_time_in_a_run_directory_and_a_dead_ones_lock_is_gone(tmp_path):
    """Two runs into one directory interleaved metrics.jsonl, and one died with "no
    manifest.json". A process that dies (SIGKILL here) holds the directory no longer."""
    from ratrain.training.run_dir import open_run_dir

    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run / ".lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cfg = RunConfig()
        cfg.train.checkpoints = False
        with pytest.raises(UserError, match=r"^run directory .*run is in use by another run "
                           r"\(process 4242 on elsewhere, which holds .*run/.lock\); wait for it "
                           r"to end, or choose another --run-dir$"):
            open_run_dir(run, cfg)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    from ratrain.training.run_lock import release_run_dirs

    try:
        assert open_run_dir(run, cfg).path == run
        assert open_run_dir(run, cfg).path == run  # this process's own again
        child = subprocess.run([sys.executable, "-c", _HOLD.replace("LOCK_EX", "LOCK_EX | "
                                "fcntl.LOCK_NB"), str(run / ".lock")], capture_output=True)
        assert child.returncode != 0 and b"BlockingIOError" in child.stderr  # held by this one
    finally:
        release_run_dirs()


def test_resume_with_another_run_dir_is_refused(monkeypatch, capsys, tmp_path):
    """--run-dir OTHER was ignored: the run went on in RUN."""
    _refused(monkeypatch, capsys, "--resume run continues the run in run, and --run-dir names "
             "another directory (other)", "--resume", "run", "--run-dir", "other")
    _refused(monkeypatch, capsys, "--resume run: no such directory", "--resume", "run",
             "--run-dir", str(tmp_path / "run"))  # the same directory: on to the next check


def test_the_runs_own_config_file_may_be_given_again_on_resume(monkeypatch, capsys, tmp_path):
    """A job's command line repeated: "cannot change --config when resuming" though the file
    gave the run's own settings."""
    cfg = _trained(monkeypatch, capsys, tmp_path)
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--config", cfg, "--steps", "6")
    assert code == 0, err
    assert _steps(tmp_path / "run") == list(range(1, 7))
    other = tmp_path / "other.yaml"
    changed = yaml.safe_load(Path(cfg).read_text())
    changed["train"]["lr"] = 0.01
    other.write_text(yaml.safe_dump(changed))
    _refused(monkeypatch, capsys, f"cannot change train.lr (0.003 -> 0.01) when resuming: "
             f"--config {other} (with the flags given) sets it; start a new run instead",
             "--resume", "run", "--config", str(other), "--steps", "8")
    _refused(monkeypatch, capsys, "cannot change train.seq_len (16 -> 32)", "--resume", "run",
             "--config", cfg, "--seq-len", "32", "--steps", "8")


def test_data_paths_are_stored_absolute_and_compared_by_the_file_they_name(monkeypatch, capsys,
                                                                          tmp_path):
    """A relative --data was stored as given: a resume from another directory found none (or
    another file of its name), and the same file spelled absolute was refused as a change."""
    _trained(monkeypatch, capsys, tmp_path, "--data", "text")
    config = tmp_path / "run" / "config.yaml"
    assert RunConfig.load(config).data.path == str(tmp_path / "text")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, err = _train(monkeypatch, capsys, "--resume", "../run", "--steps", "6", "--data",
                       str(tmp_path / "text"))
    assert code == 0, err
    # an older run's relative path: read from here as before, and the path looked for is said
    saved = yaml.safe_load(config.read_text())
    saved["data"]["path"] = "text"
    config.write_text(yaml.safe_dump(saved))
    _refused(monkeypatch, capsys, f"data path not found: text (../run/config.yaml holds the data "
             f"path text relative to the directory the run was started in; looked for "
             f"{tmp_path / 'elsewhere' / 'text'}): resume from that directory", "--resume",
             "../run", "--steps", "8")
    _refused(monkeypatch, capsys, f"cannot change --data (text, here {tmp_path / 'elsewhere' / 'text'}"
             f" -> {tmp_path / 'text'})", "--resume", "../run", "--steps", "8", "--data",
             str(tmp_path / "text"))
    monkeypatch.chdir(tmp_path)
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--steps", "8")
    assert code == 0, err
    assert f"note: run/config.yaml holds the data path text relative to the directory the run " \
           f"was started in; reading {tmp_path / 'text'}" in err
    assert RunConfig.load(config).data.path == str(tmp_path / "text")
    assert os.path.isabs(RunConfig.load(config).data.path)
