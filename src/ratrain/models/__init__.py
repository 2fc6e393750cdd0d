"""LLaMA-family models as schedulable units, named presets, sizes, and Hugging Face interop."""

from ratrain.models.hf import config_from_hf, load_hf_weights, save_hf
from ratrain.models.llama import (
    DecoderBlock,
    Embedding,
    Head,
    LlamaModel,
    build_unit,
    build_units,
    hf_param_name,
    lm_loss,
)
from ratrain.models.params import count_params, state_bytes, unit_param_counts
from ratrain.models.presets import PRESETS, get_preset

__all__ = [
    "PRESETS",
    "DecoderBlock",
    "Embedding",
    "Head",
    "LlamaModel",
    "build_unit",
    "build_units",
    "config_from_hf",
    "count_params",
    "get_preset",
    "hf_param_name",
    "lm_loss",
    "load_hf_weights",
    "save_hf",
    "state_bytes",
    "unit_param_counts",
]
