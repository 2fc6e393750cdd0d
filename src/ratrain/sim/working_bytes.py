"""What a unit's compute allocates while it runs beyond what the memory ledger holds: the peak of
one forward or backward over the bytes held just before it, in closed form.

The ledger counts what outlives an action (saved activations, outputs, gradients between
units), so its peak misses the tensors an action makes and frees before it returns: the MLP's
three ffn-wide tensors of a forward without autograd, the gradients of the MLP's backward, the
fp32 temporaries of an RMSNorm's backward, the loss's logits. They grow with the micro-batch's
tokens, so the process overhead a profile measures at one shape cannot stand for them at
another: llama2-7b's plan at 8 sequences of 4096 a micro-batch, priced at 16.5 GB, ran out
of a 20 GB cap on an H200 (2026-11-28) in a block's backward.

Phases: "forward", without autograd (a recomputed unit's F); "saving", with autograd (F that
keeps or offloads, and R): what it saves and its output are part of its peak, as they are of
the ledger after it; "backward" (B: autograd frees each saved tensor once read,
runtime/saved_activations.let_go_as_read); "backward_input" (a split backward's BI, which keeps
the graph, so all it saved, and leaves the seeds and the input's gradient, part of its peak
as of the ledger after it); "weight" (BW: the weights' gradients). Each formula is
the largest of the unit's phases, op by op as models/llama.py and models/head_loss.py run
them, with its parameters' gradients in the compute dtype (the fold takes them after the
backward returns). tests/unit/test_working_bytes.py checks them against the bytes of the
storages torch allocates under a dispatch mode, for several presets, shapes and both dtypes:
exact for the blocks and the embedding, an upper bound for the head where its phases overlap
(fp32 most). Not counted: kernels' own workspaces (cuBLAS's, flash attention's fp32
accumulator in its backward), which the profile's process overhead holds.
"""

from __future__ import annotations

from ratrain.models.params import chunk_tokens, vocab_columns
from ratrain.sim import unit_costs as uc

def working_bytes(shape: uc.UnitShape, kind: str, phase: str) -> int:
    """The peak of unit `kind`'s `phase` on one micro-batch of `shape` over the bytes held
    before it."""
    m, t, e = shape.model, shape.tokens, shape.elt
    d, f, v = m.dim, m.ffn_dim, m.vocab_size
    low = e < 4  # RMSNorm runs in fp32: below it, its input is copied to fp32 first
    if kind == "embedding":
        # its output; its backward is the table's dense gradient (no input gradient)
        return {"forward": t * d * e, "saving": t * d * e, "backward": v * d * e,
                "backward_input": 0, "weight": v * d * e}[phase]
    saved = uc.saved_bytes(shape, kind) + uc.output_bytes(shape, kind)
    # BI, the graph kept: the norms' backward in fp32 beside everything saved
    kept_graph = (sum(uc.wgrad_seed_bytes(shape, kind)) + t * d * e
                  + (18 if low else 16) * t * d)
    if kind == "block":
        if phase == "forward":  # the MLP: silu(gate), up, their product; h and the norm's output
            out = 3 * t * f * e + 2 * t * d * e
        elif phase == "saving":  # the RMSNorm's scaled fp32 product before its cast
            out = saved + 4 * t * d
        elif phase == "backward":  # the product's and up's gradients, and down_proj's weight's
            out = 2 * t * f * e + d * f * e
        elif phase == "backward_input":
            out = kept_graph
        else:  # at most every weight's gradient
            out = sum(uc.param_sizes(m, "block")) * e
        if m.position != "rope":  # ALiBi: attention through the masked path's s x s scores
            scores = 4 * shape.micro_batch_size * m.n_heads * shape.seq_len ** 2
            if phase == "saving":
                out += scores if low else 0
            elif phase == "backward_input":  # the scores' gradients beside the kept graph
                out += 2 * scores
            else:
                out = max(out, (3 if phase == "forward" else 2) * scores)
        return out
    norm = 8 * t * d + 4 * t  # fp32: the input's copy (or its square) and the scaled product
    scalars = 8  # the loss's sum and mean, in fp32
    weight = v * d * e * (2 if m.norm_head else 1)  # a NormHead's normalized copy too
    if uc.head_chunks(shape):
        # one chunk's logits: in the compute dtype and their fp32 copy (their softmax made in
        # place); the max and picked logit of each of its tokens
        c = chunk_tokens(v) * v
        loss = c * ((e + 4) if low else 4) + 16 * chunk_tokens(v)
        if phase == "forward":
            return max(norm, t * d * e + loss) + scalars
        if phase == "saving":
            return saved + max(4 * t * d if low else 0, loss) + scalars
        if phase == "weight":  # its BI ran its whole backward
            return 0
        # (B, and BI, which runs its whole backward) a vocabulary chunk at a time beside the
        # weight's gradient and the input's in fp32: the chunk's logits (and their fp32 copy
        # and its cast back, below fp32), the targets' indices, the chunk's input gradient;
        # then the norm's backward
        logits = t * vocab_columns(t, v)  # one vocabulary chunk's, for every token
        chunk = logits * ((2 * e + 4) if low else 4) + t * d * e + 17 * t
        return max(weight + 4 * t * d + chunk,
                   2 * t * d * e + weight + (12 if low else 8) * t * d)
    logits = t * v * e + 4 * t * v + (4 * t * v if low else 0)
    if phase == "forward":
        return max(norm, logits) + scalars
    if phase == "saving":
        return saved + logits - 4 * t * v + scalars  # the log-softmax is among what it saves
    if phase == "backward_input":
        return kept_graph + scalars
    if phase == "weight":  # the weight's gradient, and the norm's
        return weight + 4 * d
    # the loss's gradient in fp32 and the softmax; then the norm's backward, the log-softmax
    # it saved freed
    return max(8 * t * v, 2 * t * d * e + weight + (12 if low else 8) * t * d - 4 * t * v)
