"""The tokenizer of an export: the files `transformers.AutoTokenizer` reads (tokenizer.json,
tokenizer_config.json) for the tokenizer a run trained with, and the bos/eos ids that
models/hf_files.write_config gives config.json and generation_config.json.

A run's tokenizer.json is copied as it is, except for a post-processor that adds tokens (a
BOS): the run never applied it, so the copy has none. The chat template and pad token of the
tokenizer_config.json (or chat_template.jinja) beside it are kept; ratrain's own bos, eos and
split_special_tokens replace the rest of that file. ratrain's byte tokenizer has no file of
its own; it is written as an equivalent byte-level BPE without merges (ids 0-255 the bytes, 256
the end of a document), which encodes every text to the ids ByteTokenizer gives.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ratrain.data.tokenizer import BPE_EOS, ByteTokenizer, HFTokenizer, Tokenizer

BYTE_EOS = BPE_EOS  # the name the byte tokenizer's id 256 is given; it has none of its own
_BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")


class ExportTokenizer:
    """What an export writes of `tokenizer`: its files, and its bos/eos ids."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        # AutoTokenizer applies the post-processor by default: the export's ids would start
        # with a token the model never saw in front of a text
        self.dropped = (tokenizer.post_processor_adds() if isinstance(tokenizer, HFTokenizer)
                        else [])
        self._hf = _byte_level_json() if isinstance(tokenizer, ByteTokenizer) else _parsed(tokenizer)
        eos = tokenizer.eos_id
        bos = next((i for i in map(self._hf.token_to_id, _BOS_CANDIDATES) if i is not None), eos)
        # Documents were joined by the eos id alone, so without a BOS token of its own the eos
        # is what preceded every document (GPT-2's bos = eos); None is written as null, else
        # transformers' LlamaConfig assumes bos 1 and eos 2, which are text here
        self.token_ids = {"bos_token_id": bos, "eos_token_id": eos}
        self.kept = _kept_settings(tokenizer, self._hf)

    def write(self, out: Path, max_len: int) -> None:
        """tokenizer.json and tokenizer_config.json into `out` (a directory that exists)."""
        if self.dropped:
            written = json.loads(self.tokenizer.path.read_text())
            written["post_processor"] = None
            (out / "tokenizer.json").write_text(json.dumps(written, indent=2, ensure_ascii=False)
                                                + "\n")
        elif isinstance(self.tokenizer, HFTokenizer):
            copy = out / "tokenizer.json"
            # --tokenizer OUT/tokenizer.json (an earlier export's): the file is there already
            if not (copy.exists() and copy.samefile(self.tokenizer.path)):
                shutil.copyfile(self.tokenizer.path, copy)
        else:
            self._hf.save(str(out / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": max_len,
            # ratrain encodes a special token's text inside a document as text, not as its id
            "split_special_tokens": True,
            "clean_up_tokenization_spaces": False,  # decode gives back the text, spaces and all
        }
        for key, i in self.token_ids.items():
            if i is not None:
                config[key.removesuffix("_id")] = self._hf.id_to_token(i)
        config.update(self.kept)
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def __str__(self) -> str:
        eos = self.token_ids["eos_token_id"]
        what = ("the byte tokenizer (UTF-8 bytes; written as an equivalent byte-level "
                "tokenizer.json)" if isinstance(self.tokenizer, ByteTokenizer)
                else str(self.tokenizer))
        dropped = (f"; written without its post-processor, which adds {' '.join(self.dropped)}"
                   " (the run did not apply it)" if self.dropped else "")
        kept = ", ".join(("its chat template" if key == "chat_template" else f"pad token {value}")
                         for key, value in self.kept.items())
        return what + (f", end of document {self._hf.id_to_token(eos)} = id {eos}"
                       if eos is not None else ", no end-of-document token") + dropped + (
                           f"; with {kept}" if kept else "")


def _kept_settings(tokenizer: Tokenizer, parsed) -> dict:
    """The chat template and pad token of the tokenizer_config.json (and chat_template.jinja)
    beside a tokenizer.json (the run's copies of them: training/run_tokenizer.BESIDE), which
    transformers reads there; a pad token the vocabulary lacks is left out."""
    if not isinstance(tokenizer, HFTokenizer) or tokenizer.path.name != "tokenizer.json":
        return {}
    where = tokenizer.path.parent
    try:
        config = json.loads((where / "tokenizer_config.json").read_text())
    except (OSError, ValueError):  # none, or not JSON: nothing to keep
        config = {}
    config = config if isinstance(config, dict) else {}
    jinja = where / "chat_template.jinja"
    template = jinja.read_text() if jinja.is_file() else config.get("chat_template")
    pad = config.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad  # (an AddedToken's fields)
    kept = {"chat_template": template} if template else {}
    if isinstance(pad, str) and parsed.token_to_id(pad) is not None:
        kept["pad_token"] = pad
    return kept


def _parsed(tokenizer: HFTokenizer):
    from tokenizers import Tokenizer as _HF

    return _HF.from_file(str(tokenizer.path))


def _byte_level_json():
    """ByteTokenizer as a `tokenizers` tokenizer: each byte is one symbol of the byte-level
    alphabet (GPT-2's byte-to-character map), whose id is the byte; no merges; id 256 special."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as _HF

    chars = _byte_chars()
    tok = _HF(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BYTE_EOS, special=True)])
    assert tok.token_to_id(BYTE_EOS) == ByteTokenizer.eos_id
    return tok


def _byte_chars() -> list[str]:
    """The character the byte-level pre-tokenizer maps each byte to (GPT-2's bytes_to_unicode):
    printable Latin-1 bytes are themselves, the others 256 + their rank among them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]
