"""Waiting for communication, per backend: the one place that knows how a wait behaves.

gloo (CPU): the host waits, with a deadline (runtime/timed_comm.py: gloo ignores the process
group's timeout for asynchronous work and receives), so a hung peer ends the run with a message
naming the step, the action and the peer.

NCCL (CUDA): `work.wait()` without a timeout makes the current stream wait for the work; the
host goes on queueing (a wait with a timeout would spin the host until the collective has
completed, so the host could never run ahead of the GPU). A hung peer is caught by the process
group's timeout and NCCL's watchdog; an error it raises here is named by step and action.
"""

from __future__ import annotations

import torch

from ratrain.runtime import timed_comm
from ratrain.runtime.timed_comm import CommFailure


class Comm:
    def __init__(self, groups, timeout_s: float):
        self.groups = groups
        self.timeout_s = timeout_s

    def wait(self, work, when: str, action: str, peer: str) -> None:
        raise NotImplementedError

    def wait_host(self, work, when: str, action: str, peer: str) -> None:
        """Wait for the work of a gloo group (Groups.host_replicas) whatever the run's backend:
        on the host, under the deadline, as gloo's work is waited."""
        timed_comm.wait(work, self.timeout_s, when, action, peer)

    def replica_peers(self) -> str:
        """The stage's other replicas, for a failed wait's message."""
        g = self.groups
        return timed_comm.ranks_text(g.grid.replica_ranks(g.stage), g.rank)

    def pipeline_peers(self) -> str:
        """The replica's other stages, for a failed wait's message."""
        g = self.groups
        return timed_comm.ranks_text(g.grid.pipeline_ranks(g.replica), g.rank)


    def tied_peer(self) -> str:
        """The other end of the replica's pipeline (tied embeddings across stages)."""
        g = self.groups
        other = g.grid.rank(g.grid.pp - 1 if g.stage == 0 else 0, g.replica)
        return timed_comm.ranks_text([g.rank, other], g.rank)


class GlooComm(Comm):
    wait = Comm.wait_host


class NcclComm(Comm):
    def wait(self, work, when: str, action: str, peer: str) -> None:
        try:
            work.wait()
        except RuntimeError as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CommFailure(f"{when}: {action}: communication with {peer} failed: {text}") from None


def comm_for(groups, device: torch.device, timeout_s: float) -> Comm:
    return (NcclComm if device.type == "cuda" else GlooComm)(groups, timeout_s)
