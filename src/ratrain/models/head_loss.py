"""The output head's loss without the logits in memory: the cross-entropy of x W^T against the
targets, a chunk of tokens at a time, the chunk's logits made again in the backward.

A head that returns its logits and a cross-entropy over them keeps, from the forward to the
backward, the fp32 log-softmax of every token: 4 V bytes a token, 2.1 GB for one sequence of
4096 tokens at Llama 3's 128,256-word vocabulary, more than a whole decoder block's activations
(and makes as much again, and the logits, while it runs). Here the forward keeps its input (the
head's normed hidden states, which the norm keeps anyway) and each token's log-sum-exp, and the
backward makes the logits again a chunk of the vocabulary at a time: one more product of the
head's size (2 V d flops a token: 0.7% of LLaMA-2-7B's training flops, 2.3% of
Llama-3.1-8B's, 7% of Llama-3.2-1B's) for the memory of one chunk's logits at a time (and, per
chunk, a pass over the input's fp32 gradient to add the chunk's part). The chunk's arithmetic
is cross_entropy's (logits in the compute dtype, the softmax in fp32); the loss and the input's
gradient sum over chunks in fp32.

Where a micro-batch's logits fit in one chunk (`chunks` False: the CPU-sized presets) the head
keeps the plain logits-then-cross-entropy, which recomputes nothing; the simulator prices the
head by the same rule (sim/unit_costs.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ratrain.models.params import chunk_tokens, vocab_columns


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of x [N, d] @ w [V, d]^T against targets [N]; x and w in one dtype.

    The forward runs a chunk of tokens at a time and keeps each token's log-sum-exp (4 bytes a
    token). The backward runs a chunk of the vocabulary at a time: all tokens against `cols`
    rows of w, so each chunk's rows of the weight's gradient come whole from one product, in
    w's dtype, and what sums over chunks in fp32 is the input's gradient (4 N d bytes: 67 MB at
    4096 tokens of llama2-7b) rather than the weight's (4 V d: 0.5 GB, 2.6 GB at
    baichuan2-13b's vocabulary)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:
        n = x.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=x.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for i in range(0, n, chunk):
            logits = F.linear(x[i:i + chunk], w).float()
            picked = logits.gather(1, targets[i:i + chunk, None]).squeeze(1)
            # logsumexp's arithmetic in place: no second chunk of fp32 logits
            top = logits.amax(dim=-1, keepdim=True)
            part = lse[i:i + chunk]
            torch.sum(logits.sub_(top).exp_(), dim=-1, out=part)
            part.log_().add_(top.squeeze(1))
            total += (part - picked).sum()
            del logits  # before the next chunk's are made
        ctx.save_for_backward(x, w, targets, lse)
        ctx.cols = vocab_columns(n, w.shape[0], chunk)
        return total / n

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w, targets, lse = ctx.saved_tensors
        n, v, cols = x.shape[0], w.shape[0], ctx.cols
        scale = grad.float() / n
        dx = torch.zeros(x.shape, dtype=torch.float32, device=x.device) \
            if ctx.needs_input_grad[0] else None
        dw = torch.empty_like(w) if ctx.needs_input_grad[1] else None
        for j in range(0, v, cols):
            wc = w[j:j + cols]
            probs = F.linear(x, wc).float().sub_(lse[:, None]).exp_()
            # the target's -1 where it lies in this chunk, by a scatter (a mask's indices
            # would wait for the device)
            hit = (targets >= j) & (targets < j + wc.shape[0])
            at = (targets - j).clamp_(0, wc.shape[0] - 1)
            probs.scatter_add_(1, at[:, None], hit.to(probs.dtype).neg_()[:, None])
            dlogits = probs.mul_(scale).to(x.dtype)
            if dx is not None:
                dx.add_(dlogits @ wc)
            if dw is not None:
                torch.mm(dlogits.t(), x, out=dw[j:j + cols])
            del probs, dlogits  # before the next chunk's are made
        return (None if dx is None else dx.to(x.dtype)), dw, None, None


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
