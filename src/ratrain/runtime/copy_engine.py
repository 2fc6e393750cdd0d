"""Copies between the home tier (host) and the compute device, off the compute stream.

On CUDA every copy runs on one side stream in issue order, after the work the compute stream has
queued so far, and returns an event; the compute stream waits for that event only where the
program has a wait action (WP, WL). On a CPU-only run the host tier is the device's own memory: a
copy is a plain synchronous copy and there is nothing to wait for.
"""

from __future__ import annotations

import torch

FOLD_CHUNK = 1 << 20  # elements add_to_fp32 converts at a time: a 4 MB scratch that stays in cache


class CopyEngine:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._scratch: torch.Tensor | None = None  # add_to_fp32's, made at its first use

    def host_empty(self, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A host buffer shaped like `like`: pinned when a GPU will copy to or from it
        asynchronously (pageable memory would make those copies synchronous)."""
        return torch.empty(like.shape, dtype=dtype or like.dtype, device="cpu",
                           pin_memory=self.stream is not None)

    def add_to_fp32(self, acc: torch.Tensor, low: torch.Tensor) -> None:
        """acc += low on the host, `low` a bf16/fp16 copy of a gradient: chunk by chunk through
        a small fp32 scratch. torch's add_ of a lower-precision tensor (or of its .float())
        ran 5-10x slower than a conversion copy and an fp32 add (50M elements on 2 cores:
        116-245 ms against 21 ms, 2026-11-26); the sums are bit for bit the same."""
        acc, low = acc.view(-1), low.view(-1)
        if self._scratch is None:
            self._scratch = torch.empty(FOLD_CHUNK, dtype=torch.float32)
        for start in range(0, low.numel(), FOLD_CHUNK):
            part = low[start:start + FOLD_CHUNK]
            acc[start:start + part.numel()].add_(self._scratch[:part.numel()].copy_(part))

    def copy(self, dst: torch.Tensor, src: torch.Tensor):
        """Start `dst.copy_(src)`; returns the event that marks its completion (None on CPU)."""
        if self.stream is None:
            dst.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        for t in (dst, src):  # the allocator must not hand these out again before the copy ran
            if t.is_cuda:
                t.record_stream(self.stream)
        return done

    def wait(self, event) -> None:
        """Make the compute stream wait for a copy (the host does not block)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
