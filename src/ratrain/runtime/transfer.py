"""The pipeline's point-to-point actions (SA, RA, SG, RG and their waits), one pair of handlers
for all four: activations flow to the next stage, gradients to the previous one, and what a
transfer's op sends or receives follows from its spec (schedule/ops.py)."""

from __future__ import annotations

import torch

from ratrain.runtime import p2p
from ratrain.runtime.step_state import StepState
from ratrain.schedule.ir import Action
from ratrain.schedule.ops import SPECS, peer_offset


def _carries_activation(op) -> bool:
    """Activations go forward: sent to the next stage, received from the previous one."""
    return (peer_offset(op) > 0) == SPECS[op].sends


def _route(ex, op) -> tuple[int, object, int]:
    """(peer's global rank, the two-rank group of this link and direction, tag kind)."""
    g = ex.groups
    act = _carries_activation(op)
    if peer_offset(op) > 0:
        return g.next_rank, (g.act_to_next if act else g.grad_from_next), (p2p.ACT if act else p2p.GRAD)
    return g.prev_rank, (g.act_from_prev if act else g.grad_to_prev), (p2p.ACT if act else p2p.GRAD)


def start(ex, st: StepState, a: Action):
    """Post a send or a receive; the tensor is kept with the work until the wait."""
    peer, group, kind = _route(ex, a.op)
    key = (a.unit, a.mb)
    if SPECS[a.op].sends:
        if _carries_activation(a.op):
            t = st.act[key].detach() if st.training else st.act.pop(key).detach()
        else:
            t = st.grad.pop(key)
        work = p2p.isend(t, peer, group, kind, a.unit, a.mb, st.n_micro)
    else:
        t = torch.empty(ex.act_shape, dtype=ex.act_dtype, device=ex.stage.device)
        work = p2p.irecv(t, peer, group, kind, a.unit, a.mb, st.n_micro)
        st.bind(received=[t], output_grad=[t])
    st.pending[a] = (work, t)
    return work


def wait(ex, st: StepState, a: Action) -> None:
    """Wait for the transfer; a received tensor becomes the stage's input or output gradient."""
    started = SPECS[a.op].waits
    work, t = st.pending.pop(Action(started, a.unit, a.mb))
    peer, _, _ = _route(ex, started)
    ex.comm.wait(work, st.when, str(a), f"rank {peer}")
    if not SPECS[started].sends:
        (st.act if _carries_activation(started) else st.grad)[(a.unit, a.mb)] = t
