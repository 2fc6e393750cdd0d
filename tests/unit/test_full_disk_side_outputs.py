"""A full disk meeting what a run writes beside its metrics and checkpoints: TensorBoard's event
files (a warning, and TensorBoard off: the run goes on), a rank's error record under the
launcher (its own error still said, not lost), and config.write_whole (no .part left behind).
The full disk is simulated: a write that takes half the bytes and then fails with ENOSPC."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from ratrain.config import write_whole
from ratrain.errors import RankFailed

from .cli_runner import run_cli, small_config

FULL = os.strerror(errno.ENOSPC)


class _HalfThenFull(io.FileIO):
    def write(self, data):
        super().write(bytes(data)[:len(data) // 2])
        raise OSError(errno.ENOSPC, FULL)


def _fill_tensorboard_at(monkeypatch, nth: int) -> None:
    """The `nth` append (0: the first) to a file of a tensorboard/ directory, and every one
    after, meets a full disk (io.open: what pathlib and tensorboard's own writer open with)."""
    real_open, seen = io.open, []

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, Path)) and "a" in mode \
                and Path(os.fsdecode(file)).parent.name == "tensorboard":
            seen.append(file)
            if len(seen) > nth:
                return _HalfThenFull(file, "a")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", open_)


def _scalars(log_dir) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_tensorboard_on_a_disk_that_fills_warns_once_and_writes_no_more(tmp_path, monkeypatch,
                                                                         capsys):
    """Until 2026-12-03 torch's SummaryWriter wrote from a thread of its own: a full disk
    printed that thread's traceback, and the next row's write raised the raw OSError."""
    pytest.importorskip("tensorboard")
    from ratrain.training.tensorboard_log import TensorBoardLog

    log = TensorBoardLog(tmp_path)
    log.write({"step": 1, "loss": 5.0, "lr": 1e-3})
    [events] = (tmp_path / "tensorboard").iterdir()
    size = events.stat().st_size
    _fill_tensorboard_at(monkeypatch, 0)
    log.write({"step": 2, "loss": 4.5, "lr": 2e-3})
    log.write({"step": 3, "loss": 4.0, "lr": 3e-3})
    log.close()
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"warning: could not write {events}: {FULL}; TensorBoard is off for the rest of this "
        "run (metrics.jsonl keeps every step's metrics)"]
    assert events.stat().st_size == size  # step 2's half was cut off
    got = _scalars(tmp_path / "tensorboard")
    assert got["loss/train"] == {1: 5.0}
    assert got["optimizer/lr"] == {1: pytest.approx(1e-3)}


def test_tensorboard_whose_directory_cannot_be_made_is_off_with_a_warning(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from ratrain.training.tensorboard_log import TensorBoardLog

    (tmp_path / "tensorboard").write_text("not a directory")
    log = TensorBoardLog(tmp_path)
    log.write({"step": 1, "loss": 5.0})
    log.close()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"warning: could not write {tmp_path / 'tensorboard'}: ")
    assert line.endswith("; TensorBoard is off for the rest of this run (metrics.jsonl keeps "
                         "every step's metrics)")
    assert (tmp_path / "tensorboard").read_text() == "not a directory"


def test_a_run_whose_tensorboard_meets_a_full_disk_trains_on(monkeypatch, capsys, tmp_path):
    pytest.importorskip("tensorboard")
    _fill_tensorboard_at(monkeypatch, 2)  # after the file's first events and step 1's row
    config = small_config(tmp_path, steps=3, checkpoint_async=False)
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(config), "--run-dir",
                           str(run), "--threads", "1", "--no-progress", "--no-report",
                           "--tensorboard")
    monkeypatch.undo()
    assert code == 0, err
    [events] = (run / "tensorboard").iterdir()
    assert [line for line in err.splitlines() if line.startswith(("warning", "error"))] == [
        f"warning: could not write {events}: {FULL}; TensorBoard is off for the rest of this "
        "run (metrics.jsonl keeps every step's metrics)"]
    assert "Traceback" not in err
    assert list(_scalars(run / "tensorboard")["loss/train"]) == [1]
    from ratrain.training.metrics import read_metrics
    assert [row["step"] for row in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]


def _fail_with_a_full_disk(stderr: str) -> None:
    """A rank (rank 1; rank 0 ends cleanly) that fails where its error record cannot be written;
    what it says on stderr goes to the file `stderr`."""
    if os.environ["RANK"] == "0":
        return
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, FULL)

    Path.write_text = full  # (in this rank's process only)
    raise ValueError("the rank's own error")


@pytest.mark.dist
def test_a_rank_whose_error_record_meets_a_full_disk_still_says_its_error(tmp_path):
    """Until 2026-12-03 such a rank said nothing, and the launcher only "process died (exit
    code 1)": the error was lost."""
    from ratrain.runtime.launch import launch_local

    stderr = tmp_path / "rank_1.stderr"
    with pytest.raises(RankFailed) as e:
        launch_local(2, _fail_with_a_full_disk, (str(stderr),), tmp_path / "errors")
    assert str(e.value) == "rank 1 failed: its error is said above (its record could not be written)"
    said = stderr.read_text().splitlines()
    assert "Traceback (most recent call last):" in said  # kept nowhere else
    assert said[-1].startswith("rank 1 failed: ValueError: the rank's own error (its error could "
                               "not be recorded in ")
    assert said[-1].endswith(f": {FULL})")
    assert not list((tmp_path / "errors").glob("rank_*"))


def test_a_clear_error_whose_record_meets_a_full_disk_is_said_in_one_line(tmp_path, monkeypatch,
                                                                          capsys):
    from ratrain.runtime.worker_errors import UNRECORDED, report_failure
    from ratrain.training.metrics import RunDirWriteError

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, FULL)

    monkeypatch.setattr(Path, "write_text", full)
    code = report_failure(tmp_path, 2, RunDirWriteError("could not write RUN/metrics.jsonl"))
    assert code == UNRECORDED
    assert capsys.readouterr().err.splitlines() == [
        f"rank 2 failed: could not write RUN/metrics.jsonl (its error could not be recorded in "
        f"{tmp_path}: {FULL})"]


@pytest.mark.parametrize("fails", ["write", "replace"])
def test_write_whole_on_a_failed_write_leaves_no_part_and_the_old_file(tmp_path, monkeypatch,
                                                                       fails):
    path = tmp_path / "config.yaml"
    path.write_text("old: 1\n")
    real_write = Path.write_text

    def write_text(self, text, *args, **kwargs):
        real_write(self, text[:len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, FULL)

    def replace(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    if fails == "write":
        monkeypatch.setattr(Path, "write_text", write_text)
    else:
        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError) as e:
        write_whole(path, "new: 2\n" * 100)
    monkeypatch.undo()
    assert e.value.errno == (errno.ENOSPC if fails == "write" else errno.EXDEV)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    assert path.read_text() == "old: 1\n"

