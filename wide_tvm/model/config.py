"""Configuration of a WIDE-gated Llama-style causal LM (the sizes are all configurable)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


@dataclass
class WideConfig:
    """Sizes of the reference model; group sizes count query heads / FFN channels per gated group."""

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    attn_group_size: int = 2
    ffn_group_size: int = 32
    router_rank: int = 16
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    rope_inv_freq: list[float] | None = None  # explicit RoPE frequencies (scaled RoPE, e.g. Llama 3.1)
    rope_scaling_factor: float = 1.0  # multiplies cos/sin (Hugging Face's attention_scaling)
    gated_layers: list[int] | None = field(default=None)  # None: every layer is gated
    # "eager": scores, causal mask and softmax written out (repeat_kv's expand); "sdpa": one
    # F.scaled_dot_product_attention call (causal, GQA through enable_gqa), as Hugging Face's default runs it
    attention: str = "eager"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.num_heads % self.attn_group_size:
            raise ValueError(
                f"attn_group_size={self.attn_group_size} does not divide num_heads={self.num_heads}")
        if self.attention not in ("eager", "sdpa"):
            raise ValueError(f"attention={self.attention!r}: 'eager' or 'sdpa'")
        if self.intermediate_size % self.ffn_group_size:
            raise ValueError(
                f"ffn_group_size={self.ffn_group_size} does not divide intermediate_size={self.intermediate_size}")

    @property
    def attn_groups(self) -> int:
        return self.num_heads // self.attn_group_size

    @property
    def ffn_groups(self) -> int:
        return self.intermediate_size // self.ffn_group_size

    def is_gated(self, layer: int) -> bool:
        return self.gated_layers is None or layer in self.gated_layers

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WideConfig":
        return cls(**json.loads(text))


# Llama-3.1-8B's shapes (32 layers, hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336, vocabulary
# 128256) with WIDE routers on every layer (attention groups of 4 heads, FFN groups of 128 channels, router rank 128):
# what the benchmarks build (bench/model.py with 2 layers and a small vocabulary, bench/e2e_model.py whole)
LLAMA_3_1_8B = WideConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                          num_kv_heads=8, head_dim=128, attn_group_size=4, ffn_group_size=128, router_rank=128,
                          rope_theta=500000.0, attention="sdpa")
