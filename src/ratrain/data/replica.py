"""What one data-parallel replica of a run trains and validates on, from the run config; and
the checks of the data that can be the user's mistake, made once before any process starts."""

from __future__ import annotations

from ratrain.config import RunConfig
from ratrain.data.loader import MicroBatchLoader, eval_batches
from ratrain.data.tokenizer import check_fits, load_tokenizer
from ratrain.data.tokens import check_token_ids, is_token_file, load_tokens, split_train_val


def make_data(cfg: RunConfig, tokenizer, dp: int, replica: int, progress: bool = False,
              tokenize: bool = True):
    """This replica's training loader and validation micro-batches (`tokenize`: as
    load_tokens takes it)."""
    t = cfg.train
    tokens = load_tokens(cfg.data, tokenizer, progress=progress, tokenize=tokenize)
    train_tokens, val_tokens = split_train_val(tokens, cfg.data.val_fraction)
    loader = MicroBatchLoader(train_tokens, t.seq_len, t.global_batch, t.micro_batch_size,
                              dp_size=dp, dp_rank=replica, seed=t.seed)
    val = (eval_batches(val_tokens, t.seq_len, t.micro_batch_size,
                        t.eval_batches * t.global_batch, dp, replica)
           if t.eval_batches > 0 else [])
    return loader, val


def check_data(cfg: RunConfig, progress: bool = False, first_here: bool = True,
               first: bool = True) -> None:
    """The tokenizer against the model, a pre-tokenized file's ids against the vocabulary, and
    enough tokens for a step (a UserError each). Tokenizes the data once (cached), so that the
    ranks only memory-map the cached file. Under torchrun, where every rank checks:
    `first_here`, this node's first rank, tokenizes (the others wait for its file), and
    `first`, the run's first, alone reads a pre-tokenized file whole for its largest id (64
    ranks read a 100 GB file 64 times)."""
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_fits(tokenizer, cfg.model.vocab_size)
    if is_token_file(cfg.data.path) and first:
        check_token_ids(load_tokens(cfg.data, tokenizer), cfg.model.vocab_size,
                        str(cfg.data.path))
    make_data(cfg, tokenizer, cfg.parallel.dp, 0, progress, tokenize=first_here)
