"""What a forward saves of a parameter is a reference into the parameter's storage, not the
storage itself: a compute view released between a forward and its backward (X, then P again)
is really freed, and the backward reads the view made again."""

import pytest
import torch
from torch import nn

from ratrain.runtime.saved_activations import SavedActivations


def _forward(weight: nn.Parameter, x: torch.Tensor) -> tuple[torch.Tensor, SavedActivations]:
    saved = SavedActivations([weight], {x.untyped_storage().data_ptr()})
    with saved.hooks():
        y = (x @ weight.t()) * weight.sum()  # saves weight.t() (a view) and weight's sum's input
    return y, saved


def test_a_released_view_is_not_held_and_the_backward_reads_the_view_made_again():
    torch.manual_seed(0)
    w = torch.randn(3, 4)
    weight = nn.Parameter(w.clone())
    x = torch.randn(2, 4, requires_grad=True)
    y, saved = _forward(weight, x)
    old = weight.untyped_storage().data_ptr()
    assert not any(t.untyped_storage().data_ptr() == old for t in saved.tensors)

    weight.data = torch.empty(0)  # X: the view released
    weight.data = 2 * w  # P: made again, here with other values to see which one is read
    g = torch.randn_like(y)
    y.backward(g)

    expected_x = torch.randn(2, 4).requires_grad_()
    with torch.no_grad():
        expected_x.copy_(x)
    # the sum is an activation, computed in the forward from the old values; the matmul's
    # saved weight is read from the view made again
    ((expected_x @ (2 * w).t()) * w.sum()).backward(g)
    assert torch.allclose(x.grad, expected_x.grad)


def test_a_backward_without_the_view_says_so():
    weight = nn.Parameter(torch.randn(3, 4))
    x = torch.randn(2, 4, requires_grad=True)
    y, _ = _forward(weight, x)
    weight.data = torch.empty(0)
    with pytest.raises(RuntimeError, match="without its compute view"):
        y.sum().backward()


def test_the_units_input_and_other_tensors_are_kept_as_before():
    weight = nn.Parameter(torch.randn(3, 4))
    x = torch.randn(2, 4, requires_grad=True)
    saved = SavedActivations([weight], {x.untyped_storage().data_ptr()})
    with saved.hooks():
        h = torch.tanh(x @ weight.t())  # tanh saves its output: an activation
    assert len(saved.tensors) == 1 and saved.tensors[0].shape == h.shape
    h.sum().backward()
    assert x.grad is not None and weight.grad is not None
