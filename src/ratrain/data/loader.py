"""Deterministic micro-batches per data-parallel rank, independent of how the run is parallel.

The token stream is cut into non-overlapping windows of seq_len + 1 tokens (stride seq_len): a
window w gives inputs w[:-1] and targets w[1:]. Epoch e visits the windows in the order of a
permutation drawn from `numpy.random.default_rng([seed, e])`; the epochs laid end to end form
one endless sequence of windows, and optimizer step s takes positions
[s * global_batch, (s + 1) * global_batch) of it. DP rank r takes the r-th contiguous slice of
that global batch and cuts it into micro-batches in order, so concatenating the ranks'
micro-batches gives the same global batch for every dp (and pp never enters). Every step is a
pure function of (seed, step): resuming at step k reproduces what an uninterrupted run sees.
"""

from __future__ import annotations

import numpy as np
import torch

from ratrain.data.tokens import stream_fingerprint
from ratrain.errors import UserError

Batch = tuple[torch.Tensor, torch.Tensor]


class MicroBatchLoader:
    """This rank's micro-batches for each optimizer step; iterate to walk the steps in order."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        global_batch: int,
        micro_batch_size: int,
        dp_size: int = 1,
        dp_rank: int = 0,
        seed: int = 0,
    ):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
        if global_batch % (dp_size * micro_batch_size):
            raise UserError(
                f"global batch {global_batch} does not split into dp={dp_size} replicas of "
                f"whole micro-batches of {micro_batch_size}"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.per_rank = global_batch // dp_size
        self.n_micro = self.per_rank // micro_batch_size
        self.n_windows = _count_windows(tokens, seq_len, "training")
        if self.n_windows < global_batch:
            raise UserError(
                f"the training split has {len(tokens)} tokens, {_sequences(self.n_windows)} "
                f"of {seq_len} + 1 tokens, fewer than one global batch of {global_batch}; "
                "use more data, a shorter seq_len or a smaller global batch"
            )
        self.step = 0
        self._perms: dict[int, np.ndarray] = {}
        self._fingerprint: str | None = None  # hashed at the first state_dict, once

    def step_batches(self, step: int) -> list[Batch]:
        """This rank's micro-batches (x, y), each int64 of shape [micro_batch_size, seq_len]."""
        start = step * self.global_batch + self.dp_rank * self.per_rank
        windows = self._windows_at(np.arange(start, start + self.per_rank, dtype=np.int64))
        return _micro_batches(self.tokens, windows, self.seq_len, self.micro_batch_size)

    def state_dict(self) -> dict[str, int | str]:
        """The next step to be returned, all a resumed run needs besides seed and config; and
        how many tokens the training split held and a hash of them, by which a resume tells
        changed data (the count alone missed an edit of the same length)."""
        if self._fingerprint is None:
            self._fingerprint = stream_fingerprint(self.tokens)
        return {"step": self.step, "tokens": len(self.tokens), "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, int]) -> None:
        step = state["step"]
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"loader state step must be a non-negative int, got {step!r}")
        self.step = step

    def __iter__(self) -> MicroBatchLoader:
        return self

    def __next__(self) -> list[Batch]:
        batches = self.step_batches(self.step)
        self.step += 1
        return batches

    def _windows_at(self, positions: np.ndarray) -> np.ndarray:
        epochs, offsets = np.divmod(positions, self.n_windows)
        out = np.empty_like(positions)
        # A step's positions touch at most two epochs (one global batch <= one epoch).
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e))[offsets[sel]]
        return out

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            # Keep only the neighbouring epoch: steps are walked in order.
            self._perms = {e: p for e, p in self._perms.items() if abs(e - epoch) <= 1}
            rng = np.random.default_rng([self.seed, epoch])
            self._perms[epoch] = rng.permutation(self.n_windows)
        return self._perms[epoch]


def eval_batches(
    tokens: np.ndarray,
    seq_len: int,
    micro_batch_size: int,
    n_sequences: int,
    dp_size: int = 1,
    dp_rank: int = 0,
) -> list[Batch]:
    """This rank's share of a fixed validation set: the validation split's first `n_sequences`
    windows, in order (no shuffling), in micro-batches.

    The set is what the run validates on whatever computes it: `n_sequences` is the caller's
    (train.eval_batches global batches), not a count of micro-batches, which made the loss of
    the same weights depend on --micro-batch-size and on the plan a search chose (until
    2026-11-29). Where the split holds fewer, the set is the whole micro-batches it holds. Rank
    r gets the r-th contiguous share of the micro-batches, which may be empty or one shorter
    than another rank's where dp does not divide them (only then: a global batch's sequences
    split evenly). Combine ranks by summing losses and token counts, not by averaging rank
    means.
    """
    if n_sequences <= 0:
        return []
    n = eval_sequences(tokens, seq_len, micro_batch_size, n_sequences) // micro_batch_size
    lo, hi = dp_rank * n // dp_size, (dp_rank + 1) * n // dp_size
    windows = np.arange(lo * micro_batch_size, hi * micro_batch_size, dtype=np.int64)
    return _micro_batches(tokens, windows, seq_len, micro_batch_size)


def eval_sequences(tokens: np.ndarray, seq_len: int, micro_batch_size: int,
                   n_sequences: int) -> int:
    """How many sequences eval_batches' set holds: `n_sequences`, or where the validation split
    holds fewer, its whole micro-batches' (a UserError where it holds none)."""
    if n_sequences <= 0:
        return 0
    n_windows = _count_windows(tokens, seq_len, "validation")
    n = min(n_sequences, n_windows) // micro_batch_size  # whole micro-batches
    if n == 0:
        raise UserError(
            f"the validation split has {len(tokens)} tokens, {_sequences(n_windows)} of "
            f"{seq_len} + 1 tokens, fewer than one micro-batch of {micro_batch_size}; raise "
            "--val-fraction (data.val_fraction) or set --eval-batches (train.eval_batches) to 0"
        )
    return n * micro_batch_size


def _sequences(n: int) -> str:
    return f"{n} sequence" + ("" if n == 1 else "s")


def _count_windows(tokens: np.ndarray, seq_len: int, split: str) -> int:
    n = max(len(tokens) - 1, 0) // seq_len
    if n == 0:
        hint = ("raise --val-fraction (data.val_fraction), or set --eval-batches "
                "(train.eval_batches) to 0 (no validation)"
                if split == "validation" else "give it more text, or a shorter --seq-len")
        raise UserError(
            f"the {split} split has {len(tokens)} tokens, too few for one sequence of "
            f"seq_len {seq_len} (needs {seq_len + 1}); {hint}"
        )
    return n


def _micro_batches(tokens: np.ndarray, windows: np.ndarray, seq_len: int, mbs: int) -> list[Batch]:
    if len(windows) == 0:
        return []
    idx = windows[:, None] * seq_len + np.arange(seq_len + 1)
    data = torch.from_numpy(np.asarray(tokens)[idx].astype(np.int64))
    # contiguous: callers flatten x and y with .view
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    return list(zip(x.split(mbs), y.split(mbs)))
