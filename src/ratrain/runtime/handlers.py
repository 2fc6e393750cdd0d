"""The executor's handler of every op of the registry (schedule/ops.py), checked complete at
import. A handler runs one action on the step's state and returns the work handle of what it
started, if anything."""

from __future__ import annotations

from ratrain.runtime import compute, lifecycle, outer_sync, transfer
from ratrain.schedule.ops import Op

HANDLERS = {
    Op.FORWARD: compute.forward,
    Op.BACKWARD: compute.backward,
    Op.BACKWARD_INPUT: compute.backward_input,
    Op.BACKWARD_WEIGHT: compute.backward_weight,
    Op.RECOMPUTE: compute.recompute,
    Op.SEND_ACT: transfer.start,
    Op.WAIT_SEND_ACT: transfer.wait,
    Op.RECV_ACT: transfer.start,
    Op.WAIT_RECV_ACT: transfer.wait,
    Op.SEND_GRAD: transfer.start,
    Op.WAIT_SEND_GRAD: transfer.wait,
    Op.RECV_GRAD: transfer.start,
    Op.WAIT_RECV_GRAD: transfer.wait,
    Op.GRAD_SYNC: lifecycle.grad_sync,
    Op.WAIT_GRAD_SYNC: lifecycle.wait_grad_sync,
    Op.GRAD_REDUCE: lifecycle.grad_reduce,
    Op.WAIT_GRAD_REDUCE: lifecycle.wait_grad_reduce,
    Op.CROSS_SYNC: lifecycle.cross_sync,
    Op.WAIT_CROSS_SYNC: lifecycle.wait_cross_sync,
    Op.GRAD_NORM: lifecycle.grad_norm,
    Op.WAIT_GRAD_NORM: lifecycle.wait_grad_norm,
    Op.UPDATE: lifecycle.update,
    Op.START_UPDATE: lifecycle.start_update,
    Op.WAIT_UPDATE: lifecycle.wait_update,
    Op.START_NORM: lifecycle.start_norm,
    Op.WAIT_NORM: lifecycle.wait_norm,
    Op.OFFLOAD: lifecycle.offload,
    Op.RELOAD: lifecycle.reload,
    Op.WAIT_RELOAD: lifecycle.wait_reload,
    Op.PREFETCH: lifecycle.prefetch,
    Op.WAIT_PREFETCH: lifecycle.wait_prefetch,
    Op.RELEASE: lifecycle.release,
    Op.STEP_END: lifecycle.step_end,
    Op.TIED_SYNC: lifecycle.tied_sync,
    Op.WAIT_TIED_SYNC: lifecycle.wait_tied_sync,
    Op.OUTER_SYNC: outer_sync.start,
    Op.WAIT_OUTER_SYNC: outer_sync.wait,
}

if set(HANDLERS) != set(Op):
    raise ImportError(f"runtime/handlers.py: no handler for {sorted(o.name for o in set(Op) - set(HANDLERS))}")
