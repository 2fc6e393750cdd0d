"""What a resume says of the run it goes on with: the checkpoint it takes, and a run directory
it cannot take (gone, its config.yaml gone or refused); and a save that Ctrl-C stops."""

from __future__ import annotations

import pytest
import torch
import yaml

from ratrain.checkpoint import store
from ratrain.runtime.launch import _Terminated

from .cli_runner import run_cli, small_config
from .wrapped_file import WrappedFile


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run of 2 steps, a checkpoint after each; tests copy it before changing it."""
    import sys

    tmp = tmp_path_factory.mktemp("resume_said")
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sys, "argv", ["ratrain", "train", "--config", str(small_config(tmp)),
                                 "--run-dir", str(tmp / "run"), "--no-progress", "--no-report"])
        from ratrain.cli import main
        with pytest.raises(SystemExit) as ended:
            main()
        assert ended.value.code == 0
    finally:
        mp.undo()
    return tmp / "run"


def _copy(run, tmp_path):
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_a_resume_says_which_checkpoint_it_goes_on_from(monkeypatch, capsys, run, tmp_path):
    run_dir = _copy(run, tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run_dir), "--steps",
                           "3", "--no-report")
    assert code == 0, err
    assert "resuming from step_000002 (step 2 of 3)" in err.splitlines(), err


def test_without_progress_the_resume_line_is_not_said(monkeypatch, capsys, run, tmp_path):
    run_dir = _copy(run, tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run_dir), "--steps",
                           "3", "--no-report", "--no-progress")
    assert code == 0, err
    assert "resuming from" not in err, err


def test_a_resume_of_a_directory_that_is_not_there_says_so(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(tmp_path / "nosuch"),
                           "--no-progress")
    assert code == 2
    assert err.strip() == f"error: --resume {tmp_path / 'nosuch'}: no such directory"


@pytest.mark.parametrize("command", ["resume", "export", "report"])
def test_a_run_whose_config_yaml_is_gone_is_said_so(monkeypatch, capsys, run, tmp_path, command):
    """By every command that reads a run (export and report said "not a ratrain run
    directory" until 2026-12-03)."""
    run_dir = _copy(run, tmp_path)
    (run_dir / "config.yaml").unlink()
    args = {"resume": ("train", "--resume", str(run_dir), "--steps", "3", "--no-progress"),
            "export": ("export", str(run_dir), "--out", str(tmp_path / "hf")),
            "report": ("report", str(run_dir))}[command]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    assert err.strip() == (
        f"error: {run_dir}/config.yaml is missing: {run_dir} holds a run's checkpoints "
        "(step_000002) and metrics.jsonl, which are read with its settings; put config.yaml back; "
        "its newest checkpoint's manifest holds the config it was saved with "
        f"({run_dir}/checkpoints/step_000002/manifest.json, under \"config\")"), err
    assert (run_dir / "checkpoints" / "step_000002").is_dir()  # nothing was changed


def test_a_refused_value_in_config_yaml_names_the_file(monkeypatch, capsys, run, tmp_path):
    run_dir = _copy(run, tmp_path)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["train"]["lr"] = "fast"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run_dir),
                           "--steps", "3", "--no-progress")
    assert code == 2
    assert err.strip() == (f"error: {run_dir}/config.yaml: train.lr: expected a number, "
                           "got 'fast'"), err


class _StoppedWhileWriting(WrappedFile):
    """A file whose third write is where Ctrl-C (or SIGTERM's _Terminated) lands."""

    def __init__(self, f, stop):
        super().__init__(f)
        self.stop, self.writes = stop, 0

    def write(self, data):
        self.writes += 1
        if self.writes == 3:
            raise self.stop()
        return self.f.write(data)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, _Terminated])
def test_ctrl_c_in_a_save_is_a_ctrl_c_not_torchs_runtime_error(monkeypatch, tmp_path, stop):
    """torch.save turns what its file's write raised into RuntimeError "unexpected pos ...":
    a --checkpoint-sync save stopped by Ctrl-C ended in a traceback, exit 1."""
    real_open = open
    monkeypatch.setattr(store, "open", lambda path, mode: _StoppedWhileWriting(
        real_open(path, mode), stop), raising=False)
    state = {"exp_avg": torch.ones(10_000), "step": torch.tensor(3.0)}
    with pytest.raises(stop) as raised:
        store._torch_save(state, tmp_path / "unit.optim.pt")
    assert type(raised.value) is stop


def test_a_full_disk_in_a_save_is_still_its_oserror(monkeypatch, tmp_path):
    real_open = open
    monkeypatch.setattr(store, "open", lambda path, mode: _StoppedWhileWriting(
        real_open(path, mode), lambda: OSError(28, "No space left on device")), raising=False)
    with pytest.raises(OSError, match="No space left"):
        store._torch_save({"exp_avg": torch.ones(10_000)}, tmp_path / "unit.optim.pt")
