"""Reading config.json's values: numbers (named where they are not), and the RoPE fields,
from either of transformers' spellings."""

from __future__ import annotations

import json
from pathlib import Path

from ratrain.errors import UserError

# transformers' config defaults where config.json leaves max_position_embeddings out
# (LlamaConfig, Qwen2Config)
DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen2ForCausalLM": 32768}


def num_field(path: Path, src: dict, key: str, kind: type, default, nullable: bool, label: str):
    """src[key], an integer (kind int) or any number (float); absent (or null, where nullable):
    `default`, refused where that is None. A string or null is named, not cast: "1e-5"
    compared as a number failed deep inside the model's checks."""
    value = src.get(key)
    if value is None and (key not in src or nullable):
        if default is None:
            raise UserError(f"{path} lacks {label!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
        want = "an integer" if kind is int else "a number"
        raise UserError(f"{path}: {label} is {json.dumps(value)}, expected {want}")
    return kind(value)


def rope_fields(d: dict, refuse, num, max_len: int) -> dict:
    """The RoPE fields of ModelConfig: theta, and Llama 3's scaling (rope_type "llama3")."""
    # transformers 5 nests RoPE settings under rope_parameters; older configs keep rope_theta
    # at top level and scaling under rope_scaling.
    for key in ("rope_scaling", "rope_parameters"):
        if not isinstance(d.get(key), dict | None):
            refuse(f"{key} {json.dumps(d[key])} (not an object)")
    params = {**(d.get("rope_scaling") or {}), **(d.get("rope_parameters") or {})}
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", "llama3"):
        refuse(f"RoPE scaling {kind!r}")
    within = ("rope_parameters" if d.get("rope_parameters") else "rope_scaling") + "."
    theta = (num("rope_theta", float, src=params, within=within) if "rope_theta" in params
             else num("rope_theta", float, 10000.0))
    out = {"rope_theta": theta}
    if kind == "llama3":
        out.update({field: num(key, float, src=params, within=within) for field, key in (
            ("rope_factor", "factor"), ("rope_low_freq_factor", "low_freq_factor"),
            ("rope_high_freq_factor", "high_freq_factor"))},
            rope_original_max_len=num("original_max_position_embeddings", int, max_len,
                                      src=params, nullable=True, within=within))
    return out
