"""One LLaMA-family decoder, split into schedulable units.

Unit 0 is the token embedding, units 1..n_layers are decoder blocks, unit n_layers + 1 is the
final norm and output head. A pipeline stage builds and runs only its own units, and every unit
is initialized from its own generator seeded by (seed, index), so a stage that builds units 3..5
alone holds exactly the weights a full model would.

Parameter names inside a unit are those Hugging Face LLaMA uses, so checkpoints map one to one
(see `hf_param_name`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from ratrain.config import ModelConfig
from ratrain.models.head_loss import chunked_cross_entropy
from ratrain.models.params import chunks
from ratrain.models.rope import apply_rotary, rotary_table, scaling_of

INIT_STD = 0.02


class RMSNorm(nn.Module):
    """RMS normalization computed in float32, as Hugging Face LLaMA does, then cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


# --- position encodings -------------------------------------------------------------------------
# RoPE: models/rope.py. ALiBi's bias, like RoPE's table, is a cached function of its shape.


def alibi_slopes(n_heads: int) -> list[float]:
    """Per-head ALiBi slopes; for a non-power-of-2 count, BLOOM/Baichuan2's interleaving."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


@lru_cache(maxsize=8)
def alibi_bias(
    n_heads: int, seq_len: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Additive attention bias [n_heads, T, T]: slope_h * (j - i) for j <= i, -inf above."""
    with torch.inference_mode(False), torch.no_grad():
        pos = torch.arange(seq_len, dtype=torch.float)
        dist = pos[None, :] - pos[:, None]
        slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float)
        bias = slopes[:, None, None] * dist
        bias = bias.masked_fill(dist > 0, float("-inf"))
        return bias.to(device=device, dtype=dtype)


# --- units --------------------------------------------------------------------------------------
# Their linears and embedding skip PyTorch's default init: every unit draws its weights in
# init_weights from its own generator, and building must not touch the global RNG.


class _Linear(nn.Linear):
    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = _Linear(cfg.dim, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = _Linear(cfg.dim, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = _Linear(cfg.dim, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = _Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.n_kv_heads != cfg.n_heads:
            # Query head h reads kv head h // n_rep, as in Hugging Face's repeat_kv.
            n_rep = cfg.n_heads // cfg.n_kv_heads
            k = k.repeat_interleave(n_rep, dim=1)
            v = v.repeat_interleave(n_rep, dim=1)
        if cfg.position == "rope":
            cos, sin = rotary_table(T, cfg.head_dim, cfg.rope_theta, x.device, q.dtype,
                                    scaling_of(cfg))
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = alibi_bias(cfg.n_heads, T, x.device, q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, cfg.n_heads * cfg.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = _Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = _Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = _Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Embedding(nn.Module):
    """Unit 0: token ids [B, T] -> hidden states [B, T, dim]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = _Embedding(cfg.vocab_size, cfg.dim)

    def init_weights(self, gen: torch.Generator) -> None:
        self.embed_tokens.weight.normal_(0.0, INIT_STD, generator=gen)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)


class DecoderBlock(nn.Module):
    """Units 1..n_layers: pre-norm attention and SwiGLU MLP, each with a residual."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def init_weights(self, gen: torch.Generator) -> None:
        # Projections that write into the residual stream are scaled down so its variance does
        # not grow with depth (GPT-2's 1/sqrt(2 * n_layers)).
        out_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        a, m = self.self_attn, self.mlp
        for lin, std in (
            (a.q_proj, INIT_STD), (a.k_proj, INIT_STD), (a.v_proj, INIT_STD), (a.o_proj, out_std),
            (m.gate_proj, INIT_STD), (m.up_proj, INIT_STD), (m.down_proj, out_std),
        ):
            lin.weight.normal_(0.0, std, generator=gen)
            if lin.bias is not None:
                lin.bias.zero_()
        self.input_layernorm.weight.fill_(1.0)
        self.post_attention_layernorm.weight.fill_(1.0)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))


class Head(nn.Module):
    """Unit n_layers + 1: final norm and output projection -> logits [B, T, vocab].

    With tied embeddings and the embedding unit at hand, the head reads the embedding's weight and
    owns no lm_head of its own. The reference is kept in a tuple so it is not registered as a
    submodule: the weight then appears once, under the embedding, in parameters and state dicts.
    """

    def __init__(self, cfg: ModelConfig, tied: Embedding | None = None):
        super().__init__()
        self.norm_head = cfg.norm_head
        self._vocab = cfg.vocab_size
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self._tied = (tied,) if tied is not None else None
        if tied is None:
            self.lm_head = _Linear(cfg.dim, cfg.vocab_size, bias=False)

    def output_weight(self) -> torch.Tensor:
        return self._tied[0].embed_tokens.weight if self._tied else self.lm_head.weight

    def borrowed_parameters(self) -> list[nn.Parameter]:
        """What it computes with that another unit owns: tied, the embedding's weight."""
        return [self.output_weight()] if self._tied else []

    def init_weights(self, gen: torch.Generator) -> None:
        self.norm.weight.fill_(1.0)
        if self._tied is None:
            self.lm_head.weight.normal_(0.0, INIT_STD, generator=gen)

    def _weight(self) -> torch.Tensor:
        w = self.output_weight()
        return F.normalize(w, dim=-1) if self.norm_head else w  # Baichuan2 NormHead: unit rows

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(h), self._weight())

    def chunked(self, targets: torch.Tensor) -> bool:
        """Whether loss() keeps no logits for `targets`: they exceed one chunk."""
        return chunks(targets.numel(), self._vocab)

    def loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """lm_loss of forward(h); where the logits exceed a chunk, without them in memory
        (models/head_loss.py). What training computes."""
        if not self.chunked(targets):
            return lm_loss(self.forward(h), targets)
        return chunked_cross_entropy(self.norm(h), self._weight(), targets)


def parameters_read(unit: nn.Module) -> list[nn.Parameter]:
    """The parameters a unit's forward reads: its own, and those it borrows (a tied head)."""
    borrowed = unit.borrowed_parameters() if isinstance(unit, Head) else []
    return [*unit.parameters(), *borrowed]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all positions, in float32 whatever the logits' dtype."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


# --- building -----------------------------------------------------------------------------------


def _unit_seed(seed: int, index: int) -> int:
    # Distinct for every (seed, index) while models have fewer than 2**20 units.
    return seed * (1 << 20) + index


def build_unit(
    cfg: ModelConfig, index: int, seed: int, *, embedding: Embedding | None = None
) -> nn.Module:
    """Build unit `index` in float32 on the CPU, initialized from its own (seed, index) generator.

    `embedding` is the already built unit 0, passed to the head when embeddings are tied. A tied
    head built without it (a last pipeline stage) gets its own lm_head.weight initialized exactly
    as the embedding is; keeping the two equal (summing their gradients) is then the runtime's job.
    The global RNG is neither used nor advanced.
    """
    head = cfg.n_layers + 1
    if not 0 <= index <= head:
        raise ValueError(f"unit index {index} out of range 0..{head}")
    if index == 0:
        unit = Embedding(cfg)
    elif index == head:
        unit = Head(cfg, tied=embedding if cfg.tie_embeddings else None)
    else:
        unit = DecoderBlock(cfg)
    unit.to(torch.float32)  # the master dtype, whatever torch's default dtype is
    # A tied head's own copy draws from the embedding's generator so the two start equal.
    gen_index = 0 if index == head and cfg.tie_embeddings else index
    gen = torch.Generator().manual_seed(_unit_seed(seed, gen_index))
    with torch.no_grad():
        unit.init_weights(gen)
    unit.index = index
    return unit


def build_units(
    cfg: ModelConfig, seed: int, indices: Sequence[int] | None = None
) -> list[nn.Module]:
    """Build the given units (all of them by default), in the order given.

    With tied embeddings and both unit 0 and the head in `indices`, the head shares the
    embedding's Parameter.
    """
    cfg.validate()
    indices = list(range(cfg.n_units)) if indices is None else list(indices)
    built: dict[int, nn.Module] = {}
    for i in sorted(indices):  # unit 0 first, so a tied head can find it
        built[i] = build_unit(cfg, i, seed, embedding=built.get(0))
    return [built[i] for i in indices]


def hf_param_name(cfg: ModelConfig, unit_index: int, local_name: str) -> str:
    """Hugging Face name of a unit's parameter, e.g. (cfg, 2, 'mlp.up_proj.weight') ->
    'model.layers.1.mlp.up_proj.weight'. A tied head's own lm_head maps to the embedding."""
    if unit_index == 0:
        return "model." + local_name
    if unit_index == cfg.n_layers + 1:
        if local_name.startswith("lm_head."):
            return "model.embed_tokens.weight" if cfg.tie_embeddings else local_name
        return "model." + local_name
    return f"model.layers.{unit_index - 1}.{local_name}"


class LlamaModel(nn.Module):
    """All units in one module: tokens [B, T] -> logits [B, T, vocab]. For single-process use."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.units = nn.ModuleList(build_units(cfg, seed))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        for unit in self.units:
            h = unit(h)
        return h
