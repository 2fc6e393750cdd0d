"""Closed-form parameter counts and training-state sizes, without building anything."""

from __future__ import annotations

from ratrain.config import ModelConfig
from ratrain.errors import UserError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


HEAD_CHUNK_ELEMENTS = 1 << 26
"""Logits the head's chunked loss makes at once (tokens x vocabulary: 256 MiB of fp32), and the
size past which a micro-batch's loss is chunked (models/head_loss.py). Each chunk of its
backward also adds its product into the input's fp32 gradient, a pass over the micro-batch's
hidden states: a chunk this large keeps those passes to a few percent of the head's time."""


def chunk_tokens(vocab_size: int) -> int:
    """Tokens in one chunk of the head's loss (its forward)."""
    return max(1, HEAD_CHUNK_ELEMENTS // vocab_size)


def vocab_columns(tokens: int, vocab_size: int, chunk: int | None = None) -> int:
    """Words of the vocabulary in one chunk of the head's backward over `tokens` tokens: as
    many logits as a forward chunk of `chunk` tokens (default chunk_tokens) makes."""
    chunk = chunk or chunk_tokens(vocab_size)
    return max(1, min(vocab_size, chunk * vocab_size // tokens))


def chunks(tokens: int, vocab_size: int) -> bool:
    """Whether a micro-batch of `tokens` tokens takes the chunked loss: its logits exceed one
    chunk. The runtime and the simulator both ask this."""
    return tokens * vocab_size > HEAD_CHUNK_ELEMENTS


def _block_params(cfg: ModelConfig) -> int:
    q_out = cfg.n_heads * cfg.head_dim
    kv_out = cfg.n_kv_heads * cfg.head_dim
    attn = cfg.dim * (q_out + 2 * kv_out) + q_out * cfg.dim
    if cfg.qkv_bias:
        attn += q_out + 2 * kv_out
    return attn + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim  # + SwiGLU MLP + two norms


def unit_param_counts(cfg: ModelConfig) -> list[int]:
    """Parameters owned by each unit: embedding, every block, head (final norm + untied lm_head)."""
    head = cfg.dim + (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim)
    return [cfg.vocab_size * cfg.dim] + [_block_params(cfg)] * cfg.n_layers + [head]


def count_params(cfg: ModelConfig) -> int:
    """Total parameters: embeddings + blocks + final norm + the head unless tied."""
    return sum(unit_param_counts(cfg))


def state_bytes(cfg: ModelConfig, compute_dtype: str = "bfloat16") -> dict[str, int]:
    """Bytes of the whole model's training state under mixed precision with AdamW.

    Master weights, gradients and both Adam moments are fp32. In float32 the compute view is the
    master itself, so `total` counts it once.
    """
    if compute_dtype not in DTYPE_BYTES:
        raise UserError(
            f"unknown compute dtype {compute_dtype!r}; available: {', '.join(DTYPE_BYTES)}"
        )
    n = count_params(cfg)
    compute = n * DTYPE_BYTES[compute_dtype]
    out = {
        "params": n,
        "compute_weights": compute,
        "master_weights": 4 * n,
        "gradients": 4 * n,
        "optimizer": 8 * n,
    }
    out["total"] = out["master_weights"] + out["gradients"] + out["optimizer"] + (
        0 if compute_dtype == "float32" else compute
    )
    return out
