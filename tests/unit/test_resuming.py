"""Whose state each replica resumes (training/resuming.py), and which files a checkpoint
gives a replica (checkpoint.missing_units): a DiLoCo checkpoint's workers onto the same
workers, or from the outer parameters; no replica 0's files in place of another's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratrain import checkpoint
from ratrain.checkpoint.store import weights_file
from ratrain.config import ParallelConfig
from ratrain.training.resuming import ResumedState, relayout_note, resumed_state


def _now(sync: str, dp: int) -> ParallelConfig:
    return ParallelConfig(dp=dp, sync=sync)


@pytest.mark.parametrize("saved_sync, saved_dp, sync, dp, replica, want", [
    ("step", 2, "step", 4, 3, ResumedState(0)),  # one state, every replica's
    ("step", 2, "diloco:4", 2, 1, ResumedState(0)),  # each DiLoCo worker starts from it
    ("diloco:4", 2, "diloco:8:2", 2, 1, ResumedState(1)),  # the same workers: its own
    ("diloco:4:islands=2", 4, "diloco:2:islands=2", 4, 3, ResumedState(1)),  # its island's
    ("diloco:4", 2, "step", 2, 1, ResumedState(0, True)),  # synchronous: the outer parameters
    ("diloco:4", 2, "diloco:4", 4, 3, ResumedState(0, True)),  # more workers
    ("diloco:4:islands=2", 4, "diloco:4", 4, 1, ResumedState(0, True)),  # islands apart
    ("diloco:4", 4, "diloco:4:islands=2", 4, 0, ResumedState(0, True)),
])
def test_a_diloco_checkpoint_resumes_its_workers_or_every_replica_from_the_outer_parameters(
        saved_sync, saved_dp, sync, dp, replica, want):
    saved = {"sync": saved_sync, "dp": saved_dp}
    assert resumed_state(saved, _now(sync, dp), replica) == want
    note = relayout_note(saved, _now(sync, dp))
    assert (note is not None) == want.from_outer
    if note:
        assert f"--sync {saved_sync} at --dp {saved_dp}" in note and "outer parameters" in note


def test_one_nodes_part_of_a_diloco_checkpoint_lacks_the_other_replicas_units():
    """Replica 1's units are on the other node: missing, not replica 0's in their place (which
    `export --replica 1` and a resume took until 2026-11-29); a synchronous checkpoint's are
    replica 0's for every replica."""
    files = {weights_file(u, 0): {} for u in range(3)}
    diloco = {"config": {"parallel": {"sync": "diloco:4", "dp": 2}}, "files": files}
    synchronous = {"config": {"parallel": {"sync": "step", "dp": 2}}, "files": files}
    assert checkpoint.missing_units(Path("part"), range(3), 1, meta=diloco) == [0, 1, 2]
    assert checkpoint.missing_units(Path("part"), range(3), 0, meta=diloco) == []
    assert checkpoint.missing_units(Path("part"), range(3), 1, meta=synchronous) == []
