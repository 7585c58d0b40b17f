"""Reference PyTorch model with WIDE's inference semantics (routers, gated attention and FFN)."""

from __future__ import annotations

import torch

from .config import WideConfig
from .modules import (DecoderLayer, GatedAttention, GatedFFN, LogitsAndMasks, RMSNorm, TokenRouter,
                      WideForCausalLM)

__all__ = ["WideConfig", "WideForCausalLM", "LogitsAndMasks", "DecoderLayer", "GatedAttention", "GatedFFN", "RMSNorm",
           "TokenRouter", "build_example", "example_inputs"]


def build_example(cfg: WideConfig | None = None, seed: int = 0) -> WideForCausalLM:
    """Deterministic seeded model (eval mode); random routers gate roughly half of the groups."""
    torch.manual_seed(seed)
    model = WideForCausalLM(cfg or WideConfig())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.uniform_(0.8, 1.2)
    return model.eval()


def example_inputs(cfg: WideConfig, tokens: int = 7, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, tokens), generator=g)
