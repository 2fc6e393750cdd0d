"""What one data-parallel replica of a run trains and validates on, from the run config; and
the checks of the data that can be the user's mistake, made once before any process starts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ratrain.config import RunConfig

from ratrain.data.corpus import skipped_files_in, stdlib_root
from ratrain.data.loader import MicroBatchLoader, eval_batches, eval_sequences
from ratrain.data.tokenizer import (check_fits, load_tokenizer, no_eos_note, post_processor_note,
                                    unused_vocab_note)
from ratrain.data.tokens import (Corpus, cache_root, check_token_ids, is_token_file,
                                 load_tokens, read_corpus, split_train_val)
from ratrain.errors import UserError

Stream = tuple[str, int]
"""A token stream check_data checked: its file (the cache entry, or the .bin data file) and
its tokens, which every rank then maps (make_data's `stream`). Each rank keyed the files again
until 2026-12-03, and a file written to while the run started gave stage 0 its inputs and the
last stage its targets from different streams."""


def make_data(cfg: RunConfig, tokenizer, dp: int, replica: int, progress: bool = False,
              tokenize: bool = True, stream: Stream | None = None):
    """This replica's training loader and validation micro-batches (`tokenize`: as
    load_tokens takes it), of `stream` where given (check_data's), else of cfg's data."""
    return _replica_data(cfg, tokenizer, dp, replica, progress, tokenize, stream)[:2]


def _replica_data(cfg: RunConfig, tokenizer, dp: int, replica: int, progress: bool,
                  tokenize: bool, stream: Stream | None = None):
    """make_data's (loader, validation batches), and the corpus (read_corpus's) they are cut
    from."""
    t = cfg.train
    corpus = (mapped(stream) if stream else
              read_corpus(cfg.data, tokenizer, progress=progress, tokenize=tokenize))
    train_tokens, val_tokens = split_train_val(corpus.tokens, cfg.data.val_fraction)
    loader = MicroBatchLoader(train_tokens, t.seq_len, t.global_batch, t.micro_batch_size,
                              dp_size=dp, dp_rank=replica, seed=t.seed)
    val = (eval_batches(val_tokens, t.seq_len, t.micro_batch_size,
                        t.eval_batches * t.global_batch, dp, replica)
           if t.eval_batches > 0 else [])
    return loader, val, corpus


def check_data(cfg: RunConfig, progress: bool = False, first_here: bool = True,
               first: bool = True) -> Stream | None:
    """The tokenizer against the model, a pre-tokenized file's ids against the vocabulary, and
    enough tokens for a step (a UserError each). Tokenizes the data once (cached), so that the
    ranks only memory-map the stream checked, which it returns. Under torchrun, where every
    rank checks: `first_here`, this node's first rank, alone reads the data (the others
    take its stream once the world is joined: agreed_plan.agreed_stream), and
    `first`, the run's first, alone reads a pre-tokenized file whole for its largest id (64
    ranks read a 100 GB file 64 times), warns of the data (files mostly undecodable, whether
    tokenized now or cached), notes what the tokenizer changes about it and a validation set
    smaller than --eval-batches asks. With `progress`, says what the run reads (data_line)
    and a model vocabulary far beyond the tokenizer's (a cost, nothing the run does otherwise:
    said with the start's other notes, not under --no-progress)."""
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_fits(tokenizer, cfg.model.vocab_size, cfg.train.init_from)
    pretokenized = is_token_file(cfg.data.path)
    if pretokenized and first:
        check_token_ids(load_tokens(cfg.data, tokenizer), cfg.model.vocab_size,
                        str(cfg.data.path))
    if not first_here:  # it maps its node's first rank's stream (agreed_plan.agreed_stream): the
        return None  # files keyed here, changed meanwhile, named an entry that rank never writes
    loader, _, corpus = _replica_data(cfg, tokenizer, cfg.parallel.dp, 0, progress, True)
    checked = (str(Path(corpus.tokens.filename)), len(corpus.tokens))
    say = [*corpus.warnings] if first else []
    if first and not pretokenized:  # a token file's ids are its own, whatever the tokenizer
        files = corpus.files
        joined = len(files) > 1 or any(f.suffix.lower() == ".jsonl" for f in files)
        say += [skipped_bin_note(cfg, len(files)), joined and no_eos_note(tokenizer),
                post_processor_note(tokenizer),
                progress and unused_vocab_note(tokenizer, cfg.model.vocab_size)]
    if first:
        say.append(eval_cap_note(cfg, split_train_val(corpus.tokens, cfg.data.val_fraction)[1]))
    if progress:
        say.append(data_line(cfg, len(corpus.files), len(corpus.tokens), loader.n_windows))
    for line in say:
        if line:
            print(line, file=sys.stderr, flush=True)
    return checked


def mapped(stream: Stream) -> Corpus:
    """A handed stream, memory-mapped: its first `tokens` (a .bin data file may have grown)."""
    path, tokens = stream
    dtype = np.dtype("<u4" if path.lower().endswith(".u32.bin") else "<u2")
    try:
        return Corpus(np.memmap(path, dtype=dtype, mode="r", shape=(tokens,)), [Path(path)])
    except (OSError, ValueError):
        raise UserError(f"the data changed while the run started: {path} no longer holds the "
                        f"{tokens:,} tokens checked; rerun once --data is no longer being "
                        "written") from None


def skipped_bin_note(cfg: RunConfig, text_files: int) -> str | None:
    """Where a data directory holds files a run on it skips, the line that says so: of
    pre-tokenized streams (.bin), how to train on one (a run on nanoGPT's layout trained on its
    script and readme without a word until 2026-12-03); of other suffixes (a README, a .log, a
    .gz), which ones (dropped unsaid until 2026-12-04). A token cache inside the directory is
    no file of the user's."""
    cache = cache_root(cfg.data).resolve()
    skipped = [f for f in skipped_files_in(cfg.data.path)
               if not f.resolve().is_relative_to(cache)]
    if not skipped:
        return None
    root = Path(cfg.data.path).expanduser()
    bins = [f for f in skipped if f.suffix.lower() == ".bin"]
    if bins:
        names, more = _named(root, bins)
        return (f"note: data directory {root} holds pre-tokenized {names}{more}, which a run on "
                f"the directory skips (it reads its {_count(text_files, 'text file')}); a "
                f"pre-tokenized stream is passed as one .bin file: --data {bins[0]}")
    names, more = _named(root, skipped)
    return (f"note: data directory {root} holds {names}{more}, which a run on it skips: it "
            f"reads {_count(text_files, 'text file')} of known text suffixes (.txt, .md, "
            ".jsonl, source code; compressed files are to be decompressed first)")


def _named(root: Path, files: list[Path]) -> tuple[str, str]:
    names = ", ".join(f.relative_to(root).as_posix() for f in files[:3])
    return names, (f" and {len(files) - 3:,} more" if len(files) > 3 else "")


def eval_cap_note(cfg: RunConfig, val_tokens) -> str | None:
    """Where the validation split holds fewer sequences than --eval-batches asks, the line
    that says how many the run validates on (eval_batches caps them, without a word until
    2026-12-03) and how to get more."""
    t = cfg.train
    asked = t.eval_batches * t.global_batch
    got = eval_sequences(val_tokens, t.seq_len, t.micro_batch_size, asked)
    if got == asked:
        return None
    batches = got / t.global_batch
    return (f"note: --eval-batches {t.eval_batches} asks for {asked:,} validation sequences, "
            f"more than the validation split holds (--val-fraction {cfg.data.val_fraction:g}: "
            f"{len(val_tokens):,} tokens): the run validates on {got:,} ({batches:.3g} "
            f"{'batch' if batches == 1 else 'batches'} of {t.global_batch}) instead; a larger "
            "--val-fraction (data.val_fraction) gives more")


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
