"""The model's configuration: a dense LLaMA-family decoder's shape and its position encoding
(config.RunConfig's `model` section; its YAML keys are these fields)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ratrain.errors import UserError


def check_finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value}")


@dataclass
class ModelConfig:
    """A dense LLaMA-family decoder. Field names follow the usual LLaMA reference code."""

    name: str = "custom"
    vocab_size: int = 512
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: same as n_heads (plain multi-head attention)
    ffn_dim: int = 688
    max_seq_len: int = 2048
    norm_eps: float = 1e-5
    position: str = "rope"  # "rope" or "alibi"
    rope_theta: float = 10000.0
    # Llama 3's RoPE frequency scaling (Hugging Face rope_type "llama3"; models/rope.py): a
    # factor of 1 is none
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    qkv_bias: bool = False
    tie_embeddings: bool = False
    norm_head: bool = False  # Baichuan2: rows of the output head are L2-normalized

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_units(self) -> int:
        """Schedulable units: embedding, each decoder block, final norm + head."""
        return self.n_layers + 2

    def validate(self) -> None:
        for name in ("norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor",
                     "rope_high_freq_factor"):
            check_finite(f"model.{name}", getattr(self, name))
            if getattr(self, name) <= 0:
                raise UserError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.position not in ("rope", "alibi"):
            raise UserError(f"model.position must be 'rope' or 'alibi', got {self.position!r}")
        if self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise UserError(f"model.rope_high_freq_factor {self.rope_high_freq_factor} must "
                            f"exceed rope_low_freq_factor {self.rope_low_freq_factor}")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len",
                     "rope_original_max_len"):
            if getattr(self, name) <= 0:
                raise UserError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise UserError(f"model.dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(
                f"model.n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise UserError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
