"""A run directory whose disk fills while the run writes metrics.jsonl, summary.json or
trace.json: one line that names the file, the OS error and the newest checkpoint (exit 1), no
half row left; from a rank of a --pp 2 run the launcher relays that line. The full disk is
simulated: a write that takes half the bytes and then fails with ENOSPC, or /dev/full."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest

from ratrain.training.metrics import MetricsLog, RunDirWriteError, read_metrics

from .cli_runner import run_cli, small_config

FULL = os.strerror(errno.ENOSPC)


class _HalfThenFull(io.FileIO):
    """A file on a disk that fills part way through the next write."""

    def write(self, data):
        super().write(bytes(data)[:len(data) // 2])
        raise OSError(errno.ENOSPC, FULL)


def _fill_at(monkeypatch, name: str, nth: int) -> None:
    """The `nth` append to a file called `name` (0: the first) meets a full disk."""
    real_open, seen = Path.open, []

    def open_(self, mode="r", *args, **kwargs):
        if self.name == name and "a" in mode:
            seen.append(self)
            if len(seen) > nth:
                return _HalfThenFull(self, mode.replace("b", ""))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)


def _train(monkeypatch, capsys, tmp_path, *flags) -> tuple[int, str]:
    config = small_config(tmp_path, steps=3, checkpoint_async=False)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(config), "--run-dir",
                           str(tmp_path / "run"), "--threads", "1", "--no-progress",
                           "--no-report", *flags)
    return code, err


def test_a_metrics_row_that_meets_a_full_disk_ends_the_run_in_one_line(monkeypatch, capsys,
                                                                       tmp_path):
    _fill_at(monkeypatch, "metrics.jsonl", 2)  # step 3's row, after step 2's checkpoint
    code, err = _train(monkeypatch, capsys, tmp_path)
    log = tmp_path / "run" / "metrics.jsonl"
    assert code == 1
    assert err.strip().splitlines() == [
        f"error: could not write {log}: {FULL}; the newest complete checkpoint is step_000002 "
        f"(continue with --resume {log.parent})"]
    text = log.read_text()
    assert text.endswith("\n")  # the half row was cut off
    assert [json.loads(line)["step"] for line in text.splitlines()] == [1, 2]


def test_a_summary_that_meets_a_full_disk_is_named_and_not_left_half(monkeypatch, capsys,
                                                                     tmp_path):
    real_write = Path.write_text

    def write_text(self, text, *args, **kwargs):
        if self.name == "summary.json":
            real_write(self, text[:len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, FULL)
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    code, err = _train(monkeypatch, capsys, tmp_path)
    summary = tmp_path / "run" / "summary.json"
    assert code == 1
    assert err.strip().splitlines() == [
        f"error: could not write {summary}: {FULL}; the newest complete checkpoint is "
        f"step_000003 (continue with --resume {summary.parent})"]
    assert not summary.exists()  # half of one would pass for it


def test_a_full_disk_before_any_checkpoint_says_there_is_none(monkeypatch, capsys, tmp_path):
    _fill_at(monkeypatch, "metrics.jsonl", 0)
    code, err = _train(monkeypatch, capsys, tmp_path)
    assert code == 1
    assert err.strip().endswith(f"{FULL}; there is no checkpoint to resume from")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""


def test_a_row_is_kept_whole_when_the_disk_fills(monkeypatch, tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write({"step": 1, "loss": 5.0})
    _fill_at(monkeypatch, "metrics.jsonl", 0)
    with pytest.raises(RunDirWriteError, match=f"could not write {path}: {FULL}"):
        log.write({"step": 2, "loss": 4.75})
    assert read_metrics(path) == [{"step": 1, "loss": 5.0}]
    assert path.read_text().count("\n") == 1


def test_a_rank_of_a_pp_run_relays_the_file_it_could_not_write(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to("/dev/full")  # a disk with no room left
    code, err = _train(monkeypatch, capsys, tmp_path, "--pp", "2")
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        f"error: rank 0 failed: could not write {run / 'metrics.jsonl'}: {FULL}; there is no "
        "checkpoint to resume from")
