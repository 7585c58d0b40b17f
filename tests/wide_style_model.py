"""A WIDE-style causal LM written independently of wide_tvm.model, the way WIDE's own inference code and Hugging
Face models spell things, each layer with its own spelling of the gate (for tests of the gate recognition).

WIDE's inference path (its wrapper's eval mode), reproduced here: the router `router(compressor(x))` viewed as
`[b, s, G, 2]` with einops' `rearrange`; the execute mask `argmax(-1).to(bool).logical_not().to(dtype)`; the FFN
gate applied as `rearrange(h, 'b l (n h) -> b l n h') * mask[..., None]` and back (`apply_mask`); the attention
gate as a head mask `mask.repeat_interleave(group, -1)[..., None]` on the `[b, s, heads, d]` attention output,
flattened into o_proj; attention through `scaled_dot_product_attention`.

    >>> model = StyleModel([LayerSpelling("logical_not", "einops", "sdpa_gqa")], seed=0)
    >>> model(torch.zeros(1, 3, dtype=torch.long)).shape
    torch.Size([1, 3, 64])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

# The execute decision of logits [.., G, 2] (index 0 = execute), spelled in each way the recognition accepts
MASKS = {
    "eq0": lambda logits: logits.argmax(dim=-1) == 0,
    "ne1": lambda logits: logits.argmax(dim=-1) != 1,
    "one_minus": lambda logits: 1 - logits.argmax(dim=-1),
    "logical_not": lambda logits: logits.argmax(dim=-1).to(torch.bool).logical_not(),  # WIDE's eval mode
    "where": lambda logits: torch.where(logits.argmax(dim=-1) == 0, 1.0, 0.0),
    "compare": lambda logits: logits[..., 0] >= logits[..., 1],
    "softmax": lambda logits: F.softmax(logits, dim=-1)[..., 0] > 0.5,
    "plus_one": lambda logits: logits.argmax(dim=-1) + 1,  # not a gate (1 or 2): must be reported, not lowered
}


def expand_gate(kind: str, h: torch.Tensor, mask: torch.Tensor, group: int) -> torch.Tensor:
    """h [b, s, G * group] times the gate mask [b, s, G] spread over contiguous channel groups."""
    b, s, g = mask.shape
    if kind == "repeat_interleave":
        return h * torch.repeat_interleave(mask, group, dim=-1)
    if kind == "expand":
        return h * mask[..., None].expand(b, s, g, group).reshape(b, s, g * group)
    if kind == "einops":  # WIDE's apply_mask
        return rearrange(rearrange(h, "b l (n h) -> b l n h", h=group) * mask[..., None], "b l n h -> b l (n h)")
    if kind == "tile":
        return h * mask[..., None].repeat(1, 1, 1, group).reshape(b, s, g * group)
    if kind == "interleaved":  # channel c -> group c % G: not contiguous groups, must not be lowered
        return h * mask.repeat(1, 1, group)
    raise KeyError(kind)


@dataclass(frozen=True)
class LayerSpelling:
    mask: str = "logical_not"  # a key of MASKS (both routers of the layer)
    ffn: str = "einops"  # expand_gate's kind for the FFN gate
    attention: str = "sdpa_gqa"  # softmax | sdpa_gqa (enable_gqa, causal) | sdpa_causal | sdpa_mask (explicit)
    attn_gate: str = "head_mask"  # head_mask (WIDE's: heads repeated, [..., None]) | einops | expand


class StyleRouter(nn.Module):
    def __init__(self, hidden: int, groups: int, rank: int, mask: str):
        super().__init__()
        self.compressor = nn.Linear(hidden, rank)
        self.router = nn.Linear(rank, 2 * groups)
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = rearrange(self.router(self.compressor(x)), "b s (h d) -> b s h d", d=2)
        return MASKS[self.mask](logits).to(x.dtype)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """x [b, s, heads, d] rotated (rotate-half RoPE)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(positions.float(), inv)
    cos, sin = torch.cat((freqs, freqs), -1).cos()[:, None, :], torch.cat((freqs, freqs), -1).sin()[:, None, :]
    half = torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)
    return x * cos + half * sin


class StyleAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, group: int, kind: str, gate: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.group, self.kind = heads, kv_heads, hidden // heads, group, kind
        self.gate = gate
        d = self.head_dim
        self.q_proj = nn.Linear(hidden, heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, hidden, bias=False)

    def forward(self, x: torch.Tensor, execute: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        q, k, v = (rearrange(p(x), "... (h d) -> ... h d", d=self.head_dim)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        pos = torch.arange(s)
        q, k = _rope(q, pos), _rope(k, pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, s, d]
        rep = self.heads // self.kv_heads
        if self.kind == "sdpa_gqa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            if self.kind == "sdpa_causal":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif self.kind == "sdpa_mask":
                bias = torch.full((s, s), float("-inf")).triu(1)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            elif self.kind == "softmax":
                scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim) + torch.full((s, s), float("-inf")).triu(1)
                out = F.softmax(scores, dim=-1) @ v
            else:
                raise KeyError(self.kind)
        out = out.transpose(1, 2)  # [b, s, heads, d]
        if self.gate == "head_mask":  # WIDE's: a mask per head, on the heads axis
            out = (out * execute.repeat_interleave(self.group, dim=-1)[..., None]).flatten(-2, -1)
        elif self.gate == "einops":  # the flat output viewed as [.., groups, group * d]
            flat = rearrange(out, "b s h d -> b s (h d)")
            out = rearrange(rearrange(flat, "b s (n c) -> b s n c", n=execute.shape[-1]) * execute[..., None],
                            "b s n c -> b s (n c)")
        elif self.gate == "expand":
            b, s, g = execute.shape
            out = (out * execute[..., None, None].expand(b, s, g, self.group, 1).reshape(b, s, g * self.group, 1)
                   ).flatten(-2, -1)
        else:
            raise KeyError(self.gate)
        return self.o_proj(out.contiguous())


class StyleMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, group: int, kind: str):
        super().__init__()
        self.group, self.kind = group, kind
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, execute: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(expand_gate(self.kind, h, execute, self.group))


class StyleNorm(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class StyleLayer(nn.Module):
    def __init__(self, spelling: LayerSpelling, hidden=64, heads=4, kv_heads=2, head_group=2, intermediate=192,
                 ffn_group=32, rank=8):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = StyleNorm(hidden), StyleNorm(hidden)
        self.router_attention = StyleRouter(hidden, heads // head_group, rank, spelling.mask)
        self.router_ffn = StyleRouter(hidden, intermediate // ffn_group, rank, spelling.mask)
        self.self_attn = StyleAttention(hidden, heads, kv_heads, head_group, spelling.attention, spelling.attn_gate)
        self.mlp = StyleMLP(hidden, intermediate, ffn_group, spelling.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), self.router_attention(x))
        return x + self.mlp(self.post_attention_layernorm(x), self.router_ffn(x))


class StyleModel(nn.Module):
    """input_ids [1, T] -> logits [1, T, 64]; one StyleLayer per spelling, random weights from `seed`."""

    def __init__(self, spellings: list[LayerSpelling], seed: int = 0, vocab: int = 64, hidden: int = 64):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(StyleLayer(s, hidden) for s in spellings)
        self.norm = StyleNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
