"""A disk that fills while a checkpoint is being saved (a real one: a small tmpfs) ends the run
with one line, leaves the earlier checkpoint intact and no partial one behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest
from ratrain.training.run_dir import checkpoint_bytes

from .conftest import micro_config

pytestmark = pytest.mark.dist


@pytest.fixture
def small_disk(tmp_path, corpus):
    """A tmpfs with room for the run's files and about 1.6 of its checkpoints (root only)."""
    cfg = micro_config(*corpus)
    where = tmp_path / "disk"
    where.mkdir()
    size = int(1.6 * checkpoint_bytes(cfg.model)) // 4096 * 4096
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                            str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_disk_that_fills_while_saving(corpus, tmp_path, small_disk):
    cfg = micro_config(*corpus, steps=6)
    cfg.parallel.pp = 2
    cfg.train.checkpoint_every, cfg.train.eval_every = 2, 0
    cfg.save(tmp_path / "run.yaml")
    run_dir = small_disk / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"),
         "--run-dir", str(run_dir), "--no-progress", "--no-trace"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(
        r"error: rank \d failed: could not write checkpoint step_000004 in \S+: No space left on "
        r"device[^;]*; the partial checkpoint was removed, the earlier ones are intact \(step_000002\)",
        lines[0]), lines[0]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000002"]
    assert manifest.problem(checkpoint.checkpoint_dir(run_dir, 2)) is None
