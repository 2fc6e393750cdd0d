"""The squared gradient norm of host-resident state on a GPU run, on every core (the norm, N)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

NORM_CHUNK = 1 << 23  # elements one thread takes at a time (32 MB of fp32)
NORM_ROW = 1 << 12  # elements one fp32 norm sums: its error stays ~1e-8 relative
_norm_pool: ThreadPoolExecutor | None = None


def host_sq_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The squared L2 norm of host tensors (fp32, 0-d), chunk by chunk on a thread each:
    torch's CPU vector_norm runs on one thread (a 4-block llama2-7b's 1.07B gradients: ~250
    ms of a step on the H200's host, 2026-11-26) and, over a whole 8M-element tensor, was off
    by 2e-4 relative. Here each fp32 norm sums NORM_ROW elements and their squares are added
    in fp64. No CPU-only run takes this path, so those keep clip_grad_norm_'s bits."""
    global _norm_pool
    if _norm_pool is None:
        _norm_pool = ThreadPoolExecutor(torch.get_num_threads(), thread_name_prefix="ratrain-norm")
    chunks = [flat[i:i + NORM_CHUNK] for g in grads for flat in (g.reshape(-1),)
              for i in range(0, flat.numel(), NORM_CHUNK)]
    return torch.stack([torch.zeros((), dtype=torch.float64), *_norm_pool.map(_sq_sum, chunks)]
                       ).sum().float()


def _sq_sum(chunk: torch.Tensor) -> torch.Tensor:
    whole = chunk.numel() - chunk.numel() % NORM_ROW
    # a bf16 accumulation's (runtime/host_grad.py) summed in fp32 too
    norms = torch.cat([torch.linalg.vector_norm(chunk[:whole].view(-1, NORM_ROW), dim=1,
                                                dtype=torch.float32),
                       torch.linalg.vector_norm(chunk[whole:], dtype=torch.float32).view(1)]
                      ).double()
    return (norms * norms).sum()
