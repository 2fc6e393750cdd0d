"""A resume hashes each file of its checkpoints once, and says each checkpoint it skips once.
Where the run's newest checkpoint was at its last step, --resume auto's check whether the run
is finished (cli/train_resume.auto_resume) hashed them, and the run hashed them again as it
opened its directory (until 2026-12-03: 81 GB at llama2-7b, minutes of start time), saying the
damaged checkpoint it skipped twice; now the check hands the run the checkpoint it chose
(run_checkpoints.resume_point's `chosen`). The run's load takes the files as verified
(checkpoint.load_units), hashing none."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ratrain.checkpoint import manifest
from ratrain.training.metrics import read_metrics

from .cli_runner import small_config
from .test_checkpoint_options import _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _trained(monkeypatch, capsys, tmp_path) -> dict[str, tuple[str, ...]]:
    """A run of 2 steps in tmp_path/run, checkpointed at each; the commands that resume it."""
    auto = ("--config", str(small_config(tmp_path)), "--run-dir", "run", "--resume", "auto",
            "--threads", "1")
    code, err = _train(monkeypatch, capsys, *auto)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "step_000001", "step_000002"]
    return {"auto": auto, "run": ("--resume", "run", "--threads", "1")}


def _hashes(monkeypatch) -> Counter:
    """The sha256 passes over checkpoint files from now on, by STEP_DIR/FILE; not a save's
    over the files it writes (in step_N.partial/)."""
    seen = Counter()
    digest = manifest.digest

    def counted(path: Path) -> dict:
        if not path.parent.name.endswith(".partial"):
            seen[f"{path.parent.name}/{path.name}"] += 1
        return digest(path)

    monkeypatch.setattr(manifest, "digest", counted)
    return seen


def _files(ckpt: Path) -> list[str]:
    return sorted(json.loads((ckpt / manifest.NAME).read_text())["files"])


def _once(*ckpts: Path) -> dict[str, int]:
    return {f"{c.name}/{name}": 1 for c in ckpts for name in _files(c)}


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl")]


def _alter(path: Path) -> None:
    """Its last byte flipped: the same size, other bytes."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(data)


@pytest.mark.parametrize("how", ["auto", "run"])
def test_a_resume_hashes_each_file_of_its_checkpoint_once(monkeypatch, capsys, tmp_path, how):
    resume = _trained(monkeypatch, capsys, tmp_path)[how]
    newest = tmp_path / "run" / "checkpoints" / "step_000002"
    expected = _once(newest)
    hashes = _hashes(monkeypatch)
    code, err = _train(monkeypatch, capsys, *resume, "--steps", "3")
    assert code == 0, err
    assert _steps(tmp_path / "run") == [1, 2, 3]
    assert dict(hashes) == expected


@pytest.mark.parametrize("how", ["auto", "run"])
def test_a_damaged_final_checkpoint_is_hashed_and_skipped_once(monkeypatch, capsys, tmp_path,
                                                               how):
    """The run's newest checkpoint is at its last step and does not verify: --resume auto
    checks whether the run is finished (it is not: it resumes from step 1), then resumes."""
    resume = _trained(monkeypatch, capsys, tmp_path)[how]
    run = tmp_path / "run"
    older, newest = run / "checkpoints" / "step_000001", run / "checkpoints" / "step_000002"
    last = _files(newest)[-1]  # the last file verified: every other one of it is hashed first
    _alter(newest / last)
    expected = _once(older, newest)
    hashes = _hashes(monkeypatch)
    code, err = _train(monkeypatch, capsys, *resume)
    assert code == 0, err
    said = [line for line in err.splitlines() if line.startswith("skipping checkpoint")]
    assert said == [f"skipping checkpoint step_000002: {last} does not match its sha256 in the "
                    "manifest (altered or corrupted); the newest that verifies is step_000001"
                    ], err
    assert dict(hashes) == expected
    assert _steps(run) == [1, 2] and manifest.problem(newest) is None  # step 2 trained again
