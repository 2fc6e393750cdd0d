"""Point-to-point transfers between neighbouring stages, tagged so that nothing can cross.

Gloo matches a receive to a send by (peer, tag); a distinct tag per (kind, unit, micro-batch) makes
a mis-ordered program fail loudly instead of silently swapping two micro-batches. NCCL ignores tags
and matches in order, which the schedule checks already guarantee.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ACT, GRAD = 0, 1


def tag(kind: int, unit: int, mb: int, n_micro: int) -> int:
    return (unit * n_micro + mb) * 2 + kind


def isend(t: torch.Tensor, peer: int, group, kind: int, unit: int, mb: int, n_micro: int):
    """`peer` is a global rank; `group` the two-rank group of this link and direction."""
    return dist.isend(t.contiguous(), dst=peer, group=group, tag=tag(kind, unit, mb, n_micro))


def irecv(buf: torch.Tensor, peer: int, group, kind: int, unit: int, mb: int, n_micro: int):
    return dist.irecv(buf, src=peer, group=group, tag=tag(kind, unit, mb, n_micro))
