"""The end-to-end benchmark's weights: one model, made on the device from a seed, that the gated library, the dense
library and the PyTorch WIDE model all hold, with its routers set to a chosen share of active groups.

    model = reference_model(cfg, device, seed)          # the PyTorch WIDE model (wide_tvm/model), values by name
    shifts = calibrate(model, active=0.25, tokens=512)   # per router: the shift of its "execute" logits
    tensors = library_weights(lib, model.state_dict())   # a library's parameters, repacked as it stores them
    ours, torch_logits = main_against(vm, weights, model)  # the library's `main` beside the model's, same ids

Values depend on the weight's name and the seed alone (matrices N(0, 0.02^2), norm scales in [0.8, 1.2], biases 0),
so the libraries' arrays and the PyTorch model's agree whatever order they are made in. `calibrate` runs the model
layer by layer on random tokens and, at each router, sets the execute-logit shift to the quantile of the
(execute - skip) logit differences that leaves `active` of the (token, group) pairs executing, moved halfway to the
nearest difference below it (no pair on the boundary, where rounding would decide): the share is exact on those
tokens and close on others. Worked example: differences [-3, -1, 0.5, 2] and active 0.25: their 0.75 quantile is
0.875, halfway between 0.5 and 2 is 1.25, the shift -1.25, and only 2 - 1.25 stays above 0: one pair of four executes.
"""

from __future__ import annotations

import hashlib
import re


def _value(name: str, shape, dtype, device, seed: int):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()
    gen = torch.Generator(device=device).manual_seed(int(digest[:15], 16))
    if name.endswith("bias"):
        return torch.zeros(shape, dtype=dtype, device=device)
    if len(shape) == 1:
        return (torch.rand(shape, generator=gen, device=device) * 0.4 + 0.8).to(dtype)
    return (torch.randn(shape, generator=gen, device=device) * 0.02).to(dtype)


def reference_model(cfg, device, seed: int = 0, dtype=None):
    """The WIDE model of `cfg` (wide_tvm.model.WideForCausalLM) on `device`, each weight `_value(name)`."""
    import torch

    from ..model.modules import WideForCausalLM

    dtype = dtype or (torch.float16 if str(device).startswith("cuda") else torch.float32)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # (made in it: 8B parameters in fp32 first would not fit beside the rest)
    try:
        with torch.device("meta"):
            model = WideForCausalLM(cfg)
        model = model.to_empty(device=device)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(_value(name, tuple(p.shape), dtype, device, seed))
        if cfg.rope_inv_freq is not None:  # (a non-persistent buffer: to_empty left it unset)
            for layer in model.layers:
                layer.self_attn.inv_freq = torch.tensor(cfg.rope_inv_freq, dtype=torch.float32, device=device)
    return model.eval()


def calibrate(model, active: float, tokens: int = 512, seed: int = 1) -> dict:
    """Shift each router's execute logits so that `active` of the groups execute on `tokens` random tokens; returns
    {router bias name: shift} (applied to `model` too)."""
    import torch

    cfg = model.config
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=gen).to(model.embed_tokens.weight.device)
    shifts = {}

    def shift(router, name, x):
        diff = router.logits(x).float()
        diff = (diff[..., 0] - diff[..., 1]).flatten()
        if 0 < active < 1:
            cut = torch.quantile(diff, 1 - active)
            below, above = diff[diff < cut], diff[diff >= cut]  # (the shift halfway between two distinct values:
            if len(below) and len(above):                     #  no calibration pair sits on the boundary, where
                cut = (below.max() + above.min()) / 2          #  rounding would decide it)
            delta = -float(cut)
        else:
            delta = 1e4 if active >= 1 else -1e4
        router.router.bias.view(-1, 2)[:, 0] += delta
        shifts[name] = delta

    with torch.no_grad():
        x = model.embed_tokens(ids)
        for i, layer in enumerate(model.layers):
            if not layer.gated:
                x = layer(x)
                continue
            shift(layer.router_attention, f"layers.{i}.router_attention.router.bias", x)
            x = x + layer.self_attn(layer.input_layernorm(x), layer.router_attention(x))
            shift(layer.router_ffn, f"layers.{i}.router_ffn.router.bias", x)
            x = x + layer.mlp(layer.post_attention_layernorm(x), layer.router_ffn(x))
    return shifts


def active_share(model, tokens: int = 256, seed: int = 2) -> float:
    """The share of (token, group) pairs that execute, over every gated router, on fresh random tokens."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(model.embed_tokens.weight.device)
    masks = [m for pair in model.router_masks(ids) for m in pair if m is not None]
    return float(sum(m.float().sum() for m in masks) / sum(m.numel() for m in masks))


def library_weights(lib: dict, state: dict) -> list:
    """A library's parameters (lib: its e2e.json entry: weights, weight_names, weight_origins) from the model's
    state dict, each in the layout the library stores it."""
    from .. import weight_layout

    by_param = {}
    for key, value in state.items():  # (torch.export names a parameter p_<path with _>)
        by_param["p_" + key.replace(".", "_")] = value
        by_param[key.replace(".", "_")] = value
        by_param[key] = value
    out = []
    for name, (shape, _dtype) in zip(lib["weight_names"], lib["weights"]):
        source, src, layout = lib["weight_origins"].get(name, (name, "nk", "nk"))
        value = by_param.get(source) if source in by_param else by_param.get(re.sub(r"#\d+$", "", source))
        if value is None:
            raise KeyError(f"no model weight for the library's parameter {name} ({source})")
        value = weight_layout.pack(value if src == "nk" else value.T, layout).contiguous()
        if list(value.shape) != list(shape):
            raise ValueError(f"{name}: made {list(value.shape)}, the library takes {shape}")
        out.append(value)
    return out


def main_against(vm, weights: list, model, tokens: int = 16, seed: int = 7):
    """A library's stateless `main` and the PyTorch `model` on the same `tokens` seeded random ids, on the model's
    device: (ours, PyTorch's), fp32 logits [1, tokens, vocab]."""
    import torch
    import tvm

    from ..engine import first_output

    device = model.embed_tokens.weight.device
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))
    ids = ids.to(device)
    with torch.no_grad():
        want = model(ids).float()
    got = torch.from_dlpack(first_output(vm["main"](tvm.runtime.from_dlpack(ids), *weights))).float()
    return got, want
