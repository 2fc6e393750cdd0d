"""The two ranks `ratrain profile` times the links between (measure.py starts them): point to
point and all-reduce over a range of sizes, NCCL between two GPUs, else gloo. Rank 0 writes the
medians as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ratrain.profiling.ranks import LINK_SIZES, Counts, median_s, sync_of


def link_backend() -> str:
    """NCCL between two GPUs; with fewer, gloo on host tensors."""
    return "nccl" if torch.cuda.device_count() >= 2 else "gloo"


def link_rank(counts: Counts, out_dir: str) -> None:
    """One of 2 ranks: point-to-point (one way: half a ping-pong) and all_reduce seconds for
    each of LINK_SIZES; rank 0 writes them."""
    rank = int(os.environ["RANK"])
    backend = link_backend()
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    sync = sync_of(device)
    p2p, all_reduce = [], []
    for size in LINK_SIZES:
        buf = torch.zeros(size // 4, device=device)
        p2p.append(median_s(lambda: _ping_pong(buf, rank), sync, counts.link_warmup,
                            counts.link_repeats) / 2)
        all_reduce.append(median_s(lambda: dist.all_reduce(buf), sync, counts.link_warmup,
                                   counts.link_repeats))
    if rank == 0:
        result = {"p2p_s": p2p, "all_reduce_s": all_reduce}
        Path(out_dir, "result_0.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _ping_pong(buf: torch.Tensor, rank: int) -> None:
    """buf to the other rank and back: an isend/irecv pair each way."""
    peer = 1 - rank
    first, second = (dist.isend, dist.irecv) if rank == 0 else (dist.irecv, dist.isend)
    first(buf, peer).wait()
    second(buf, peer).wait()
