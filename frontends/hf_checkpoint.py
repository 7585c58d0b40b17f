"""Build a WIDE model from a local Hugging Face Llama/Qwen3 folder plus WIDE's router (and LoRA) files.

The base weights are copied into our own `WideForCausalLM` (explicit RoPE and causal mask, which our
frontends import); RoPE frequencies are taken from the Hugging Face model itself, so scaled RoPE
(Llama 3.1's `llama3`) comes out exactly as transformers computes it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from ..errors import WideError
from ..model import WideConfig, WideForCausalLM
from .wide_checkpoint import read_lora, read_routers, resolve_group_size

SUPPORTED = ("llama", "qwen3")


@dataclass
class WideCheckpoint:
    """The gated model, the base model it came from (LoRA merged), and how the sizes were resolved."""

    model: WideForCausalLM
    base: torch.nn.Module
    config: WideConfig
    lora_modules: list[str]


def _load_base(hf_dir: str):
    if not os.path.isdir(hf_dir):
        raise WideError(f"{hf_dir}: Hugging Face model folder not found")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
        raise WideError(f"{hf_dir}: no config.json; not a Hugging Face model folder")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    try:
        hf_cfg = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds
        raise WideError(f"{hf_dir}/config.json: cannot read ({str(err).splitlines()[0][:200]})") from None
    if hf_cfg.model_type not in SUPPORTED:
        raise WideError(f"{hf_dir}: model_type {hf_cfg.model_type!r} is not supported (supported: {', '.join(SUPPORTED)})")
    _check_architecture(hf_dir, hf_cfg)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32)
    except Exception as err:  # noqa: BLE001
        raise WideError(f"{hf_dir}: cannot load the model weights ({str(err).splitlines()[0][:200]})") from None
    return hf_cfg, base.eval()


def _check_architecture(hf_dir: str, c) -> None:
    problems = []
    if getattr(c, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {c.hidden_act!r} (WIDE's gated FFN is SwiGLU)")
    if getattr(c, "attention_bias", False):
        problems.append("attention_bias=true")
    if getattr(c, "mlp_bias", False):
        problems.append("mlp_bias=true")
    if getattr(c, "use_sliding_window", False):
        problems.append("use_sliding_window=true")
    if problems:
        raise WideError(f"{hf_dir}: unsupported {c.model_type} configuration: {'; '.join(problems)}")


def _wide_config(hf_cfg, base, attn_gs: int, ffn_gs: int, rank: int) -> WideConfig:
    rotary = base.model.rotary_emb
    head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    return WideConfig(
        vocab_size=hf_cfg.vocab_size, hidden_size=hf_cfg.hidden_size, intermediate_size=hf_cfg.intermediate_size,
        num_layers=hf_cfg.num_hidden_layers, num_heads=hf_cfg.num_attention_heads,
        num_kv_heads=hf_cfg.num_key_value_heads, head_dim=head_dim, attn_group_size=attn_gs,
        ffn_group_size=ffn_gs, router_rank=rank, rms_eps=hf_cfg.rms_norm_eps,
        qk_norm=hf_cfg.model_type == "qwen3", rope_inv_freq=rotary.inv_freq.float().tolist(),
        rope_scaling_factor=float(rotary.attention_scaling))


def _merge_lora(path: str, alpha: float | None, base: torch.nn.Module) -> list[str]:
    deltas = read_lora(path, alpha)
    modules = dict(base.named_modules())
    for name, delta in deltas.items():
        module = modules.get(name) or modules.get(name.removeprefix("model.")) or modules.get(f"model.{name}")
        if module is None or not isinstance(getattr(module, "weight", None), torch.Tensor):
            raise WideError(f"{path}: LoRA for module {name!r}, which the base model lacks")
        if tuple(module.weight.shape) != tuple(delta.shape):
            raise WideError(f"{path}: LoRA for {name} gives a {list(delta.shape)} update to a "
                            f"{list(module.weight.shape)} weight")
        with torch.no_grad():
            module.weight += delta.to(module.weight.dtype)
    return sorted(deltas)


def _copy_weights(base, routers, model: WideForCausalLM) -> None:
    src = base.model
    with torch.no_grad():
        model.embed_tokens.weight.copy_(src.embed_tokens.weight)
        model.norm.weight.copy_(src.norm.weight)
        model.lm_head.weight.copy_(base.get_output_embeddings().weight)
        for i, (ours, theirs) in enumerate(zip(model.layers, src.layers)):
            for norm in ("input_layernorm", "post_attention_layernorm"):
                getattr(ours, norm).weight.copy_(getattr(theirs, norm).weight)
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(ours.self_attn, proj).weight.copy_(getattr(theirs.self_attn, proj).weight)
            if model.config.qk_norm:
                ours.self_attn.q_norm.weight.copy_(theirs.self_attn.q_norm.weight)
                ours.self_attn.k_norm.weight.copy_(theirs.self_attn.k_norm.weight)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                getattr(ours.mlp, proj).weight.copy_(getattr(theirs.mlp, proj).weight)
            for kind, router in (("router_attention", ours.router_attention), ("router_ffn", ours.router_ffn)):
                params = routers.weights[(i, kind)]
                router.compressor.weight.copy_(params["compressor.weight"])
                router.compressor.bias.copy_(params["compressor.bias"])
                router.router.weight.copy_(params["router.weight"])
                router.router.bias.copy_(params["router.bias"])


def load_wide_checkpoint(hf_dir: str, routers_path: str, lora_path: str | None = None, *,
                         attn_group_size: int | None = None, ffn_group_size: int | None = None,
                         rank: int | None = None, lora_alpha: float | None = None) -> WideCheckpoint:
    """Gated WideForCausalLM (eval, fp32) from a Hugging Face folder + router.pth [+ lora.pth].

    Group sizes and rank are inferred from the router shapes when not given; given ones must agree.
    """
    hf_cfg, base = _load_base(hf_dir)
    routers = read_routers(routers_path, hf_cfg.num_hidden_layers, hf_cfg.hidden_size)
    if rank is not None and rank != routers.rank:
        raise WideError(f"--rank {rank}, but {routers_path} holds rank-{routers.rank} routers "
                        f"(compressor.weight is [{routers.rank}, {hf_cfg.hidden_size}])")
    attn_gs = resolve_group_size(routers_path, "router_attention", routers.groups("router_attention"),
                                 hf_cfg.num_attention_heads, "attention heads", attn_group_size)
    ffn_gs = resolve_group_size(routers_path, "router_ffn", routers.groups("router_ffn"),
                                hf_cfg.intermediate_size, "FFN channels", ffn_group_size)
    lora_modules = _merge_lora(lora_path, lora_alpha, base) if lora_path else []
    cfg = _wide_config(hf_cfg, base, attn_gs, ffn_gs, routers.rank)
    model = WideForCausalLM(cfg)
    _copy_weights(base, routers, model)
    return WideCheckpoint(model.eval(), base, cfg, lora_modules)
