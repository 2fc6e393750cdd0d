"""A disk that fills while a checkpoint is being saved (a real one: a small tmpfs) ends the run
with one line, leaves the earlier checkpoint intact and no partial one behind. The start's disk
check counts the checkpoints the run will have at once (three here), so the test has it count
one, as if another process had taken the room the check saw."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest
from ratrain.training.disk_room import checkpoint_bytes

from ..unit.cli_runner import run_cli
from .conftest import micro_config

pytestmark = pytest.mark.dist


@pytest.fixture
def small_disk(tmp_path, corpus):
    """A tmpfs with room for the run's files and about 1.6 of its checkpoints (root only)."""
    cfg = micro_config(*corpus)
    where = tmp_path / "disk"
    where.mkdir()
    size = int(1.6 * checkpoint_bytes(cfg)) // 4096 * 4096
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                            str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_disk_that_fills_while_saving(corpus, tmp_path, small_disk, monkeypatch, capsys):
    cfg = micro_config(*corpus, steps=6)
    cfg.parallel.pp = 2
    cfg.train.checkpoint_every, cfg.train.eval_every = 2, 0
    cfg.save(tmp_path / "run.yaml")
    run_dir = small_disk / "run"
    args = ("train", "--config", str(tmp_path / "run.yaml"), "--run-dir", str(run_dir),
            "--no-progress", "--no-trace")
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "needs room for 3 at once" in err, err  # refused before it starts
    monkeypatch.setattr("ratrain.training.disk_room.checkpoints_at_once", lambda *a, **k: 1)
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.fullmatch(
        r"error: rank \d failed: could not write checkpoint step_000004 in \S+: No space left on "
        r"device[^;]*; the partial checkpoint was removed, the newest complete checkpoint is step_000002",
        lines[0]), lines[0]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000002"]
    assert manifest.problem(checkpoint.checkpoint_dir(run_dir, 2)) is None
