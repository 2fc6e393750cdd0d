"""LLaMA-family models as schedulable units, named presets, sizes, and Hugging Face interop.

Sizes and presets import without torch (the simulator and the planner use them); the modules
and interop load on first use."""

import importlib

from ratrain.models.params import count_params, state_bytes, unit_param_counts
from ratrain.models.presets import PRESETS, get_preset

_ON_FIRST_USE = {
    "config_from_hf": "hf", "load_hf_weights": "hf", "save_hf": "hf",
    "DecoderBlock": "llama", "Embedding": "llama", "Head": "llama", "LlamaModel": "llama",
    "build_unit": "llama", "build_units": "llama", "hf_param_name": "llama", "lm_loss": "llama",
}


def __getattr__(name: str):
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(f"ratrain.models.{_ON_FIRST_USE[name]}"), name)
    raise AttributeError(f"module 'ratrain.models' has no attribute {name!r}")


__all__ = ["PRESETS", "count_params", "get_preset", "state_bytes", "unit_param_counts",
           *_ON_FIRST_USE]
