"""What a run says, at its start, of the weights it starts from: a train.init_from directory
checked against the run's model (a leftover one, of a config.yaml that a `--model DIR` run
wrote, failed deep in the build naming neither), the model fields a --config sets otherwise
than that directory's config.json, and where the weights come from (random init, silently,
until 2026-12-03)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.models.hf_keys import HF_KEYS

UNREAD_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack")
"""Weights files ratrain does not read (pickles, other frameworks' formats)."""


def check_init_from(cfg) -> None:
    """train.init_from, where set, against the run's model: its safetensors weights of the
    model's shapes; a failure names train.init_from (a --config's leftover, perhaps)."""
    from ratrain.models.hf_files import check_weights

    init_from = cfg.train.init_from
    if not init_from:
        return
    where = f"train.init_from {init_from} (the weights the run starts from)"
    if not Path(init_from).is_dir():
        raise UserError(f"{where}: no such directory")
    try:
        found = check_weights(Path(init_from), cfg.model)
    except UserError as e:
        raise UserError(f"{where}: {e}; --model {init_from} takes that directory's model with "
                        "them, or a --config without train.init_from starts from random "
                        "weights") from None
    if found is None:
        raise UserError(f"{where}: no *.safetensors files in it")


def overridden_fields(cfg) -> list[str]:
    """Warnings, one a field, where the run's model (a --config's model section) sets a value
    other than train.init_from's config.json, which the weights were trained with; the run's
    value is the one trained with, as before."""
    from ratrain.models.hf import config_from_hf

    init_from = cfg.train.init_from
    if not init_from or not (Path(init_from) / "config.json").is_file():
        return []
    theirs = config_from_hf(init_from, warn=lambda line: None)
    said = []
    for f in dataclasses.fields(ModelConfig):
        ours, own = getattr(cfg.model, f.name), getattr(theirs, f.name)
        if f.name != "name" and ours != own:
            key = HF_KEYS.get(f.name, f.name)
            ours, own = _shown(ours), _shown(own)
            said.append(f"warning: model.{f.name} {ours} differs from {own}, the {key} of "
                        f"{Path(init_from) / 'config.json'} (train.init_from, whose weights "
                        f"were trained with it): the run uses its own, {ours}")
    return said


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def weights_line(cfg) -> str:
    """Where the run's weights come from, said at its start."""
    from ratrain.models.hf_files import tensor_files

    init_from = cfg.train.init_from
    if not init_from:
        return f"weights: random init (seed {cfg.train.seed})"
    where = tensor_files(Path(init_from)) or {}
    files = sorted({str(f) for f in where.values()})
    shown = files[0] if len(files) == 1 else f"{init_from} ({len(files)} safetensors files)"
    return f"weights: {shown} ({len(where):,} tensors)"


def unread_weights(path: Path) -> list[str]:
    """The weights files of a --model directory that ratrain does not read (model.pt trained
    from random weights, silently, until 2026-12-03)."""
    return sorted(f.name for pattern in UNREAD_WEIGHTS for f in path.glob(pattern))


def random_weights_note(path: Path) -> str:
    """For a --model directory of config.json alone: its run starts from random weights."""
    return (f"note: --model {path}: no *.safetensors in it: the run starts from random weights "
            "(of its config.json's model)")
