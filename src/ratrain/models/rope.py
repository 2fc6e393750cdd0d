"""Rotary position embeddings (RoPE), Hugging Face's non-interleaved layout, with Llama 3's
frequency scaling.

The table is a cached function of its shape rather than a buffer, so state dicts hold parameters
only and every block shares one table. inference_mode(False) keeps a table built during
evaluation usable when autograd later saves it for backward.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from ratrain.config import ModelConfig

Llama3Scaling = tuple[float, float, float, int]
"""(factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""


def scaling_of(cfg: ModelConfig) -> Llama3Scaling | None:
    """The model's Llama 3 scaling, or None where its factor is 1."""
    if cfg.rope_factor == 1.0:
        return None
    return (cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
            cfg.rope_original_max_len)


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: Llama3Scaling) -> torch.Tensor:
    """Llama 3.1's rescaled frequencies: a wavelength longer than the original context over
    low_freq_factor is slowed by `factor`, one shorter than it over high_freq_factor is kept,
    and those between are blended by where they fall (transformers' rope_type "llama3")."""
    factor, low, high, original = scaling
    wavelen = 2 * math.pi / inv_freq
    slowed = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    between = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(between, blended, slowed)


@lru_cache(maxsize=32)
def rotary_table(
    seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype,
    scaling: Llama3Scaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [seq_len, head_dim]."""
    with torch.inference_mode(False), torch.no_grad():
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        if scaling is not None:
            inv_freq = llama3_inv_freq(inv_freq, scaling)
        freqs = torch.arange(seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1).to(device)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, head_dim]: pair i is (x[i], x[i + head_dim/2]) (rotate_half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
