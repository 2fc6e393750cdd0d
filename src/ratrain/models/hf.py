"""Hugging Face interop: config.json in, safetensors weights in and out. Nothing is downloaded.

Supported checkpoints: LLaMA (LlamaForCausalLM), Qwen2/2.5 (Qwen2ForCausalLM: q/k/v bias) and
Baichuan/Baichuan2 (BaichuanForCausalLM: packed W_pack q/k/v; ALiBi in the 13B models; NormHead
in Baichuan2). Which file holds each tensor, and whether the files are the weights config.json
describes: hf_files.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.file_modes import with_usual_mode
from ratrain.models.hf_files import check_export_dir, lacks, sources, tensor_files, write_config
from ratrain.models.hf_keys import in_hf_keys
from ratrain.models.hf_values import DEFAULT_MAX_POSITIONS, num_field, rope_fields
from ratrain.models.llama import hf_param_name

LLAMA, QWEN2, BAICHUAN = "LlamaForCausalLM", "Qwen2ForCausalLM", "BaichuanForCausalLM"
SUPPORTED = (LLAMA, QWEN2, BAICHUAN)
_ARCH_OF_MODEL_TYPE = {"llama": LLAMA, "qwen2": QWEN2, "baichuan": BAICHUAN}
_ARCH_ALIASES = {"BaiChuanForCausalLM": BAICHUAN}  # Baichuan-7B (v1) spells it with a capital C

# Baichuan's config.json says neither which position encoding nor whether the head is normalized;
# its modeling code decides. We follow vLLM: hidden size 4096 (Baichuan-7B, Baichuan2-7B) means
# RoPE, others (the 13B models) ALiBi; Baichuan2's vocabulary size means NormHead. Our own exports
# state both explicitly under these keys, which win.
_BAICHUAN2_VOCAB = 125696
_POSITION_KEY, _NORM_HEAD_KEY = "ratrain_position", "ratrain_norm_head"

# --- config -------------------------------------------------------------------------------------


def config_from_hf(dir_or_config_json: str | Path,
                   warn: Callable[[str], None] | None = None) -> ModelConfig:
    """ModelConfig of a Hugging Face checkpoint directory (or its config.json); `warn` is told
    what ratrain trains otherwise than the checkpoint's own code would (default: a warning
    line on stderr)."""
    path = Path(dir_or_config_json)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"Hugging Face config not found: {path}")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"cannot parse {path}: {e}") from None

    if not isinstance(d, dict):
        raise UserError(f"{path}: expected a JSON object, got {json.dumps(d)[:40]}")
    model_type = d.get("model_type")
    archs = d.get("architectures")
    arch = ([archs] if isinstance(archs, str) else archs or
            [_ARCH_OF_MODEL_TYPE.get(model_type, model_type)])[0]
    arch = _ARCH_ALIASES.get(arch, arch) if isinstance(arch, str) else arch
    if arch not in SUPPORTED:
        raise UserError(
            f"unsupported architecture {arch!r} in {path}; supported: {', '.join(SUPPORTED)}"
        )

    def num(key: str, kind: type = int, default=None, src: dict = d, nullable: bool = False,
            within: str = ""):
        return num_field(path, src, key, kind, default, nullable, f"{within}{key}")

    def refuse(what: str) -> None:
        raise UserError(f"{path}: {what} is not supported")

    dim, n_heads = num("hidden_size"), num("num_attention_heads")
    if d.get("head_dim") not in (None, dim // max(n_heads, 1)):
        refuse(f"head_dim {d['head_dim']} != hidden_size / num_attention_heads")
    if d.get("hidden_act", "silu") not in ("silu", "swish"):  # one function (transformers' ACT2FN)
        refuse(f"hidden_act {d['hidden_act']!r}")
    if d.get("mlp_bias"):
        refuse("mlp_bias")
    tie = d.get("tie_word_embeddings", False)
    if not isinstance(tie, bool | None):  # bool("false") is True
        raise UserError(f"{path}: tie_word_embeddings is {json.dumps(tie)}, expected true or false")
    fields = dict(
        name=path.parent.name or "hf",
        vocab_size=num("vocab_size"),
        dim=dim,
        n_layers=num("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=num("num_key_value_heads", default=n_heads, nullable=True),
        ffn_dim=num("intermediate_size"),
        norm_eps=num("rms_norm_eps", float, 1e-6),
        tie_embeddings=bool(tie),
    )
    if arch == BAICHUAN:
        max_len = (num("model_max_length", default=0, nullable=True)
                   or num("max_position_embeddings", default=0, nullable=True) or 4096)
        fields.update(
            position=d.get(_POSITION_KEY) or ("rope" if dim == 4096 else "alibi"),
            norm_head=bool(d.get(_NORM_HEAD_KEY, fields["vocab_size"] == _BAICHUAN2_VOCAB)),
            max_seq_len=max_len,
            # our exports of RoPE models with Llama 3's scaling write it as for LLaMA
            **rope_fields(d, refuse, num, max_len),
        )
    else:
        if arch == LLAMA and d.get("attention_bias"):
            refuse("attention_bias (it also biases o_proj)")
        if arch == QWEN2 and d.get("use_sliding_window"):
            refuse("use_sliding_window")
        max_len = num("max_position_embeddings", default=DEFAULT_MAX_POSITIONS[arch])
        if "max_position_embeddings" not in d:  # (refused until 2026-12-04)
            (warn or _warn_on_stderr)(f"{path} lacks max_position_embeddings: taking {max_len}, "
                                      f"transformers' default for {arch}")
        fields.update(
            max_seq_len=max_len,
            **rope_fields(d, refuse, num, max_len),
            qkv_bias=arch == QWEN2,  # Qwen2 always biases q/k/v (and nothing else)
        )
    cfg = ModelConfig(**fields)
    try:
        cfg.validate()
    except UserError as e:
        raise UserError(f"{path}: {in_hf_keys(str(e))}") from None  # its keys, not ours
    # pretraining_tp > 1 is not weighed: older transformers computed each projection in that
    # many slices of its weight, concatenated or summed, the same product summed in another
    # order ("exact reproducibility of the pretraining results"); the weights are stored whole
    # and transformers 5 ignores it
    dropout = num("attention_dropout", float, 0.0, nullable=True)
    if dropout:
        (warn or _warn_on_stderr)(
            f"{path}: attention_dropout {dropout:g} is not applied: ratrain trains without "
            "dropout on the attention weights, where Hugging Face training drops them out "
            "(inference, which drops nothing, is the same)")
    return cfg


def _warn_on_stderr(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


# --- weights ------------------------------------------------------------------------------------


def _as_units(units_or_model: nn.Module | Iterable[nn.Module]) -> list[nn.Module]:
    if isinstance(units_or_model, nn.Module):
        units = list(units_or_model.units) if hasattr(units_or_model, "units") else [units_or_model]
    else:
        units = list(units_or_model)
    return sorted(units, key=lambda u: u.index)


def _read(where: dict[str, Path], names: Iterable[str]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(where[name], []).append(name)
    out = {}
    for f, fnames in by_file.items():
        with safe_open(f, framework="pt") as st:
            out.update((n, st.get_tensor(n)) for n in fnames)
    return out


def load_hf_weights(
    units_or_model: nn.Module | Iterable[nn.Module], cfg: ModelConfig, path: str | Path
) -> None:
    """Copy a safetensors checkpoint (one file, or shards with model.safetensors.index.json) into
    the given units, reading only the tensors they need. Baichuan's W_pack is split into q/k/v."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    where = tensor_files(path)
    if where is None:
        raise UserError(f"no *.safetensors files in {path}")
    needed = {
        hf_param_name(cfg, u.index, local): p
        for u in _as_units(units_or_model)
        for local, p in u.named_parameters()
    }
    direct, packed, missing = sources(needed, where)
    if missing:
        raise lacks(path, missing, where)

    tensors = _read(where, direct)
    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for pack_name, w in _read(where, packed).items():
        if w.shape[0] != q_rows + 2 * kv_rows:
            raise UserError(
                f"{pack_name} in {path} has shape {list(w.shape)}, model expects "
                f"[{q_rows + 2 * kv_rows}, {cfg.dim}]"
            )
        prefix = pack_name.removesuffix("W_pack.weight")
        for proj, t in zip("qkv", w.split([q_rows, kv_rows, kv_rows])):
            if f"{prefix}{proj}_proj.weight" in needed:
                tensors[f"{prefix}{proj}_proj.weight"] = t

    with torch.no_grad():
        for name, t in tensors.items():
            p = needed[name]
            if t.shape != p.shape:
                raise UserError(
                    f"{name} in {path} has shape {list(t.shape)}, model expects {list(p.shape)}"
                )
            p.copy_(t)


def _export_arch(cfg: ModelConfig) -> str:
    if cfg.position == "alibi" or cfg.norm_head:
        if cfg.qkv_bias or cfg.n_kv_heads != cfg.n_heads:
            raise UserError(
                "cannot export to Hugging Face: ALiBi/NormHead models are written as Baichuan, "
                "which has neither q/k/v bias nor grouped-query attention"
            )
        return BAICHUAN
    return QWEN2 if cfg.qkv_bias else LLAMA


def hf_config(cfg: ModelConfig, dtype: torch.dtype) -> dict:
    """The config.json an export of `cfg`'s weights in `dtype` writes."""
    arch = _export_arch(cfg)
    d = {
        "architectures": [arch],
        "model_type": {v: k for k, v in _ARCH_OF_MODEL_TYPE.items()}[arch],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if cfg.rope_factor != 1.0:
        d["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.rope_factor,
                             "low_freq_factor": cfg.rope_low_freq_factor,
                             "high_freq_factor": cfg.rope_high_freq_factor,
                             "original_max_position_embeddings": cfg.rope_original_max_len}
    if arch == LLAMA:
        d.update(attention_bias=False, mlp_bias=False)
    elif arch == QWEN2:
        d.update(use_sliding_window=False)
    else:
        d.update(
            {
                "model_max_length": cfg.max_seq_len,
                _POSITION_KEY: cfg.position,
                _NORM_HEAD_KEY: cfg.norm_head,
            }
        )
    return d


def save_hf(model_or_units: nn.Module | Iterable[nn.Module], cfg: ModelConfig,
            out_dir: str | Path, token_ids: dict[str, int | None] | None = None) -> Path:
    """Write model.safetensors (Hugging Face names) and config.json (with `token_ids`, the
    tokenizer's bos/eos ids) into out_dir, which must hold no weights yet; return out_dir.

    Rotary models without bias are written as LlamaForCausalLM, with q/k/v bias as
    Qwen2ForCausalLM, ALiBi or NormHead ones as Baichuan (packed W_pack). Tied embeddings are
    written once, as model.embed_tokens.weight.
    """
    out = check_export_dir(out_dir)
    units = _as_units(model_or_units)
    if [u.index for u in units] != list(range(cfg.n_units)):
        raise UserError(f"save_hf needs all {cfg.n_units} units of the model")
    arch = _export_arch(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for u in units:
        for local, p in u.named_parameters():
            # setdefault: a tied head's own lm_head copy maps onto the embedding, written first.
            tensors.setdefault(hf_param_name(cfg, u.index, local), p.detach().cpu().contiguous())
    if arch == BAICHUAN:
        for i in range(cfg.n_layers):
            prefix = f"model.layers.{i}.self_attn."
            qkv = [tensors.pop(f"{prefix}{x}_proj.weight") for x in "qkv"]
            tensors[prefix + "W_pack.weight"] = torch.cat(qkv)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with_usual_mode(out / "model.safetensors")  # (safetensors makes it 0600)
    dtype = tensors["model.embed_tokens.weight"].dtype
    write_config(out, hf_config(cfg, dtype), token_ids or {})
    return out
