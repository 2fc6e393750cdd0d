"""--tensorboard: the scalars a run writes read back from the event files, value for value."""

from __future__ import annotations

import json
import shutil

import pytest

from ratrain.data.corpus import stdlib_files
from ratrain.training.metrics import read_metrics

from .cli_runner import run_cli

pytest.importorskip("tensorboard")


def _scalars(log_dir) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_the_log_writes_every_scalar_of_a_row(tmp_path):
    from ratrain.training.tensorboard_log import TensorBoardLog

    rows = [{"step": 1, "loss": 5.5, "lr": 1e-3, "grad_norm": 2.0, "tokens_per_s": 1000.0,
             "mfu": 0.25, "peak_memory_bytes": 300, "peak_memory_bytes_per_rank": [300, 200],
             "loss_scale": 65536.0, "loss_per_replica": [5.25, 5.75],
             "loss_scale_per_replica": [65536.0, 32768.0]},
            {"step": 2, "loss": 5.0, "val_loss": 5.2, "lr": 2e-3, "grad_norm": 1.5,
             "tokens_per_s": 1100.0, "mfu": 0.27, "peak_memory_bytes": 310,
             "peak_memory_bytes_per_rank": [310, 210], "loss_scale": 32768.0}]
    log = TensorBoardLog(tmp_path)
    for row in rows:
        log.write(row)
    log.close()
    got = _scalars(tmp_path / "tensorboard")
    assert got["loss/train"] == {1: 5.5, 2: 5.0}
    assert got["loss/validation"] == {2: pytest.approx(5.2)}
    assert got["optimizer/lr"] == {1: pytest.approx(1e-3), 2: pytest.approx(2e-3)}
    assert got["optimizer/grad_norm"] == {1: 2.0, 2: 1.5}
    assert got["optimizer/loss_scale"] == {1: 65536.0, 2: 32768.0}
    assert got["throughput/tokens_per_s"] == {1: 1000.0, 2: 1100.0}
    assert got["throughput/mfu"] == {1: 0.25, 2: pytest.approx(0.27)}
    assert got["memory/peak_bytes/rank_0"] == {1: 300, 2: 310}
    assert got["memory/peak_bytes/rank_1"] == {1: 200, 2: 210}
    assert got["loss/train/replica_0"] == {1: 5.25} and got["loss/train/replica_1"] == {1: 5.75}
    assert got["optimizer/loss_scale/replica_1"] == {1: 32768.0}


def test_a_run_started_afresh_in_the_directory_purges_the_earlier_events(tmp_path):
    """`--resume auto` before any checkpoint starts afresh and empties metrics.jsonl; its
    TensorBoard curves kept the earlier attempt's steps beside the new ones."""
    from ratrain.training.tensorboard_log import TensorBoardLog

    log = TensorBoardLog(tmp_path)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 5.0})
    log.close()
    again = TensorBoardLog(tmp_path)
    again.write({"step": 1, "loss": 9.0})
    again.close()
    assert _scalars(tmp_path / "tensorboard")["loss/train"] == {1: 9.0}
    resumed = TensorBoardLog(tmp_path, resume_step=1)
    resumed.write({"step": 2, "loss": 8.0})
    resumed.close()
    assert _scalars(tmp_path / "tensorboard")["loss/train"] == {1: 9.0, 2: 8.0}


def test_train_with_tensorboard_writes_the_metrics(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "text"
    data.mkdir()
    for f in [f for f in stdlib_files() if f.name in ("textwrap.py", "shlex.py", "glob.py")]:
        shutil.copy(f, data / f.name)
    code, out, err = run_cli(monkeypatch, capsys, "train", "--data", str(data), "--steps", "2",
                             "--seq-len", "32", "--eval-every", "0", "--no-progress",
                             "--no-report", "--tensorboard", "--run-dir", "run", "--json")
    assert code == 0, err
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    got = _scalars(tmp_path / "run" / "tensorboard")
    for key, tag in (("loss", "loss/train"), ("lr", "optimizer/lr"),
                     ("grad_norm", "optimizer/grad_norm"), ("tokens_per_s", "throughput/tokens_per_s"),
                     ("mfu", "throughput/mfu"), ("peak_memory_bytes", "memory/peak_bytes")):
        assert got[tag] == {r["step"]: pytest.approx(r[key], rel=1e-6) for r in rows}, tag
    assert got["loss/validation"] == {2: pytest.approx(rows[-1]["val_loss"], rel=1e-6)}
    summary = json.loads(out)
    assert 0 < summary["mfu"] < 2 and summary["flops_per_token"] > 0
    assert all(0 < r["mfu"] < 2 for r in rows)
