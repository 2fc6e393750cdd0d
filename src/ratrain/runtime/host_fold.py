"""A GPU view's gradients on their way into a host-homed unit's fp32 accumulation (the fold of
runtime/unit_state.py where the state lives across a host link), and when that accumulation is
zero.

The gradients leave on the copy engine's gradient stream, and the host touches them only when
something next reads the accumulation (the unit's next fold, the sync, the norm, the update): by
then the copy is long done, so the compute stream never waits for it. The step's first fold of a
unit finds the accumulation zero: the gradients are cast to fp32 on the device and copied
straight into it, with no work for the host (on the H200's host, adding a 4-block llama2-7b's
bf16 gradients took ~300 ms a step, 2026-11-26). Later folds land in pinned buffers in their own
dtype and are added on the host.

Since that first fold overwrites the accumulation, the update need not zero it: it can mark it
stale (`zeroed(lazily=True)`), and it is zeroed only where something reads it before a fold
has overwritten it (`settle`), or, per parameter, where a fold brings no gradient for it.
"""

from __future__ import annotations

import torch

from ratrain.runtime.copy_engine import CopyEngine


class HostFold:
    """One unit's folds across the link: the fold in flight (its copy's event and the staged
    buffers left to add), whether anything was folded since the update (`zero`), and whether
    the accumulation is zero only in name (`stale`: it still holds the last step's sum)."""

    def __init__(self, copies: CopyEngine):
        self.copies = copies
        self.zero = True
        self.stale = False
        self._folding = None  # (event, [(accumulator slice, pinned copy of a view's gradient)])

    def fold(self, grads: list[torch.Tensor | None], slices: list[torch.Tensor],
             overwrite: bool) -> None:
        """Send `grads` (a view's, or a run's fp32 sum) into the accumulation's `slices`;
        `overwrite`: the first fold since the update may copy over it (the accumulation lives
        for the step)."""
        self.finish()
        into_zero = self.zero and overwrite
        staged, done = [], None
        for g, acc in zip(grads, slices):
            if g is not None:
                if into_zero:
                    done = self.copies.copy(acc, g, gradient=True)
                else:
                    # lives until the next fold reads it: a block of the caching
                    # allocator's, handed out again every step, not an arena's
                    host = self.copies.host_empty(g)
                    done = self.copies.copy(host, g, gradient=True)
                    staged.append((acc, host))
            elif into_zero and self.stale:
                acc.zero_()  # no gradient overwrites this parameter's last one
        self.zero = self.stale = False
        self._folding = (done, staged)

    def finish(self) -> None:
        """Wait for the last fold's copies and add them."""
        if self._folding is None:
            return
        done, staged = self._folding
        self._folding = None
        if done is not None:
            done.synchronize()
        for acc, host in staged:
            self.copies.add_to_fp32(acc, host)

    def settle(self, grad: torch.Tensor | None) -> None:
        """Before the accumulation `grad` is read: the last fold added, and zeroed if stale."""
        self.finish()
        if self.stale:
            grad.zero_()
            self.stale = False

    def zeroed(self, lazily: bool) -> None:
        """The update zeroed the accumulation, or (`lazily`) left it for the next fold."""
        self.finish()
        self.zero, self.stale = True, lazily
