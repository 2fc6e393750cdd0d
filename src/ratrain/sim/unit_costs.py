"""What one unit of a LLaMA-family model costs on one micro-batch, in closed form: FLOPs of its
forward and backward (attention included), the bytes of its parameters, of the activation it
passes on, and of what autograd saves for its backward, exactly as ratrain's units save it.

The parameters come as the unit's tensors in module order (`param_sizes`), which is how sharded
state slices them: `shard` gives a replica's slice of a unit's flattened parameters.

The saved-bytes formulas follow models/llama.py op by op (a test checks them against torch's
saved-tensor hooks for several presets and shapes, in fp32 and in bf16 and fp16, where the
tensors are at the compute dtype's size, RMSNorm's fp32 copy of its input and the fp32
statistics, rstd, attention's log-sum-exp and the loss's log-softmax, at 4 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.config import ModelConfig
from ratrain.models.params import DTYPE_BYTES, chunks, unit_param_counts, vocab_columns


@dataclass(frozen=True)
class UnitShape:
    model: ModelConfig
    micro_batch_size: int
    seq_len: int
    dtype: str = "float32"

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]


def unit_kind(model: ModelConfig, unit: int) -> str:
    if unit == 0:
        return "embedding"
    return "head" if unit == model.n_layers + 1 else "block"


def forward_flops(shape: UnitShape, kind: str) -> float:
    """Multiply-adds x 2 of the forward; causal attention counts the half it computes."""
    m, t = shape.model, shape.tokens
    if kind == "embedding":
        return 0.0  # a gather: memory-bound, see moved_bytes
    if kind == "head":
        return 2.0 * t * m.dim * m.vocab_size
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    linear = 2.0 * t * (m.dim * (q + 2 * kv) + q * m.dim + 3 * m.dim * m.ffn_dim)
    return linear + attention_flops(shape, kind)


def head_chunks(shape: UnitShape) -> bool:
    """Whether the head's loss runs in chunks, its logits made again in its backward
    (models/head_loss.py: where a micro-batch's logits exceed one chunk)."""
    return chunks(shape.tokens, shape.model.vocab_size)


def backward_flops(shape: UnitShape, kind: str) -> float:
    """Gradients of inputs and of weights: twice the forward's matrix products; a chunked
    head's loss makes its logits again first: three times."""
    again = kind == "head" and head_chunks(shape)
    return (3.0 if again else 2.0) * forward_flops(shape, kind)


def moved_bytes(shape: UnitShape, kind: str) -> float:
    """Memory traffic of a unit whose cost is not its FLOPs (the embedding's gather/scatter)."""
    return 2.0 * shape.tokens * shape.model.dim * shape.elt if kind == "embedding" else 0.0


def backward_moved_bytes(shape: UnitShape, kind: str) -> float:
    """The backward's traffic beyond moved_bytes: each vocabulary chunk of a chunked head adds
    its input gradient (compute dtype, written and read) into the fp32 one (read and
    written)."""
    if kind != "head" or not head_chunks(shape):
        return 0.0
    m = shape.model
    n_chunks = -(-m.vocab_size // vocab_columns(shape.tokens, m.vocab_size))
    return n_chunks * (2 * shape.elt + 8) * shape.tokens * m.dim


def param_count(model: ModelConfig, unit: int) -> int:
    return unit_param_counts(model)[unit]


def param_sizes(model: ModelConfig, kind: str) -> list[int]:
    """Elements of each of a unit's parameter tensors, in the order the unit's module lists
    them (`parameters()`, which is the order its state flattens them in): a block's input norm,
    q, k, v (each weight, then its bias where there is one), o, the second norm, gate, up,
    down; the head's norm, then its output projection unless tied to the embedding."""
    d = model.dim
    if kind == "embedding":
        return [model.vocab_size * d]
    if kind == "head":
        return [d] + ([] if model.tie_embeddings else [model.vocab_size * d])
    q, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    bias = model.qkv_bias
    attention = [d * q, *([q] if bias else []), d * kv, *([kv] if bias else []),
                 d * kv, *([kv] if bias else []), q * d]
    return [d, *attention, d, d * model.ffn_dim, d * model.ffn_dim, model.ffn_dim * d]


def param_tensors(model: ModelConfig, kind: str) -> int:
    """Tensors a unit's parameters come in (AdamW keeps a 4-byte step counter for each)."""
    return len(param_sizes(model, kind))


@dataclass(frozen=True)
class Shard:
    """One replica's part of a unit's state sharded over `dp` replicas (ZeRO-style): the unit's
    parameters flattened and concatenated in order, padded with zeros to `padded` = dp x `size`
    elements, of which replica r owns [r x size, (r + 1) x size). `real` of them are
    parameters (the rest padding), in `pieces` of the original tensors (AdamW keeps one 1-D
    parameter, with its 4-byte step, for each)."""

    size: int  # S = ceil(N / dp)
    padded: int  # N_pad = S x dp
    real: int  # parameters in the slice: min(S, N - r S), at least 0
    pieces: int  # parameter tensors that intersect the slice


def shard(model: ModelConfig, unit: int, dp: int, rank: int = 0) -> Shard:
    """Replica `rank`'s shard of unit `unit`'s state over `dp` replicas."""
    sizes = param_sizes(model, unit_kind(model, unit))
    n = sum(sizes)
    size = -(-n // dp)
    lo, hi = rank * size, min((rank + 1) * size, n)
    pieces, offset = 0, 0
    for numel in sizes:
        if numel and offset < hi and offset + numel > lo:
            pieces += 1
        offset += numel
    return Shard(size, size * dp, max(0, hi - lo), pieces)


def output_bytes(shape: UnitShape, kind: str) -> int:
    """The tensor a unit passes on: hidden states, or the head's scaled loss (a 4-byte scalar)."""
    return 4 if kind == "head" else shape.tokens * shape.model.dim * shape.elt


def saved_bytes(shape: UnitShape, kind: str) -> int:
    """What autograd saves in the unit's forward for this micro-batch alone: without its input
    and parameters (which the executor holds anyway), the cached rotary tables (table_bytes:
    one storage for every block and micro-batch) and the targets (views of the step's one
    int64 tensor, as the loader gives them)."""
    m, b, s, e = shape.model, shape.micro_batch_size, shape.seq_len, shape.elt
    t, d = shape.tokens, shape.model.dim
    # RMSNorm computes in fp32: below it, its input's fp32 copy is what pow and the scaling
    # save (in fp32 they save the input itself)
    fp32_copy = 4 * t * d if e < 4 else 0
    if kind == "embedding":
        return 0  # the token ids, which are the input
    if kind == "head":
        # RMSNorm: rstd, normed, weighted (the matmul's input); the plain loss: the
        # log-softmax output (fp32) and its 4-byte normalizer; a chunked one keeps no logits,
        # each token's log-sum-exp (fp32)
        out = (4 * t + 2 * t * d * e + fp32_copy
               + (4 * t if head_chunks(shape) else 4 * t * m.vocab_size + 4))
        if m.norm_head:  # F.normalize of the weight: the normalized copy and two row norms
            out += m.vocab_size * d * e + 2 * 4 * m.vocab_size
        return out
    # Two RMSNorms (rstd, normed, weighted each; the second also its input h, or below fp32
    # both inputs' fp32 copies), q, k, v as attention reads them (k, v after
    # repeat_interleave: full width), attention's output, the MLP's gate, silu(gate), up and
    # their product.
    norm_inputs = 2 * fp32_copy if fp32_copy else t * d * e
    out = 8 * t * d * e + norm_inputs + 2 * 4 * t + 4 * t * m.ffn_dim * e
    if m.position == "rope":
        out += 4 * b * m.n_heads * s  # attention's log-sum-exp
    else:
        out += 4 * b * m.n_heads * s * s  # ALiBi: attention through the masked path
    return out


def wgrad_saved_bytes(shape: UnitShape, kind: str) -> int:
    """What a split backward's BI keeps of saved_bytes for BW: what the graph nodes BW runs
    saved (runtime/split_backward.py), the input of every op that reads a weight. A block: both
    RMSNorms' normed (their weight's product reads it) and weighted outputs (q, k, v and gate,
    up read them), attention's output (o_proj's input) and the MLP's product (down_proj's). The
    head: its norm's normed and weighted outputs, and a NormHead's normalized weight and row
    norms; a chunked head nothing (its BI runs its whole backward). The embedding: all (its BW
    is its whole backward)."""
    m, t, e, d = shape.model, shape.tokens, shape.elt, shape.model.dim
    if kind == "embedding":
        return saved_bytes(shape, kind)
    if kind == "head":
        if head_chunks(shape):
            return 0
        out = 2 * t * d * e
        if m.norm_head:
            out += m.vocab_size * d * e + 2 * 4 * m.vocab_size
        return out
    return 5 * t * d * e + t * m.ffn_dim * e


def table_bytes(shape: UnitShape, kind: str) -> int:
    """The rotary cos and sin tables a block's forward saves: cached per shape (models/llama.py),
    so one storage serves every block and micro-batch."""
    m = shape.model
    return 2 * shape.seq_len * m.head_dim * shape.elt if kind == "block" and m.position == "rope" else 0


def split_backward_s(kind: str, matmul_s: float, attention_s: float,
                     whole: bool = False) -> tuple[float, float]:
    """(BI, BW) seconds of a unit's backward whose matrix products (and what goes with them)
    take `matmul_s` and attention's core `attention_s`: each product's backward is one product
    for its input's gradient and one, as large, for its weight's; attention has no weights, so
    its backward is all BI; the embedding's is all weight (a scatter-add; its input is token
    ids); a chunked head's is all BI (`whole`: its loss makes the logits again once for both
    gradients, runtime/compute.backward_input). The one place that prices the halves where a
    profile did not measure them."""
    if kind == "embedding":
        return 0.0, matmul_s + attention_s
    if whole:
        return matmul_s + attention_s, 0.0
    return matmul_s / 2 + attention_s, matmul_s / 2


def attention_flops(shape: UnitShape, kind: str) -> float:
    """The part of forward_flops in attention's core, softmax(q k^T) v: none outside a block."""
    if kind != "block":
        return 0.0
    m = shape.model
    attention = 4.0 * shape.micro_batch_size * m.n_heads * shape.seq_len ** 2 * m.head_dim
    return attention / 2 if m.position == "rope" else attention


def wgrad_seed_bytes(shape: UnitShape, kind: str) -> list[int]:
    """What BI keeps for BW besides the activations (runtime/split_backward.py), as the sizes
    of the storages autograd makes for them: the gradient of the output of each op that reads
    a weight. A block: the gradients of q, k, v, of the attention's residual sum (o_proj's
    output), of both RMSNorms' products and of gate and up, each its own storage, and of
    down_proj's output, which is the block's output gradient (not counted here: that storage
    is the one received or made by the next unit's BI). The head: its norm's product and the
    logits; a chunked head none (its BI runs its whole backward). The embedding: only its
    output gradient (its BW is its whole backward)."""
    m, t, e = shape.model, shape.tokens, shape.elt
    if kind == "embedding" or (kind == "head" and head_chunks(shape)):
        return []
    if kind == "head":
        return [t * m.dim * e, t * m.vocab_size * e]
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    return [t * n * e for n in (q, kv, kv, m.dim, m.dim, m.dim, m.ffn_dim, m.ffn_dim)]
