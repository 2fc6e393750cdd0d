"""The safetensors files of a Hugging Face model directory: which file holds each tensor, and
whether they are the weights its config.json describes. `check_weights` reads only the files'
headers (and, for a tied head saved apart, the two matrices a slice at a time), so --model is
checked before any process starts; a stage reads only the tensors its units need. And whether
a directory an export writes into holds none yet (`check_export_dir`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open

from ratrain.config import ModelConfig
from ratrain.counts import counted
from ratrain.errors import UserError
from ratrain.models.llama import build_units, hf_param_name

INDEX = "model.safetensors.index.json"
QKV = re.compile(r"^(model\.layers\.\d+\.self_attn\.)([qkv])_proj\.weight$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_LFS_POINTER = b"version https://git-lfs"
_FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}  # safetensors' dtype names
_EMBED, _HEAD = "model.embed_tokens.weight", "lm_head.weight"


def tensor_files(path: Path) -> dict[str, Path] | None:
    """Tensor name -> the file holding it, from the shard index or the *.safetensors files'
    headers of a directory (or one file); None where a directory has neither."""
    if path.is_file():
        return dict.fromkeys(_header(path), path)
    if (path / INDEX).is_file():
        if (path / "model.safetensors").is_file():
            # transformers reads model.safetensors and ignores the index: one of them is stale,
            # and which one is not ours to guess
            raise UserError(f"{path} holds both model.safetensors and {INDEX} with its shards: "
                            "one of them is stale; remove the one that is not the model")
        return _weight_map(path / INDEX)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    return {name: f for f in files for name in _header(f)}


def _weight_map(index: Path) -> dict[str, Path]:
    try:
        found = json.loads(index.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise UserError(f"cannot read {index}: {e}") from None
    weight_map = found.get("weight_map") if isinstance(found, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise UserError(f"{index} has no weight_map (tensor name -> shard file)")
    where = {name: index.parent / f for name, f in weight_map.items()}
    absent = sorted({f.name for f in where.values() if not f.is_file()})
    if absent:
        raise UserError(f"{index.parent} lacks {len(absent)} of the shards its index names: "
                        f"{_some(absent)}")
    return where


def _header(f: Path) -> dict[str, tuple[str, list[int]]]:
    """Tensor name -> (safetensors dtype, shape), read from the header alone."""
    try:
        with safe_open(f, framework="pt") as st:
            return {n: (s.get_dtype(), s.get_shape()) for n in st.keys() for s in [st.get_slice(n)]}
    except Exception as e:  # safetensors' own SafetensorError, which it does not export
        with open(f, "rb") as fh:
            if fh.read(len(_LFS_POINTER)) == _LFS_POINTER:
                raise UserError(f"{f} is a git-lfs pointer, not the weights: fetch them "
                                f"(git lfs pull in {f.parent})") from None
        raise UserError(f"{f} is not a readable safetensors file ({e})") from None


def _some(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def sources(needed: Iterable[str], where: dict[str, Path]) -> tuple[list[str], set[str], list[str]]:
    """(tensors read as they are, Baichuan W_pack tensors split into q/k/v, names found in
    neither) for the parameter names `needed`."""
    direct, packed, missing = [], set(), []
    for name in needed:
        m = QKV.match(name)
        if name in where:
            direct.append(name)
        elif m and m.group(1) + "W_pack.weight" in where:
            packed.add(m.group(1) + "W_pack.weight")
        else:
            missing.append(name)
    return direct, packed, missing


def lacks(path: Path, missing: list[str], found: Iterable[str]) -> UserError:
    """The refusal of checkpoint `path`, whose tensors are `found`, for lacking `missing`."""
    said = (f"checkpoint {path} lacks {counted(len(missing), 'tensor')} the model needs, "
            f"e.g. {', '.join(missing[:3])}")
    prefixed = dict.fromkeys(f"model.{n}" for n in found)
    if missing == [_HEAD]:  # a tied model's weights (transformers saves no lm_head for those)
        said += ("; the model's head is untied (tie_word_embeddings: false in config.json), "
                 "likely the cause where the weights are a tied model's: set "
                 "tie_word_embeddings to true to train the head as the embedding")
    elif sources([n for n in missing if n != _HEAD], prefixed)[2] == []:
        # (the tied hint fired here until 2026-12-04, though tying adds no model. prefix)
        said += ("; its tensors are a base model's (LlamaModel: names without the model. "
                 "prefix, and no lm_head): ratrain reads a causal LM's (LlamaForCausalLM); "
                 "save one, e.g. AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new), "
                 "which adds the head (a new one where untied)")
    return UserError(said)


def check_weights(path: Path, cfg: ModelConfig) -> list[str] | None:
    """Whether the directory's safetensors weights are those of `cfg`: None where it has none,
    else the names of tensors the model does not use (to warn of). Refused: a stale or broken
    index, a missing shard, an unreadable file, a tensor missing or of another shape or not
    floating point, layers or biases the config does not have, a tied head saved apart that
    differs from the embedding."""
    where = tensor_files(path)
    if where is None:
        return None
    headers = {f: _header(f) for f in set(where.values())}
    absent = [n for n, f in where.items() if n not in headers[f]]
    if absent:
        raise UserError(f"{path / INDEX} names {len(absent)} tensor(s) their shard lacks, e.g. "
                        f"{absent[0]} in {where[absent[0]].name}")
    info = {n: headers[f][n] for n, f in where.items()}
    with torch.device("meta"):  # shapes only
        shapes = {hf_param_name(cfg, u.index, local): list(p.shape)
                  for u in build_units(cfg, 0) for local, p in u.named_parameters()}
    direct, packed, missing = sources(shapes, info)
    if missing:
        raise lacks(path, missing, info)
    for name in direct:
        if info[name][1] != shapes[name]:
            raise UserError(f"{name} in {path} has shape {info[name][1]}, model expects "
                            f"{shapes[name]}")
    for name in [*direct, *sorted(packed)]:
        if info[name][0] not in _FLOATING:
            raise UserError(f"{name} in {where[name]} is {info[name][0]}, not floating point "
                            "(quantized weights are not read)")
    unused = sorted(set(info) - set(direct) - packed)
    if cfg.tie_embeddings and _HEAD in unused:
        if not _equal(where, _EMBED, _HEAD):
            raise UserError(f"{path}: config.json ties the head to the embedding "
                            f"(tie_word_embeddings) but {_HEAD} differs from {_EMBED}: the "
                            "weights contradict the config; set tie_word_embeddings to false "
                            "to train them untied, as transformers would")
        unused.remove(_HEAD)
    layers = sorted({int(m.group(1)) for n in unused if (m := _LAYER.match(n))
                     and int(m.group(1)) >= cfg.n_layers})
    if layers:
        raise UserError(f"{path} holds weights of model.layers."
                        f"{_some([str(i) for i in layers])}, but its config.json has "
                        f"num_hidden_layers {cfg.n_layers}")
    biases = [n for n in unused if n.endswith(".bias")]
    if biases:
        raise UserError(f"{path} holds {len(biases)} bias tensor(s) its config.json's model "
                        f"has none of, e.g. {_some(biases, 2)}: these weights are not that model")
    return unused


def unused_line(names: list[str]) -> str:
    return f"{len(names)} tensor(s) in its weights are not used by the model: {_some(names)}"


def _equal(where: dict[str, Path], a: str, b: str, chunk_bytes: int = 64 << 20) -> bool:
    """Whether tensors a and b hold the same values, compared a block of rows at a time."""
    with safe_open(where[a], framework="pt") as fa, safe_open(where[b], framework="pt") as fb:
        sa, sb = fa.get_slice(a), fb.get_slice(b)
        shape = sa.get_shape()
        if shape != sb.get_shape():
            return False
        rows = max(1, chunk_bytes // (4 * max(1, shape[-1])))
        return all(torch.equal(sa[i:i + rows].float(), sb[i:i + rows].float())
                   for i in range(0, shape[0], rows))


def check_export_dir(out_dir: str | Path) -> Path:
    """out_dir, refused where it is a file or holds weights already: an old index and shards
    left beside a new model.safetensors made two models of it (transformers read the new one,
    ratrain the old). `export` may call this before it reads the checkpoint."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file: export into a directory")
    held = sorted(f.name for pattern in ("*.safetensors*", "pytorch_model*.bin*")
                  for f in out.glob(pattern))
    if held:
        raise UserError(f"{out} already holds weights ({', '.join(held[:3])}"
                        f"{' ...' if len(held) > 3 else ''}): export into a new directory")
    return out


def write_config(out: Path, config: dict, token_ids: dict[str, int | None]) -> None:
    """config.json, with the tokenizer's bos/eos ids, and (where there are ids)
    generation_config.json, which `generate` reads to know where a document ends."""
    (out / "config.json").write_text(json.dumps({**config, **token_ids}, indent=2) + "\n")
    if token_ids:
        (out / "generation_config.json").write_text(json.dumps(token_ids, indent=2) + "\n")


DESCRIBING = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def refuse_other_files(out: Path, written: dict[str, bytes], loose: tuple[str, ...] = ()) -> None:
    """Refuse an `out` that holds a file of DESCRIBING other than the one an export writes
    (`written`: name -> its bytes): until 2026-12-03 another model's config.json or
    tokenizer.json there was replaced without a word. The same file (--tokenizer
    OUT/tokenizer.json) is fine. `loose`: config.json's keys not known yet (torch_dtype,
    before the checkpoint is read), left out of its comparison."""
    for name in DESCRIBING:
        there = out / name
        # one it does not write (no tokenizer known) is left as it is: the user's own
        if not there.is_file() or name not in written:
            continue
        if not _same(there.read_bytes(), written[name], loose if name == "config.json" else ()):
            raise UserError(f"{there} already exists and is not the {name} this export writes "
                            f"(another model's?): export into a new directory, or remove it")


def _same(found: bytes, wanted: bytes, loose: tuple[str, ...]) -> bool:
    if not loose:
        return found == wanted
    try:
        a, b = json.loads(found), json.loads(wanted)
    except ValueError:  # UnicodeDecodeError is a ValueError
        return False
    return (isinstance(a, dict) and {k: v for k, v in a.items() if k not in loose}
            == {k: v for k, v in b.items() if k not in loose})
