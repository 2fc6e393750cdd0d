"""The config.json keys of ratrain's model fields, for messages about a Hugging Face
directory: its user knows num_attention_heads, not n_heads."""

from __future__ import annotations

import re

HF_KEYS = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
           "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
           "ffn_dim": "intermediate_size", "norm_eps": "rms_norm_eps",
           "rope_theta": "rope_theta", "max_seq_len": "max_position_embeddings",
           "tie_embeddings": "tie_word_embeddings"}
"""ModelConfig field -> the config.json key it is read from (models/hf.config_from_hf)."""


def in_hf_keys(message: str) -> str:
    """A ModelConfig.validate message ("model.n_heads 4 is not divisible by n_kv_heads 3")
    said in a config.json's keys, for a Hugging Face directory whose config.json it is about."""
    for field in sorted(HF_KEYS, key=len, reverse=True):  # n_kv_heads before n_heads
        message = message.replace(f"model.{field}", HF_KEYS[field])
    for field in sorted((f for f in HF_KEYS if "_" in f), key=len, reverse=True):
        message = re.sub(rf"(?<![\w.]){field}(?!\w)", HF_KEYS[field], message)
    return message
