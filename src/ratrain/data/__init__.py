"""Data: the built-in corpus, tokenizers, cached token streams, deterministic micro-batches."""

from ratrain.data.corpus import corpus_files, stdlib_files, stdlib_root, text_files
from ratrain.data.loader import MicroBatchLoader, eval_batches
from ratrain.data.replica import check_data, make_data
from ratrain.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    check_fits,
    load_tokenizer,
    train_bpe,
)
from ratrain.data.tokens import check_token_ids, load_bin, load_tokens, split_train_val

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "MicroBatchLoader",
    "Tokenizer",
    "check_data",
    "check_fits",
    "check_token_ids",
    "corpus_files",
    "eval_batches",
    "load_bin",
    "load_tokenizer",
    "load_tokens",
    "make_data",
    "split_train_val",
    "stdlib_files",
    "stdlib_root",
    "text_files",
    "train_bpe",
]
