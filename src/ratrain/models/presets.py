"""Named model configurations: the four published models RATrain reports on, two Llama 3
models, and CPU-sized ones."""

from __future__ import annotations

import dataclasses

from ratrain.config import ModelConfig
from ratrain.errors import UserError

_LLAMA3_ROPE = dict(rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                    rope_original_max_len=8192)

PRESETS: dict[str, ModelConfig] = {
    "llama2-7b": ModelConfig(
        name="llama2-7b", vocab_size=32000, dim=4096, n_layers=32, n_heads=32,
        ffn_dim=11008, max_seq_len=4096, norm_eps=1e-5, rope_theta=1e4,
    ),
    "baichuan2-13b": ModelConfig(
        name="baichuan2-13b", vocab_size=125696, dim=5120, n_layers=40, n_heads=40,
        ffn_dim=13696, max_seq_len=4096, norm_eps=1e-6, position="alibi", norm_head=True,
    ),
    "qwen2.5-32b": ModelConfig(
        name="qwen2.5-32b", vocab_size=152064, dim=5120, n_layers=64, n_heads=40, n_kv_heads=8,
        ffn_dim=27648, max_seq_len=32768, norm_eps=1e-5, rope_theta=1e6, qkv_bias=True,
    ),
    "llama2-70b": ModelConfig(
        name="llama2-70b", vocab_size=32000, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
        ffn_dim=28672, max_seq_len=4096, norm_eps=1e-5, rope_theta=1e4,
    ),
    # Llama 3: grouped-query attention, RoPE scaled for a long context; 3.2-1B ties its head.
    "llama3.1-8b": ModelConfig(
        name="llama3.1-8b", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        ffn_dim=14336, max_seq_len=131072, norm_eps=1e-5, rope_theta=5e5, **_LLAMA3_ROPE,
    ),
    "llama3.2-1b": ModelConfig(
        name="llama3.2-1b", vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        ffn_dim=8192, max_seq_len=131072, norm_eps=1e-5, rope_theta=5e5, tie_embeddings=True,
        **{**_LLAMA3_ROPE, "rope_factor": 32.0},
    ),
    # CPU-sized models with the same features; `tiny` is the default training model.
    "tiny": ModelConfig(
        name="tiny", vocab_size=512, dim=256, n_layers=4, n_heads=8, ffn_dim=688, max_seq_len=1024,
    ),
    "tiny-gqa": ModelConfig(  # Qwen-style
        name="tiny-gqa", vocab_size=512, dim=256, n_layers=4, n_heads=8, n_kv_heads=2,
        ffn_dim=688, max_seq_len=1024, rope_theta=1e6, qkv_bias=True,
    ),
    "tiny-alibi": ModelConfig(  # Baichuan-style
        name="tiny-alibi", vocab_size=512, dim=256, n_layers=4, n_heads=8, ffn_dim=688,
        max_seq_len=1024, norm_eps=1e-6, position="alibi", norm_head=True,
    ),
    "tiny-llama3": ModelConfig(  # Llama-3.2-style: tied, GQA, RoPE scaled past 256 tokens
        name="tiny-llama3", vocab_size=512, dim=256, n_layers=4, n_heads=8, n_kv_heads=2,
        ffn_dim=688, max_seq_len=1024, rope_theta=5e5, tie_embeddings=True,
        **{**_LLAMA3_ROPE, "rope_original_max_len": 256},
    ),
    "small": ModelConfig(
        name="small", vocab_size=512, dim=512, n_layers=8, n_heads=8, ffn_dim=1376,
        max_seq_len=1024,
    ),
}


def get_preset(name: str) -> ModelConfig:
    """A copy of preset `name` (callers may edit it freely)."""
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; available: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name])
