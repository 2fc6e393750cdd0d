"""A checkpoint's manifest verifies its own content (checkpoint/manifest.py): its step, its list
of files and what it holds besides, edited by hand or by a broken copy, loaded as they were
said until 2026-12-03 (another step put that step's data position and learning rate on this
one's weights; an optimizer file left out of the list resumed with a fresh AdamW state)."""

from __future__ import annotations

import json

import pytest

from ratrain import checkpoint
from ratrain.checkpoint import manifest
from ratrain.training.metrics import read_metrics

from .cli_runner import small_config
from .test_checkpoint_manifest import _save
from .test_checkpoint_options import _train

OWN = "manifest.json does not match its own sha256 (edited or corrupted)"


def _edit(ckpt, change) -> None:
    path = ckpt / manifest.NAME
    content = json.loads(path.read_text())
    change(content)
    path.write_text(json.dumps(content, indent=1))


@pytest.mark.parametrize("change", [
    lambda m: m.update(step=3),
    lambda m: m["files"].pop("unit_0001.optim.pt"),
    lambda m: m["loader"].update(step=1),
    lambda m: m.update(config={"train": {"lr": 1.0}}),
    lambda m: m["files"]["unit_0000.safetensors"].update(sha256="0" * 64),
], ids=["step", "a file left out", "loader", "config", "a digest"])
def test_an_edited_manifest_is_skipped_for_the_newest_that_verifies(tmp_path, change):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    _edit(newest, change)
    ckpt, skipped = checkpoint.scan(tmp_path)
    assert ckpt.name == "step_000002"
    assert [(p.name, why.startswith(OWN)) for p, why in skipped] == [("step_000004", True)], skipped
    # checked without hashing the files too (keep-K, torchrun's other ranks)
    assert manifest.problem(newest, hashed=False).startswith(OWN)


def test_the_same_content_laid_out_otherwise_still_verifies(tmp_path):
    ckpt = _save(tmp_path, 4)
    path = ckpt / manifest.NAME
    content = json.loads(path.read_text())
    path.write_text(json.dumps(dict(reversed(content.items())), indent=4))
    assert manifest.problem(ckpt) is None
    assert checkpoint.load_meta(ckpt)["step"] == 4 and manifest.SELF not in checkpoint.load_meta(ckpt)


def test_a_manifest_of_before_its_own_digest_is_held_to_its_directorys_step(tmp_path):
    ckpt = _save(tmp_path, 4)
    _edit(ckpt, lambda m: m.pop(manifest.SELF))
    assert manifest.problem(ckpt) is None  # an older ratrain's: loads as before
    _edit(ckpt, lambda m: m.update(step=3))
    assert manifest.problem(ckpt) == ("manifest.json says step 3, its directory step_000004 "
                                      "(edited or copied?)")


def test_a_resume_skips_a_checkpoint_whose_manifest_says_another_step(monkeypatch, capsys,
                                                                      tmp_path):
    """A real run: step_000002's manifest edited to step 1 re-ran step 2 on the weights trained
    through step 2, its metrics rewritten, without a word."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    code, err = _train(monkeypatch, capsys, "--config", str(small_config(tmp_path)), "--run-dir",
                       "run", "--threads", "1")
    assert code == 0, err
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    _edit(tmp_path / "run" / "checkpoints" / "step_000002", lambda m: m.update(step=1))
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--steps", "3", "--threads", "1")
    assert code == 0, err
    assert (f"skipping checkpoint step_000002: {OWN}: its step, files or state cannot be "
            "trusted; the newest that verifies is step_000001") in err, err
    # resumed from step_000001, the one that verifies: step 2 trained again from there, as
    # it was (not on step 2's weights)
    resumed = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert [r["loss"] for r in resumed[:2]] == pytest.approx(losses, rel=1e-5)
    assert checkpoint.load_meta(tmp_path / "run" / "checkpoints" / "step_000003")["step"] == 3
