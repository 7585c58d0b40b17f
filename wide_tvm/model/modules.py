"""PyTorch reference of WIDE's inference semantics: routers, gated GQA attention, gated SwiGLU FFN.

Written the way WIDE-style Hugging Face code is written (explicit RoPE, a `full`/`triu` causal mask,
`repeat_kv` through `expand`), so that the exported graphs carry the constructs our frontends must handle.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import WideConfig


class TokenRouter(nn.Module):
    """Low-rank router: compressor hidden->rank, router rank->2G, view [.., G, 2], argmax; index 0 = execute."""

    def __init__(self, hidden: int, rank: int, groups: int):
        super().__init__()
        self.groups = groups
        self.compressor = nn.Linear(hidden, rank)
        self.router = nn.Linear(rank, 2 * groups)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out = self.router(self.compressor(x))
        return out.view(*out.shape[:-1], self.groups, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token mask [..., G] in x's dtype: 1 where the group executes, 0 where it is skipped."""
        return (self.logits(x).argmax(dim=-1) == 0).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, like: torch.Tensor,
                 inv_freq: torch.Tensor | None = None, scale: float = 1.0):
    """cos/sin [T, head_dim]; `inv_freq` overrides the theta formula (scaled RoPE variants)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=like.device) / head_dim))
    pos = torch.arange(seq_len, dtype=torch.float32, device=like.device)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(like.dtype), sin.to(like.dtype)


def causal_mask(seq_len: int, like: torch.Tensor) -> torch.Tensor:
    mask = torch.full((seq_len, seq_len), float("-inf"), dtype=like.dtype, device=like.device)
    return torch.triu(mask, diagonal=1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, h, t, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, h, n_rep, t, d)
    return x.reshape(b, h * n_rep, t, d)


class GatedAttention(nn.Module):
    """GQA attention whose query-head groups are gated per token; K/V stay dense."""

    def __init__(self, cfg: WideConfig, gated: bool):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_eps)
            self.k_norm = RMSNorm(d, cfg.rms_eps)
        inv_freq = None if cfg.rope_inv_freq is None else torch.tensor(cfg.rope_inv_freq, dtype=torch.float32)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).view(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(t, cfg.head_dim, cfg.rope_theta, x, self.inv_freq, cfg.rope_scaling_factor)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = cfg.num_heads // cfg.num_kv_heads
        if cfg.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1).transpose(1, 2)
        else:
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(cfg.head_dim)
            scores = scores + causal_mask(t, x)
            probs = F.softmax(scores, dim=-1)
            out = torch.matmul(probs, v).transpose(1, 2)  # [b, t, heads, d]
        if mask is not None:
            groups = cfg.attn_groups
            out = out.reshape(b, t, groups, cfg.attn_group_size * cfg.head_dim) * mask.unsqueeze(-1)
        return self.o_proj(out.reshape(b, t, cfg.num_heads * cfg.head_dim))


class GatedFFN(nn.Module):
    """SwiGLU FFN whose intermediate channel groups are gated per token: down(mask * silu(gate) * up)."""

    def __init__(self, cfg: WideConfig):
        super().__init__()
        self.cfg = cfg
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        act = F.silu(self.gate_proj(x)) * self.up_proj(x)
        if mask is not None:
            expanded = torch.repeat_interleave(mask, self.cfg.ffn_group_size, dim=-1)
            act = act * expanded
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: WideConfig, layer: int):
        super().__init__()
        self.gated = cfg.is_gated(layer)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = GatedAttention(cfg, self.gated)
        self.mlp = GatedFFN(cfg)
        if self.gated:
            self.router_attention = TokenRouter(cfg.hidden_size, cfg.router_rank, cfg.attn_groups)
            self.router_ffn = TokenRouter(cfg.hidden_size, cfg.router_rank, cfg.ffn_groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_masks(x)[0]

    def forward_with_masks(self, x: torch.Tensor):
        """(output, attention mask, FFN mask); the masks are None in an ungated layer."""
        attn_mask = self.router_attention(x) if self.gated else None
        x = x + self.self_attn(self.input_layernorm(x), attn_mask)
        ffn_mask = self.router_ffn(x) if self.gated else None
        return x + self.mlp(self.post_attention_layernorm(x), ffn_mask), attn_mask, ffn_mask


class WideForCausalLM(nn.Module):
    """A small Llama-style causal LM with WIDE routers: input_ids [B, T] -> logits [B, T, vocab]."""

    def __init__(self, cfg: WideConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    @torch.no_grad()
    def router_masks(self, input_ids: torch.Tensor) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Per layer (attention mask, FFN mask) as the model computes them; for tests and sparsity reports."""
        out = []
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x, am, fm = layer.forward_with_masks(x)
            out.append((am, fm))
        return out


class LogitsAndMasks(nn.Module):
    """Wraps a WIDE model to also output every router mask, concatenated: (logits, masks [B, T, sum G]).

    Compiling this wrapper checks the compiled routers token by token (the masks of later layers depend
    on the gated kernels of earlier ones).
    """

    def __init__(self, model: WideForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor):
        m = self.model
        x = m.embed_tokens(input_ids)
        masks = []
        for layer in m.layers:
            x, am, fm = layer.forward_with_masks(x)
            masks += [mask for mask in (am, fm) if mask is not None]
        logits = m.lm_head(m.norm(x))
        return logits, torch.cat(masks, dim=-1)
