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


def _resume(capsys, saved_steps: int, steps: int, done: int, saved: dict, now: dict) -> str:
    from ratrain.config import DataConfig, RunConfig, TrainConfig
    from ratrain.training.resuming import say_what_changed

    meta = {"step": done, "loader": saved, "config": {"parallel": {"sync": "step", "dp": 1},
                                                      "train": {"steps": saved_steps}}}
    cfg = RunConfig(data=DataConfig(path="/corpus"), train=TrainConfig(steps=steps, lr=3e-3,
                                                                        warmup_steps=0))
    say_what_changed(meta, cfg, {"step": done, **now})
    return capsys.readouterr().err


def test_a_resume_tells_data_edited_at_the_same_length(capsys):
    """The token count alone was compared: an edit of the same length, or another file of the
    same name, gave no word; and the message named a corpus, tokenizer or val_fraction, which
    a resume refuses to change, where only what the data path holds can."""
    same = {"tokens": 800, "fingerprint": "aa"}
    assert _resume(capsys, 10, 10, 4, same, same) == ""
    err = _resume(capsys, 10, 10, 4, same, {"tokens": 800, "fingerprint": "bb"})
    assert err == ("the training data changed since the checkpoint (800 tokens as before, but "
                   "other ones: /corpus holds other data than it did): the sequences are drawn "
                   "anew from step 5 on, not as the run would have\n")
    err = _resume(capsys, 10, 10, 4, same, {"tokens": 900, "fingerprint": "bb"})
    assert "(800 tokens, now 900: /corpus holds other data" in err and "tokenizer" not in err
    # a checkpoint of before fingerprints: the counts, as then
    assert _resume(capsys, 10, 10, 4, {"tokens": 800}, {"tokens": 800, "fingerprint": "bb"}) == ""
    assert "800 tokens, now 900" in _resume(capsys, 10, 10, 4, {"tokens": 800},
                                            {"tokens": 900, "fingerprint": "bb"})


def test_a_resume_with_other_steps_names_the_first_resumed_step_and_its_learning_rates(capsys):
    """`--steps 6 -> 12` said "the learning rate at step 6 goes 0.0003 -> 0.00207": step 6 ran
    at 0.000695, 0.00207 is step 7's (lr_at(step) is step + 1's); and 12 -> 10 was "stretched"."""
    from ratrain.config import TrainConfig
    from ratrain.runtime.optim import lr_at

    data = {"tokens": 800, "fingerprint": "aa"}
    old, new = (TrainConfig(steps=n, lr=3e-3, warmup_steps=0) for n in (6, 12))
    was, will, ran = lr_at(6, old), lr_at(6, new), lr_at(5, old)  # step 7, 7 and 6's
    assert len({f"{x:.3g}" for x in (was, will, ran)}) == 3
    assert _resume(capsys, 6, 12, 6, data, data) == (
        f"--steps 6 -> 12: the cosine schedule is stretched over the new length, so the learning "
        f"rate of step 7 (the first resumed) goes {was:.3g} -> {will:.3g} (step 6 ran at "
        f"{ran:.3g})\n")
    assert "the cosine schedule is compressed" in _resume(capsys, 12, 10, 6, data, data)
