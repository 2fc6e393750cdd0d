"""A profile's measured table: each unit kind's times on the shapes `ratrain profile` ran, and
which models they are of (HardwareProfile.measured, sim/profile.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ratrain.config import ModelConfig
from ratrain.models.presets import PRESETS


@dataclass
class ModelShape:
    """What of a model sets its units' times: a measured table entry's units apply to a model of
    the same shape. Not its name, nor n_layers (a unit's time does not depend on how many others
    there are: `ratrain profile` measures one block), nor max_seq_len (a limit: the units run on
    the sequence they are given), norm_eps or RoPE's constants (values: the same operations on
    the same sizes; Llama 3's scaling adds a few on head_dim / 2 frequencies, far below a
    unit's time)."""

    vocab_size: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    position: str
    qkv_bias: bool
    tie_embeddings: bool
    norm_head: bool

    @classmethod
    def of(cls, model: ModelConfig) -> ModelShape:
        return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(cls)})


@dataclass
class UnitTimes:
    """Measured seconds of one unit kind's forward and backward on one shape, and of the two
    halves of a split backward (BI, BW) where they were measured."""

    forward_s: float
    backward_s: float
    backward_input_s: float | None = None
    backward_weight_s: float | None = None


@dataclass
class MeasuredShape:
    """A measured table entry: each unit kind's times for one model, shape and dtype.
    `recompute` is a forward with autograd on; `forward` is as the executor runs it (with
    autograd, or without for a recomputed unit: `forward_no_grad_s`)."""

    model: str
    seq_len: int
    micro_batch_size: int
    dtype: str
    embedding: UnitTimes
    block: UnitTimes
    head: UnitTimes
    block_forward_no_grad_s: float | None = None
    model_shape: ModelShape | None = None
    """The measured model's shape; None (profiles before 2026-12-02): the preset named `model`,
    the only models `ratrain profile` measured."""

    def is_of(self, model: ModelConfig) -> bool:
        """Whether these times are of `model`'s units: a model of the same shape, by any name."""
        shape = self.model_shape
        if shape is None and self.model in PRESETS:
            shape = ModelShape.of(PRESETS[self.model])
        return shape == ModelShape.of(model)
