"""Waiting on communication with a deadline: a peer that hangs (or was stopped) ends the run
with a message naming the step, the action and whom it waited for, instead of a silent hang.

gloo ignores the process group's timeout for asynchronous work and point-to-point receives
(measured, torch 2.13: an irecv and an async all-reduce waited until the peer exited), so every
wait here passes the deadline to `work.wait` itself.
"""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

from ratrain.errors import RunFailure


class CommFailure(RunFailure):
    """A wait that timed out or lost its peer."""


def wait(work, timeout_s: float, when: str, action: str, peer: str) -> None:
    """Wait for `work` at most `timeout_s`. For the message: `when` ("step 7"), the waiting
    `action` ("WRA3.1"), the `peer` waited for ("rank 1")."""
    _wait(work, timeout_s, when, action, peer, _explain)


def _wait(work, timeout_s: float, when: str, action: str, peer: str, explain) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise CommFailure(explain(e, timeout_s, when, action, peer)) from None


def _explain(e: RuntimeError, timeout_s: float, when: str, action: str, peer: str) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "timed out" in text.lower() or "timeout" in text.lower():
        return (f"{when}: waited {timeout_s:g} s in {action} for {peer} (stopped, hung, or "
                f"slower than --comm-timeout {timeout_s:g})")
    if text.startswith("[") and "] " in text:  # gloo's source location
        text = text.split("] ", 1)[1]
    if "connection closed" in text.lower() or "connection reset" in text.lower():
        return f"{when}: {action}: lost {peer} (its connection closed: it died or was killed)"
    return f"{when}: {action}: communication with {peer} failed: {text}"


def late(e: RuntimeError, timeout_s: float, when: str, action: str, peer: str) -> str:
    """The start's wording: before the first step a peer that times out has most often not
    arrived yet (its node still preparing: tokenizing a large corpus takes minutes), not hung."""
    text = str(e).lower()
    if "timed out" not in text and "timeout" not in text:
        return _explain(e, timeout_s, when, action, peer)
    who = f"{peer} did not all arrive" if peer.startswith("ranks ") else f"{peer} did not arrive"
    return (f"{when}: {action}: {who} within --comm-timeout {timeout_s:g} s "
            f"(still preparing, or tokenizing its data?); raise --comm-timeout to wait longer")


def ranks_text(ranks, me: int) -> str:
    """The ranks other than `me`: "rank 1", "ranks 1, 3"."""
    others = [r for r in ranks if r != me]
    return ("rank " if len(others) == 1 else "ranks ") + ", ".join(map(str, others))


def _everyone_else() -> str:
    return ranks_text(range(dist.get_world_size()), dist.get_rank())


def barrier(timeout_s: float, when: str, action: str) -> None:
    wait(dist.barrier(async_op=True), timeout_s, when, action, _everyone_else())


def all_gather_object(obj, timeout_s: float, when: str, action: str, device: torch.device) -> list:
    """Every rank's `obj` (picklable), in rank order."""
    return _all_gather_object(obj, timeout_s, when, action, device, _explain)


def gather_at_start(obj, timeout_s: float, action: str, device: torch.device) -> list:
    """all_gather_object for the start's meetings (joining, the agreements before the first
    step), where a timed-out peer is told as one that has not arrived (`late`)."""
    return _all_gather_object(obj, timeout_s, "start of training", action, device, late)


def _all_gather_object(obj, timeout_s: float, when: str, action: str, device: torch.device,
                       explain) -> list:
    world = dist.get_world_size()
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    _wait(dist.all_gather(sizes, size, async_op=True), timeout_s, when, action, _everyone_else(),
          explain)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    out = [torch.empty_like(padded) for _ in range(world)]
    _wait(dist.all_gather(out, padded, async_op=True), timeout_s, when, action, _everyone_else(),
          explain)
    return [pickle.loads(t[:int(s.item())].cpu().numpy().tobytes()) for t, s in zip(out, sizes)]
