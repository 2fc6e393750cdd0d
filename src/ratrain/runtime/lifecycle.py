"""The lifecycle actions of a unit's training state and activations: views (P, WP, X),
gradient sync (GS, WGS; one micro-batch's: RS, WRS; a weight tied across stages: TS, WTS), the
global norm (N, WN), the update (U; carried: SU, WU), activation offload (O, L, WL), and the
step's end (E).

Values the step computes on the device (loss sums, the gradient norm, the clip coefficient,
float16's overflow flag) stay device tensors until E, which reads them in one transfer: on
CUDA the host never waits for the GPU before the step's end unless the program says so (a
host-resident update needs its coefficient on the host).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ratrain.runtime.optim import set_lr
from ratrain.runtime.step_state import StepState
from ratrain.schedule.ir import Action
from ratrain.schedule.ops import Op


# -- parameter views ---------------------------------------------------------------------------

def prefetch(ex, st: StepState, a: Action):
    state = ex.stage.state[a.unit]
    work = state.prefetch()  # sharded: the all-gather
    if work is not None:
        st.pending[a] = (work, None)
    st.bind(view=state.view_tensors())
    return work


def wait_prefetch(ex, st: StepState, a: Action) -> None:
    gathered = st.pending.pop(Action(Op.PREFETCH, a.unit), None)
    if gathered is not None:
        ex.comm.wait(gathered[0], st.when, str(a), ex.comm.replica_peers())
    ex.stage.state[a.unit].wait_view()


def release(ex, st: StepState, a: Action) -> None:
    ex.stage.state[a.unit].release_view()


# -- activation offload ------------------------------------------------------------------------

def offload(ex, st: StepState, a: Action) -> None:
    key = (a.unit, a.mb)
    saved = st.saved[key]
    saved.offload(ex.stage.copies)
    st.bind(input=[st.inp[key]], saved_host=saved.tensors)


def reload(ex, st: StepState, a: Action) -> None:
    saved = st.saved[(a.unit, a.mb)]
    saved.reload(ex.stage.copies, ex.stage.device)
    st.bind(saved_reloaded=saved.tensors)


def wait_reload(ex, st: StepState, a: Action) -> None:
    st.saved[(a.unit, a.mb)].wait_reload(ex.stage.copies)


# -- gradient sync, norm, update ---------------------------------------------------------------

def _started(st: StepState, a: Action, work):
    """A unit's sync just started (GS, RS or GX), kept for its wait."""
    st.syncs[a.unit] = work
    return work


def _waited(ex, st: StepState, a: Action):
    """The unit's sync in flight waited for, under the comm's deadline; returns the unit's
    state, which finishes it."""
    work = st.syncs.pop(a.unit, None)
    if work is not None:
        ex.comm.wait(work, st.when, str(a), ex.comm.replica_peers())
    return ex.stage.state[a.unit]


def grad_sync(ex, st: StepState, a: Action):
    return _started(st, a, ex.stage.state[a.unit].start_sync(ex.groups.grads))


def wait_grad_sync(ex, st: StepState, a: Action) -> None:
    _waited(ex, st, a).wait_sync()


def grad_reduce(ex, st: StepState, a: Action):
    """One micro-batch's reduce-scatter (gradient lifetime "micro-batch")."""
    return _started(st, a, ex.stage.state[a.unit].start_reduce())


def wait_grad_reduce(ex, st: StepState, a: Action) -> None:
    _waited(ex, st, a).wait_reduce()


def cross_sync(ex, st: StepState, a: Action):
    """Hybrid sharding: the shard's gradient summed across the shard groups."""
    return _started(st, a, ex.stage.state[a.unit].start_cross_sync())


def wait_cross_sync(ex, st: StepState, a: Action) -> None:
    _waited(ex, st, a).wait_cross_sync()


def tied_sync(ex, st: StepState, a: Action):
    """Tied embeddings across stages: this copy's gradient summed with the other's, in place."""
    work = dist.all_reduce(ex.stage.state[a.unit].tied_grad(), group=ex.groups.tied,
                           async_op=True)
    st.pending[a] = (work, None)
    return work


def wait_tied_sync(ex, st: StepState, a: Action) -> None:
    work, _ = st.pending.pop(Action(Op.TIED_SYNC, a.unit))
    ex.comm.wait(work, st.when, str(a), ex.comm.tied_peer())


def grad_norm(ex, st: StepState, a: Action):
    """Start reducing the stage's squared gradient norm over the pipeline stages (sharded:
    first summed over the replicas the state is sharded over, each of which holds a slice)."""
    parts = [sq for u, s in ex.stage.state.items()
             if (sq := st.unit_norms.pop(u) if u in st.unit_norms else s.sq_norm()) is not None]
    device = ex.stage.device
    sq = (torch.stack([p.to(device) for p in parts]).sum() if parts
          else torch.zeros((), device=device)).reshape(1)
    if ex.stage.sharded:
        ex.comm.wait(dist.all_reduce(sq, group=ex.groups.shard, async_op=True), st.when,
                     str(a), ex.comm.replica_peers())
    work = dist.all_reduce(sq, group=ex.groups.pipeline, async_op=True) if ex.pp > 1 else None
    st.norm = (work, sq)
    return work


def wait_grad_norm(ex, st: StepState, a: Action) -> None:
    """The global norm, the clip coefficient and (float16) the overflow flag, as device values;
    the coefficient is torch.nn.utils.clip_grad_norm_'s, so a single-process run matches."""
    work, sq = st.norm
    if work is not None:
        ex.comm.wait(work, st.when, str(a), ex.comm.pipeline_peers())
    st.norm = None
    scale = ex.loss_scale.scale if ex.loss_scale else 1.0
    total = sq[0].sqrt() / scale
    st.grad_norm = total
    if ex.loss_scale:  # the norm is the same everywhere, so every rank skips the same steps
        st.found_inf = (~torch.isfinite(total)).float()
    if ex.clip > 0:
        factor = (ex.clip / (total + 1e-6)).clamp(max=1.0) / scale
    else:
        factor = torch.full_like(total, 1.0 / scale) if ex.loss_scale else None
    st.grad_factor = factor


def update(ex, st: StepState, a: Action) -> None:
    state = ex.stage.state[a.unit]
    set_lr([state.optimizer], st.lr)
    state.update(st.grad_factor, st.found_inf)


def start_update(ex, st: StepState, a: Action):
    return ex.host_updates.start(a.unit, ex.stage.state[a.unit], st.lr, st.grad_factor,
                                 st.found_inf)


def wait_update(ex, st: StepState, a: Action) -> None:
    ex.host_updates.wait(a.unit)


def start_norm(ex, st: StepState, a: Action):
    return ex.host_updates.start_norm(a.unit, ex.stage.state[a.unit])


def wait_norm(ex, st: StepState, a: Action) -> None:
    st.unit_norms[a.unit] = ex.host_updates.wait_norm(a.unit)


# -- the step's end ----------------------------------------------------------------------------

def step_end(ex, st: StepState, a: Action) -> None:
    """Mean loss over all micro-batches of all replicas, known on every rank, read on the host
    with the step's other device values in one transfer. --sync diloco's inner steps: of this
    replica's (its island's) micro-batches only; the loss does not cross the replicas' link between outer
    syncs, and the loop averages their losses when they next meet (training/step_meetings.py).

    Sums and counts are reduced rather than means, because evaluation may give replicas
    different numbers of micro-batches."""
    device = ex.stage.device
    local = (torch.stack(st.losses).sum().float() if st.losses
             else torch.zeros((), device=device))
    total = torch.stack([local.to(device), torch.full((), float(len(st.losses)), device=device)])
    g = ex.groups
    if ex.pp > 1:
        ex.comm.wait(dist.all_reduce(total, group=g.pipeline, async_op=True), st.when, str(a),
                     ex.comm.pipeline_peers())
    if ex.dp > 1 and (ex.grad_replicas > 1 or not st.training):
        group = g.grads if st.training else g.replicas
        ex.comm.wait(dist.all_reduce(total, group=group, async_op=True), st.when, str(a),
                     ex.comm.replica_peers())
    extras = [v.reshape(1).float() for v in (st.grad_norm, st.found_inf) if v is not None]
    values = torch.cat([total] + [e.to(device) for e in extras]).tolist()  # the step's one read
    st.loss = values[0] / values[1]
    names = [n for n, v in (("grad_norm", st.grad_norm), ("found_inf", st.found_inf)) if v is not None]
    st.read = dict(zip(names, values[2:]))
    syncing = [u for u, state in ex.stage.state.items() if state.syncing]
    left = st.unfinished(syncing)
    if left:
        raise RuntimeError(f"step ended with unfinished work: {', '.join(left[:8])}")
