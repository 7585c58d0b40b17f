"""The dense PyTorch baseline of the end-to-end benchmark: a Llama of a WideConfig's shapes (no routers) with a
static KV cache, gpt-fast style: the cache is allocated once for `max_batch` x `max_seq` tokens, each forward writes
its keys / values at `input_pos` and attends over the whole cache under a causal mask (SDPA), so a decode step has
one shape per batch size and `torch.compile(mode="reduce-overhead")` captures it in a CUDA graph.

    model = StaticCacheLlama(cfg, max_batch=4, max_seq=4352).cuda().half()
    logits = model(ids [B, T], input_pos [T])          # positions T of every sequence of the batch
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class _Layer(nn.Module):
    def __init__(self, cfg, max_batch: int, max_seq: int):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.d = cfg.num_heads, cfg.num_kv_heads, d
        self.wqkv = nn.Linear(h, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, bias=False)
        self.wo = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.w13 = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.norm1 = nn.RMSNorm(h, eps=cfg.rms_eps)
        self.norm2 = nn.RMSNorm(h, eps=cfg.rms_eps)
        shape = (max_batch, cfg.num_kv_heads, max_seq, d)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x, cos, sin, mask, input_pos):
        b, t, _ = x.shape
        q, k, v = self.wqkv(self.norm1(x)).split([self.heads * self.d, self.kv_heads * self.d,
                                                 self.kv_heads * self.d], dim=-1)
        q = _rope(q.view(b, t, self.heads, self.d).transpose(1, 2), cos, sin)
        k = _rope(k.view(b, t, self.kv_heads, self.d).transpose(1, 2), cos, sin)
        v = v.view(b, t, self.kv_heads, self.d).transpose(1, 2)
        self.k_cache[:b, :, input_pos] = k
        self.v_cache[:b, :, input_pos] = v
        y = F.scaled_dot_product_attention(q, self.k_cache[:b], self.v_cache[:b], attn_mask=mask,
                                           enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.w13(self.norm2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class StaticCacheLlama(nn.Module):
    def __init__(self, cfg, max_batch: int, max_seq: int):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(_Layer(cfg, max_batch, max_seq) for _ in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat((freqs, freqs), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((freqs, freqs), -1).sin(), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)),
                             persistent=False)

    def forward(self, ids, input_pos, last_only: bool = True):
        """Logits [B, 1, vocab] at the last position (`last_only`), else at every position."""
        x = self.embed(ids)
        cos, sin = self.cos[input_pos].to(x.dtype), self.sin[input_pos].to(x.dtype)
        mask = self.causal[None, None, input_pos]
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))


def random_model(cfg, max_batch: int, max_seq: int, device="cuda", dtype=torch.float16, seed: int = 0):
    """The baseline with random weights made on `device` (matrices N(0, 0.02^2), norms ones)."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # (the caches made in it: a batch-64 cache in fp32 would not fit)
    try:
        with torch.device(device):
            model = StaticCacheLlama(cfg, max_batch, max_seq)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(0, 0.02)
    return model.eval()
