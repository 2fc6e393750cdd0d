"""Tokenizers: raw UTF-8 bytes (no files needed) or any Hugging Face `tokenizer.json`."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np

from ratrain.data.corpus import without_surrogates
from ratrain.errors import UserError

# Document separators, most specific to pretraining first: Qwen has both <|endoftext|> and
# <|im_end|> and LLaMA-3 both <|end_of_text|> and <|eot_id|>; the chat-turn ends come last.
_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>", "<|eot_id|>")
BPE_EOS = "<|endoftext|>"


class Tokenizer(Protocol):
    name: str
    """Stable identity of the vocabulary and rules; part of the token cache's key."""
    vocab_size: int
    """One more than the largest id the tokenizer can produce."""
    eos_id: int | None
    """Id placed after every document, or None when the tokenizer has no such token."""

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Bulk path for corpus tokenization: one integer array per text."""
        ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; id 256 ends a document."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return self._bytes(text).tolist()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self._bytes(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        arr = np.fromiter(ids, dtype=np.int64)
        # The end-of-document id has no bytes; it is dropped rather than invented.
        return arr[arr < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __str__(self) -> str:
        return "byte"

    @staticmethod
    def _bytes(text: str) -> np.ndarray:
        try:
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        except UnicodeEncodeError:  # lone surrogates (the corpus reader replaces them already)
            return np.frombuffer(without_surrogates(text).encode("utf-8"), dtype=np.uint8)


class HFTokenizer:
    """A Hugging Face `tokenizer.json`, run by the `tokenizers` library."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            blob = self.path.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read tokenizer {self.path}: {e}") from None
        self._tok = _parsed(self.path, blob)
        self.name = "hf:" + hashlib.sha256(blob).hexdigest()
        vocab = self._tok.get_vocab(with_added_tokens=True)
        if not vocab:
            raise UserError(f"tokenizer {self.path} has an empty vocabulary: it encodes nothing")
        # Added tokens may sit above the base vocabulary, so size by the largest id.
        self.vocab_size = max(vocab.values()) + 1
        # A document's "<|endoftext|>" (or any special token's text) is its text: matched, it
        # put end-of-document ids inside documents. add_special_tokens=False does not stop
        # that matching; this does. The special tokens' ids are still placed by us (eos_id).
        self._tok.encode_special_tokens = True
        self.eos_id = next(
            (i for i in map(self._tok.token_to_id, _EOS_CANDIDATES) if i is not None), None
        )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(without_surrogates(text), add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # encode_batch runs the texts in parallel inside the Rust library; its _fast form
        # (tokenizers >= 0.21) keeps no character offsets, which a corpus does not need
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        try:
            encodings = encode(texts, add_special_tokens=False)
        except TypeError:  # a lone surrogate has no UTF-8 to hand over
            encodings = encode([without_surrogates(t) for t in texts], add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def post_processor_adds(self) -> list[str]:
        """The tokens the file's post-processor (TemplateProcessing: a BOS) adds to a text it
        encodes; ratrain never applies it, since documents are joined by the eos id alone."""
        e = self._tok.encode("a", add_special_tokens=True)
        return [t for t, added in zip(e.tokens, e.special_tokens_mask) if added]

    def __str__(self) -> str:
        return str(self.path)


WHAT_A_TOKENIZER_IS = ("--tokenizer takes 'byte' (the built-in tokenizer: UTF-8 bytes), a "
                       "Hugging Face tokenizer.json (as `ratrain tokenizer` writes) or a "
                       "directory holding one")


def _parsed(path: Path, blob: bytes):
    """The `tokenizers` library's tokenizer of a tokenizer.json's bytes; a file that is none
    (empty, binary: a .bin of ids or a SentencePiece model given by mistake) refused with what
    a tokenizer file must be, where the library's message named a byte position or a column."""
    if not blob.strip():
        raise UserError(f"tokenizer {path} is empty; {WHAT_A_TOKENIZER_IS}")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"tokenizer {path} is a binary file, not a tokenizer.json (JSON text); "
                        f"{WHAT_A_TOKENIZER_IS}") from None
    from tokenizers import Tokenizer as _HF

    try:
        return _HF.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        if _is_json(text):  # its message named a column of valid JSON, as if malformed
            raise UserError(f"tokenizer {path} is JSON but not a Hugging Face tokenizer.json; "
                            f"{WHAT_A_TOKENIZER_IS}") from None
        raise UserError(f"cannot parse tokenizer {path} ({e}); {WHAT_A_TOKENIZER_IS}") from None


def _is_json(text: str) -> bool:
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def load_tokenizer(spec: str) -> Tokenizer:
    """"byte", a `tokenizer.json` file, or a directory holding one."""
    if spec == "byte":
        return ByteTokenizer()
    if not spec.strip():  # Path("") is ".", where a tokenizer.json was looked for
        raise UserError(f"the tokenizer is empty (--tokenizer \"\"); {WHAT_A_TOKENIZER_IS}")
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            f"tokenizer not found: {spec} (expected 'byte', a tokenizer.json file, "
            "or a directory holding one)"
        )
    return HFTokenizer(path)


def train_bpe(files: Iterable[str | Path], vocab_size: int, out_path: str | Path) -> HFTokenizer:
    """Train a byte-level BPE on `files`, save it as `out_path` (a tokenizer.json) and load it.

    The vocabulary holds the 256 byte symbols, the end-of-document token "<|endoftext|>" and
    learned merges up to `vocab_size`.
    """
    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from ratrain.data.corpus import documents

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise UserError(
            f"a byte-level BPE needs vocab_size >= {len(alphabet) + 1} "
            f"(256 bytes + {BPE_EOS}), got {vocab_size}"
        )
    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOS],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    # Read through our own reader so training sees exactly the text load_tokens will encode.
    tok.train_from_iterator((text for f in files for text, _ in documents(Path(f))),
                            trainer=trainer)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_path))
    return HFTokenizer(out_path)


def check_fits(tokenizer: Tokenizer, model_vocab_size: int,
               weights_from: str | None = None) -> None:
    """Refuse a tokenizer that can produce ids beyond the model's embedding table. Where the
    model starts from the weights in `weights_from` (a Hugging Face directory), their table
    fixes the vocabulary: only a smaller tokenizer fits (a larger model.vocab_size in a
    --config, offered until 2026-12-03, is replaced by the directory's config.json)."""
    if tokenizer.vocab_size > model_vocab_size:
        # the smallest byte-level BPE is 256 bytes and its end-of-document token
        train_one = (f" (`ratrain tokenizer --vocab-size {model_vocab_size}` trains one)"
                     if model_vocab_size > 256 else "")
        if weights_from:
            raise UserError(
                f"tokenizer '{tokenizer}' has {tokenizer.vocab_size} tokens but the model's "
                f"vocabulary is {model_vocab_size}, fixed by the weights in {weights_from}: use "
                f"a tokenizer of at most {model_vocab_size} tokens{train_one}")
        raise UserError(
            f"tokenizer '{tokenizer}' has {tokenizer.vocab_size} tokens but the model's "
            f"vocabulary is {model_vocab_size}; use a model with vocab_size >= "
            f"{tokenizer.vocab_size} (model.vocab_size in a --config file, or a --model whose "
            f"vocabulary is that large) or a smaller --tokenizer{train_one}"
        )


UNUSED_VOCAB_RATIO = 4
"""A model vocabulary this many times the tokenizer's is mostly rows no id reaches (the byte
tokenizer on a preset made for a 32k-128k vocabulary): worth a note, not a refusal."""


def unused_vocab_note(tokenizer: Tokenizer, model_vocab_size: int) -> str | None:
    """A note where most of the model's vocabulary is ids the tokenizer never produces."""
    if model_vocab_size < UNUSED_VOCAB_RATIO * tokenizer.vocab_size:
        return None
    return (f"note: tokenizer '{tokenizer}' has {tokenizer.vocab_size:,} tokens and the model's "
            f"vocabulary is {model_vocab_size:,}: ids {tokenizer.vocab_size:,}-"
            f"{model_vocab_size - 1:,} never occur, and their embedding and head rows cost "
            "memory and time for nothing (a --tokenizer of the model's vocabulary, or "
            "model.vocab_size in a --config file, matches them)")


def post_processor_note(tokenizer: Tokenizer) -> str | None:
    """A note where a tokenizer.json's post-processor adds tokens (a BOS) that the run does
    not: its ids were trained without them, said at the start (silent until 2026-12-03)."""
    added = tokenizer.post_processor_adds() if isinstance(tokenizer, HFTokenizer) else []
    if not added:
        return None
    joined = ("joined by its end-of-document token only" if tokenizer.eos_id is not None
              else "joined with nothing between them")
    return (f"note: tokenizer '{tokenizer}': its post-processor, which adds {' '.join(added)} "
            f"to every text, is not applied (documents are {joined}); `ratrain export` writes "
            "the tokenizer without it, so that it encodes as the run did")


def no_eos_note(tokenizer: Tokenizer) -> str | None:
    """A note where the tokenizer has no end-of-document token: documents are then joined
    with nothing between them, and the model learns one text running into the next."""
    if tokenizer.eos_id is not None:
        return None
    return (f"note: tokenizer '{tokenizer}' has no end-of-document token (none of "
            f"{', '.join(_EOS_CANDIDATES)}): documents are joined with nothing between them, "
            "so the model learns each document's end running into the next one's start")
