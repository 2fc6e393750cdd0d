"""The output head's loss without the logits in memory: the cross-entropy of x W^T against the
targets, a chunk of tokens at a time, the chunk's logits made again in the backward.

A head that returns its logits and a cross-entropy over them keeps, from the forward to the
backward, the fp32 log-softmax of every token: 4 V bytes a token, 2.1 GB for one sequence of
4096 tokens at Llama 3's 128,256-word vocabulary, more than a whole decoder block's activations
(and makes as much again, and the logits, while it runs). Here the forward keeps only its input
(the head's normed hidden states, which the norm keeps anyway) and the backward makes each
chunk's logits again: one more product of the head's size (2 V d flops a token: 0.7% of
LLaMA-2-7B's training flops, 2.3% of Llama-3.1-8B's, 7% of Llama-3.2-1B's) for the memory of one
chunk's logits at a time (and, per chunk, a pass over the weight's fp32 gradient to add the
chunk's part). The chunk's arithmetic is cross_entropy's (logits in the compute dtype, the
softmax in fp32); the loss and the weight's gradient sum over chunks in fp32.

Where a micro-batch's logits fit in one chunk (`chunks` False: the CPU-sized presets) the head
keeps the plain logits-then-cross-entropy, which recomputes nothing; the simulator prices the
head by the same rule (sim/unit_costs.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ratrain.models.params import chunk_tokens


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of x [N, d] @ w [V, d]^T against targets [N]; x and w in one dtype."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for i in range(0, x.shape[0], chunk):
            logits = F.linear(x[i:i + chunk], w).float()
            total += F.cross_entropy(logits, targets[i:i + chunk], reduction="sum")
        ctx.save_for_backward(x, w, targets)
        ctx.chunk = chunk
        return total / x.shape[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w, targets = ctx.saved_tensors
        n, chunk = x.shape[0], ctx.chunk
        scale = grad.float() / n
        dx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) \
            if ctx.needs_input_grad[1] else None
        for i in range(0, n, chunk):
            xc, tc = x[i:i + chunk], targets[i:i + chunk]
            probs = torch.softmax(F.linear(xc, w).float(), dim=-1)
            probs[torch.arange(tc.shape[0], device=tc.device), tc] -= 1.0
            dlogits = (probs * scale).to(x.dtype)
            if dx is not None:
                dx[i:i + chunk] = dlogits @ w
            if dw is not None:
                dw.add_(dlogits.t() @ xc)  # into fp32, without an fp32 copy of the product
        return dx, (None if dw is None else dw.to(w.dtype)), None, None


def chunked_cross_entropy(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                          chunk: int | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of the logits x @ w^T ([..., d] and [V, d]) against
    `targets` ([...]), in fp32, never holding more than `chunk` tokens' logits (default:
    chunk_tokens). Under autocast both run in its dtype, as F.linear would."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        x, w = x.to(dtype), w.to(dtype)
    chunk = chunk or chunk_tokens(w.shape[0])
    with torch.autocast(device, enabled=False):
        return _ChunkedCrossEntropy.apply(x.reshape(-1, x.shape[-1]), w, targets.reshape(-1),
                                          chunk)
