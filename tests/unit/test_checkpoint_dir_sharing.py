"""A --checkpoint-dir is one run's (training/run_lock.py, run_dir.py, cli/train_resume.py): two
runs of other run directories do not write into one, a resume does not go on from another
run's checkpoints, `--resume auto` never starts over silently, and a resume under another
--sync says what it changes (training/resuming.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ratrain.config import ParallelConfig, RunConfig
from ratrain.errors import UserError
from ratrain.training.metrics import read_metrics

from .test_checkpoint_options import _config, _refused, _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl")]


_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"4242 on elsewhere for run /runs/a")
print("held", flush=True)
sys.stdin.read()
"""


def test_a_checkpoint_dir_in_use_by_another_run_is_refused_naming_that_run(tmp_path):
    """Two runs of other --run-dirs and one --checkpoint-dir both trained, each saving into it
    (and the keep-K of each removing the other's)."""
    from ratrain.training.run_dir import open_run_dir
    from ratrain.training.run_lock import release_run_dirs

    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    cfg = RunConfig()
    cfg.train.checkpoint_dir = str(ckpts)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(ckpts / ".lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=r"^checkpoint directory .*ckpts is in use by another "
                           r"run \(process 4242 on elsewhere for run /runs/a, which holds "
                           r".*ckpts/.lock\); wait for it to end, or choose another "
                           r"--checkpoint-dir$"):
            open_run_dir(tmp_path / "b", cfg)
        assert not (tmp_path / "b").exists()  # refused before anything was made
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    try:
        assert open_run_dir(tmp_path / "b", cfg).path == tmp_path / "b"
        assert (ckpts / ".ratrain-run").read_text() == f"{(tmp_path / 'b').resolve()}\n"
    finally:
        release_run_dirs()


def test_a_resume_from_another_runs_checkpoint_dir_is_refused(monkeypatch, capsys, tmp_path):
    """Run b, resumed with --checkpoint-dir holding run a's checkpoints of the same settings,
    went on from a's weights; --resume auto in a new directory said it 'has checkpoints but no
    config.yaml'."""
    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "a",
                  "--checkpoint-dir", "ckpts")[0] == 0
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "b")[0] == 0
    anothers = (f"checkpoint directory {tmp_path / 'ckpts'} holds the checkpoints of another run "
                f"({tmp_path / 'a'}): continue that run with --resume {tmp_path / 'a'}, or give "
                "this run its own --checkpoint-dir")
    _refused(monkeypatch, capsys, anothers, "--resume", "b", "--checkpoint-dir", "ckpts",
             "--steps", "6")
    _refused(monkeypatch, capsys, anothers, "--config", cfg, "--run-dir", "c", "--resume", "auto",
             "--checkpoint-dir", "ckpts", "--steps", "6")
    assert _steps(tmp_path / "b") == [1, 2, 3, 4]
    (tmp_path / "ckpts" / ".ratrain-run").unlink()  # as a ratrain before the record left them
    _refused(monkeypatch, capsys, f"--checkpoint-dir {tmp_path / 'ckpts'} holds checkpoints "
             "(step_000004) and c holds no run they could be of (no config.yaml)", "--config",
             cfg, "--run-dir", "c", "--resume", "auto", "--checkpoint-dir", "ckpts")
    assert not (tmp_path / "c").exists()
    code, err = _train(monkeypatch, capsys, "--resume", "a", "--steps", "6")  # its own run
    assert code == 0, err
    assert _steps(tmp_path / "a") == list(range(1, 7))


def test_resume_auto_over_an_emptied_checkpoint_dir_is_refused_and_a_start_said(
        monkeypatch, capsys, tmp_path):
    """It started the run from step 0 without a word, rewriting the metrics of a run that had
    saved at steps 2 and 4."""
    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run")[0] == 0
    for step in (2, 4):
        shutil.rmtree(tmp_path / "run" / "checkpoints" / f"step_{step:06d}")
    line = _refused(monkeypatch, capsys, "--resume auto: no checkpoint in run/checkpoints, though "
                    "run/metrics.jsonl shows the run reached step 4, past 2 of its save points",
                    "--config", cfg, "--run-dir", "run", "--resume", "auto", "--steps", "6")
    assert "remove run/metrics.jsonl first" in line
    assert _steps(tmp_path / "run") == [1, 2, 3, 4]
    # one save point passed: the run may have died writing it; it starts over, and says so
    log = tmp_path / "run" / "metrics.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:3]))
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", "--resume",
                       "auto")
    assert code == 0, err
    assert "--resume auto: no checkpoint in run/checkpoints: starting the run from step 0" in err
    assert _steps(tmp_path / "run") == [1, 2, 3, 4]


def _parallel(sync: str, dp: int = 2) -> ParallelConfig:
    return ParallelConfig(dp=dp, sync=sync)


@pytest.mark.parametrize("saved, now, said", [
    ("diloco:4", "diloco:4", None),
    ("diloco:4:bf16:islands=2", "diloco:4:islands=2:bf16", None),  # one sync, spelled two ways
    ("diloco:2", "diloco:4", "--sync diloco:2 -> diloco:4: a change of the run's outer sync, "
                             "allowed on resume: each replica goes on from its own state"),
    ("diloco:4", "diloco:4:2", "--sync diloco:4 -> diloco:4:2: a change"),
    ("diloco:4", "diloco:4:bf16", "--sync diloco:4 -> diloco:4:bf16: a change"),
    ("step", "diloco:4", "--sync step -> diloco:4: the checkpoint is of a synchronous run; the "
                         "outer parameters start at its weights"),
    ("diloco:4", "step", "every replica starts from its outer parameters"),  # relayout_note
])
def test_a_resume_under_another_sync_says_what_it_changes(saved, now, said):
    """A resume under another H, fragment count or delta dtype was silent."""
    from ratrain.training.resuming import sync_change_note

    note = sync_change_note({"sync": saved, "dp": 2}, _parallel(now))
    assert note == said if said is None else said in note
