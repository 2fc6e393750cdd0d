"""What one data-parallel replica of a run trains and validates on, from the run config; and
the checks of the data that can be the user's mistake, made once before any process starts."""

from __future__ import annotations

import sys
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.data.corpus import corpus_files, stdlib_root
from ratrain.data.loader import MicroBatchLoader, eval_batches
from ratrain.data.tokenizer import check_fits, load_tokenizer, no_eos_note, unused_vocab_note
from ratrain.data.tokens import check_token_ids, is_token_file, load_tokens, split_train_val


def make_data(cfg: RunConfig, tokenizer, dp: int, replica: int, progress: bool = False,
              tokenize: bool = True):
    """This replica's training loader and validation micro-batches (`tokenize`: as
    load_tokens takes it)."""
    return _replica_data(cfg, tokenizer, dp, replica, progress, tokenize)[:2]


def _replica_data(cfg: RunConfig, tokenizer, dp: int, replica: int, progress: bool,
                  tokenize: bool):
    """make_data's (loader, validation batches), and the whole stream they are cut from."""
    t = cfg.train
    tokens = load_tokens(cfg.data, tokenizer, progress=progress, tokenize=tokenize)
    train_tokens, val_tokens = split_train_val(tokens, cfg.data.val_fraction)
    loader = MicroBatchLoader(train_tokens, t.seq_len, t.global_batch, t.micro_batch_size,
                              dp_size=dp, dp_rank=replica, seed=t.seed)
    val = (eval_batches(val_tokens, t.seq_len, t.micro_batch_size,
                        t.eval_batches * t.global_batch, dp, replica)
           if t.eval_batches > 0 else [])
    return loader, val, tokens


def check_data(cfg: RunConfig, progress: bool = False, first_here: bool = True,
               first: bool = True) -> None:
    """The tokenizer against the model, a pre-tokenized file's ids against the vocabulary, and
    enough tokens for a step (a UserError each). Tokenizes the data once (cached), so that the
    ranks only memory-map the cached file. Under torchrun, where every rank checks:
    `first_here`, this node's first rank, tokenizes (the others wait for its file), and
    `first`, the run's first, alone reads a pre-tokenized file whole for its largest id (64
    ranks read a 100 GB file 64 times) and notes what the tokenizer changes about the data.
    With `progress`, says what the run reads (data_line)."""
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_fits(tokenizer, cfg.model.vocab_size)
    pretokenized = is_token_file(cfg.data.path)
    if pretokenized and first:
        check_token_ids(load_tokens(cfg.data, tokenizer), cfg.model.vocab_size,
                        str(cfg.data.path))
    loader, _, tokens = _replica_data(cfg, tokenizer, cfg.parallel.dp, 0, progress, first_here)
    notes = first and not pretokenized  # a token file's ids are its own, whatever the tokenizer
    # the corpus is walked again only to be said (load_tokens keeps its files to itself)
    files = (_files(cfg.data.path) if progress or (notes and tokenizer.eos_id is None)
             else [])
    if notes:
        joined = len(files) > 1 or any(f.suffix.lower() == ".jsonl" for f in files)
        for note in (joined and no_eos_note(tokenizer),
                     unused_vocab_note(tokenizer, cfg.model.vocab_size)):
            if note:
                print(note, file=sys.stderr, flush=True)
    if progress:
        print(data_line(cfg, len(files), len(tokens), loader.n_windows), file=sys.stderr,
              flush=True)


def _files(path: str | None) -> list[Path]:
    return [Path(path)] if is_token_file(path) else corpus_files(path)[1]


def data_line(cfg: RunConfig, files: int, tokens: int, train_windows: int) -> str:
    """What a run reads, said at its start: the data, its files and tokens, and the epochs
    over its training split (`train_windows` sequences) that the run's steps take."""
    source = cfg.data.path or f"Python's standard library ({stdlib_root()})"
    epochs = cfg.train.steps * cfg.train.global_batch / train_windows
    return (f"data {source}: {_count(files, 'file')}, {tokens:,} tokens; "
            f"{_epochs(epochs)} of its training split in {_count(cfg.train.steps, 'step')}")


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _epochs(n: float) -> str:
    if n == 1:
        return "1 epoch"
    return f"{n:,.0f} epochs" if n >= 100 else f"{n:.3g} epochs"
