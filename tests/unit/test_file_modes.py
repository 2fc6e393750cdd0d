"""A run's weight files have the mode of its other files: safetensors makes its files 0600, so
until 2026-12-04 a checkpoint's unit_*.safetensors and an export's model.safetensors were the
owner's alone where config.yaml beside them was readable by the group."""

from __future__ import annotations

import os

import pytest
import torch

from ratrain import file_modes
from ratrain.checkpoint.store import write_unit
from ratrain.models.hf import save_hf
from ratrain.models.llama import build_units
from ratrain.models.presets import PRESETS


@pytest.fixture
def group_readable(monkeypatch):
    """umask 022, as most machines have it (file_modes reads the umask once, at import)."""
    before = os.umask(0o022)
    monkeypatch.setattr(file_modes, "_UMASK", 0o022)
    yield
    os.umask(before)


def _mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_a_checkpoints_weights_have_the_mode_of_a_file_made_here(tmp_path, group_readable):
    plain = tmp_path / "plain.txt"
    plain.write_text("made by open()")
    written = write_unit(tmp_path, 0, {"weights": {"w": torch.ones(2)}, "optim": None})
    assert _mode(plain) == 0o644
    assert written and all(_mode(tmp_path / name) == 0o644 for name in written)


def test_an_exports_weights_have_the_mode_of_its_config(tmp_path, group_readable):
    model = PRESETS["tiny"]
    out = save_hf(build_units(model, 0), model, tmp_path / "hf")
    assert _mode(out / "config.json") == 0o644
    assert _mode(out / "model.safetensors") == 0o644
