"""The compute actions: forward (F), recompute (R) and backward (B; split, BI then BW) of one
unit on one micro-batch.

Each unit's forward runs on a detached copy of its input that requires grad, so each unit's
backward is its own action: `B u.m` back-propagates unit u alone and leaves the gradient of its
input for unit u - 1 (or for the send to the previous stage). What a forward saves for its
backward is held in a SavedActivations (counted, offloadable). A split backward's two halves
are runtime/split_backward.py's; what BI leaves for BW is in st.wgrad.
"""

from __future__ import annotations

import torch

from ratrain.models.llama import parameters_read
from ratrain.runtime import split_backward
from ratrain.runtime.saved_activations import SavedActivations
from ratrain.runtime.step_state import StepState
from ratrain.schedule.ir import Action


def _unit_input(ex, st: StepState, u: int, mb: int) -> torch.Tensor:
    if u == 0:
        return st.batches[mb][0].to(ex.stage.device, non_blocking=True)
    # A local producer keeps its output until its own backward; in eval nothing is kept.
    keep = st.training and u - 1 in ex.stage.units
    src = st.act[(u - 1, mb)] if keep else st.act.pop((u - 1, mb))
    return src.detach()


def _apply(ex, st: StepState, u: int, mb: int, x: torch.Tensor) -> torch.Tensor:
    with ex.stage.autocast():
        if u != ex.head:
            return ex.stage.modules[u](x)
        target = st.batches[mb][1].to(ex.stage.device, non_blocking=True)
        loss = ex.stage.modules[u].loss(x, target)
        st.losses.append(loss.detach())
        scale = ex.loss_scale.scale if ex.loss_scale and st.training else 1.0
        return loss * (scale / (st.n_micro * ex.grad_replicas))


def _apply_saving(ex, st: StepState, u: int, mb: int, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Forward with autograd; what it saves is held in st.saved[(u, mb)] and returned."""
    if x.is_floating_point():
        x.requires_grad_()
    params = parameters_read(ex.stage.modules[u])  # not saved as activations: in a view
    saved = st.saved[(u, mb)] = SavedActivations(params, {x.untyped_storage().data_ptr()})
    with saved.hooks():
        y = _apply(ex, st, u, mb, x)
    return y, saved.tensors


def forward(ex, st: StepState, a: Action) -> None:
    x = _unit_input(ex, st, a.unit, a.mb)
    if not st.training or a.unit in st.recompute:
        with torch.no_grad():
            y = _apply(ex, st, a.unit, a.mb, x)
        kept = []
    else:
        y, kept = _apply_saving(ex, st, a.unit, a.mb, x)
    if st.training:
        st.inp[(a.unit, a.mb)] = x
    if st.training or a.unit != ex.head:
        st.act[(a.unit, a.mb)] = y
    st.bind(kept=kept, input=[x], output=[y])


def recompute(ex, st: StepState, a: Action) -> None:
    if a.unit == ex.head:
        st.losses.pop()  # the recomputed forward records the same loss again
    x = st.inp[(a.unit, a.mb)]
    y, saved = _apply_saving(ex, st, a.unit, a.mb, x)
    st.act[(a.unit, a.mb)] = y
    st.bind(saved=saved, input=[x], output=[y])


def backward(ex, st: StepState, a: Action) -> None:
    y = st.act.pop((a.unit, a.mb))
    saved = st.saved.get((a.unit, a.mb))
    if saved is not None:
        saved.let_go_as_read()
    if a.unit == ex.head:
        y.backward()
    else:
        y.backward(st.grad.pop((a.unit, a.mb)))
    state = ex.stage.state[a.unit]
    state.fold_grads(st.fold.get((a.unit, a.mb)))
    x = st.inp.pop((a.unit, a.mb))
    st.saved.pop((a.unit, a.mb), None)
    if a.unit > 0:
        st.grad[(a.unit - 1, a.mb)] = x.grad
    st.bind(input_grad=[x.grad], grad_full=state.full_grad_storage(),
            grad_run=state.run_grad_storage())


def backward_input(ex, st: StepState, a: Action) -> None:
    """The gradient of the unit's input only; BW u.m finishes the unit's weight gradients.
    Unit 0 reads token ids: it has no input gradient, and its BW runs its whole backward from
    the output gradient, which it keeps. A head whose loss makes its logits again for its
    backward (models/head_loss.py) would make them in both halves: its BI runs the whole
    backward and its BW only folds."""
    key = (a.unit, a.mb)
    y = st.act.pop(key)
    grad_y = None if a.unit == ex.head else st.grad.pop(key)
    x = st.inp[key]
    saved = st.saved[key]
    if a.unit == ex.head and ex.stage.modules[a.unit].chunked(st.batches[a.mb][1]):
        # its loss makes the logits again once for both gradients: all of it here
        saved.let_go_as_read()
        y.backward()
        st.grad[(a.unit - 1, a.mb)] = x.grad
        st.wgrad[key] = None
        saved.keep_only_for([])
        st.bind(input=[x], input_grad=[x.grad], wgrad_seeds=[], wgrad_saved=[])
        return
    if not x.requires_grad:
        st.wgrad[key] = (y, grad_y)
        st.bind(input=[x], wgrad_seeds=[y, grad_y], wgrad_saved=saved.tensors)
        return
    dx, st.wgrad[key] = split_backward.backward_input(y, grad_y, x)
    st.grad[(a.unit - 1, a.mb)] = dx
    st.bind(input=[x], input_grad=[dx], wgrad_seeds=st.wgrad[key].seed_tensors(),
            wgrad_saved=saved.keep_only_for(st.wgrad[key].nodes()))


def backward_weight(ex, st: StepState, a: Action) -> None:
    """Accumulate the unit's parameter gradients from what BI kept, as B would; then its
    activations go."""
    key = (a.unit, a.mb)
    kept = st.wgrad.pop(key)
    if isinstance(kept, tuple):  # unit 0: its whole backward
        y, grad_y = kept
        y.backward(grad_y)
    elif kept is not None:  # (the head's BI ran its whole backward)
        split_backward.backward_weight(kept)
    state = ex.stage.state[a.unit]
    state.fold_grads(st.fold.get(key))
    st.inp.pop(key)
    st.saved.pop(key, None)
    st.bind(grad_full=state.full_grad_storage(), grad_run=state.run_grad_storage())
