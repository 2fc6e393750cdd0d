"""Copies between the home tier (host) and the compute device, off the compute stream.

On CUDA every copy runs on a side stream in issue order, after the work the compute stream has
queued so far, and returns an event; the compute stream waits for that event only where the
program has a wait action (WP, WL). Views, offloads and reloads share one stream (a reload must
follow its offload); the gradients a backward sends to host-homed state take a second one, so
they cross the link while the next views come the other way. On a CPU-only run the host tier is
the device's own memory: a copy is a plain synchronous copy and there is nothing to wait for.
"""

from __future__ import annotations

import threading

import torch

from ratrain.runtime.host_arena import HostArena

FOLD_CHUNK = 1 << 20  # elements add_to_fp32 converts at a time: a 4 MB scratch that stays in cache
CAST_CHUNK = 1 << 24  # elements a copy across devices and dtypes stages at a time (64 MB fp32)


class CopyEngine:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.grad_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # add_to_fp32's scratch, one per thread: the host update thread adds a unit's last
        # fold (SN) while the walker adds another's
        self._scratch = threading.local()
        self._staging: dict = {}  # _cast_on_device's device buffer, one per stream

    def host_empty(self, like: torch.Tensor) -> torch.Tensor:
        """A short-lived host buffer shaped like `like`: pinned when a GPU will copy to or from
        it asynchronously (pageable memory would make those copies synchronous). Pinned through
        torch's caching host allocator, which rounds it up to a power of two but hands the same
        block out again to the next buffer of its size: right for what comes back every step,
        wrong for what lives for the run (host_arena)."""
        return torch.empty(like.shape, dtype=like.dtype, device="cpu",
                           pin_memory=self.stream is not None)

    def host_arena(self, nbytes: int) -> HostArena:
        """A host block of `nbytes` to carve long-lived tensors from: page-locked as it is
        when a GPU will copy to or from it."""
        return HostArena(nbytes, pinned=self.stream is not None)

    def add_to_fp32(self, acc: torch.Tensor, low: torch.Tensor) -> None:
        """acc += low on the host (acc fp32, or a bf16 accumulation: runtime/host_grad.py), `low`
        a bf16/fp16 copy of a gradient: chunk by chunk through a small fp32 scratch. torch's
        add_ of a lower-precision tensor (or of its .float()) ran 5-10x slower than a
        conversion copy and an fp32 add (50M elements on 2 cores: 116-245 ms against 21 ms,
        2026-11-26); the sums are bit for bit the same. The same holds for a bf16
        accumulation: a copy in its own dtype is added as it is, and a run's fp32 sum
        (run_grads.py) is added to the accumulation made fp32 in the scratch and rounded back
        (20M elements on 2 cores, 2026-11-29: a mixed-dtype add_ took 71 ms against 6 for a
        bf16 copy, 81 against 19 for an fp32 sum)."""
        acc, low = acc.view(-1), low.view(-1)
        if low.dtype == acc.dtype:  # nothing to convert
            acc.add_(low)
            return
        scratch = getattr(self._scratch, "buffer", None)
        if scratch is None:
            scratch = self._scratch.buffer = torch.empty(FOLD_CHUNK, dtype=torch.float32)
        for start in range(0, low.numel(), FOLD_CHUNK):
            part = low[start:start + FOLD_CHUNK]
            into, wide = acc[start:start + part.numel()], scratch[:part.numel()]
            if acc.dtype == torch.float32:
                into.add_(wide.copy_(part))
            else:  # added in fp32, rounded once
                into.copy_(wide.copy_(into).add_(part))

    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, gradient: bool = False):
        """Start `dst.copy_(src)`; returns the event that marks its completion (None on CPU).
        `gradient`: a backward's gradient on its way to host-homed state (the second stream)."""
        if self.stream is None:
            dst.copy_(src)
            return None
        stream = self.grad_stream if gradient else self.stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            if dst.is_cuda != src.is_cuda and dst.dtype != src.dtype:
                self._cast_on_device(dst, src, stream)
            else:
                dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        for t in (dst, src):  # the allocator must not hand these out again before the copy ran
            if t.is_cuda:
                t.record_stream(stream)
        return done

    def _cast_on_device(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None:
        """dst = src in dst's dtype, one of them on the host, on `stream`: chunk by chunk
        through a device staging buffer in the host tensor's dtype, the cast done on the
        device. torch's copy_ across devices and dtypes converts on the host, into pageable
        memory, so it is neither asynchronous nor fast: a pinned fp32 master into a bf16 view
        took ~33 ms a llama2-7b block on the H200 (2026-11-26), where the link moves its 808
        MB of fp32 in ~14 ms. The host's bytes cross the link (4 a parameter for fp32 masters
        and gradients); the staging holds at most CAST_CHUNK elements."""
        host = dst if src.is_cuda else src
        n = min(CAST_CHUNK, src.numel())
        staging = self._staging.get(stream)
        if staging is None or staging.dtype != host.dtype or staging.numel() < n:
            staging = self._staging[stream] = torch.empty(n, dtype=host.dtype, device=self.device)
        flat_dst, flat_src = dst.view(-1), src.reshape(-1)
        for start in range(0, flat_src.numel(), CAST_CHUNK):
            part = flat_src[start:start + CAST_CHUNK]
            staged = staging[:part.numel()]
            staged.copy_(part, non_blocking=True)
            flat_dst[start:start + part.numel()].copy_(staged, non_blocking=True)

    def wait(self, event) -> None:
        """Make the compute stream wait for a copy (the host does not block)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
