"""Read WIDE's training outputs: `router.pth` (stage 1) and `lora.pth` (stage 2), with shape checks.

Both are plain `torch.save` state dicts. Router keys:
`[prefix.]layers.{i}.router_{attention,ffn}.{compressor,router}.{weight,bias}`; LoRA keys:
`[base_model.model.]<module>.lora_{A,B}[.<adapter>].weight`. Everything that does not fit is reported
with the file and key that caused it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..errors import WideError

_ROUTER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(router_attention|router_ffn)\.(compressor|router)\.(weight|bias)$")
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$")
ROUTER_KINDS = ("router_attention", "router_ffn")


def load_state_dict(path: str, what: str) -> dict[str, torch.Tensor]:
    """torch.load a state dict (weights only), unwrapping a top-level {"state_dict": ...}."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise WideError(f"{path}: {what} file not found") from None
    except Exception as err:  # noqa: BLE001 - pickle/zip errors of a corrupt file
        raise WideError(f"{path}: cannot read {what} ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise WideError(f"{path}: {what} is not a state dict of tensors (got {type(obj).__name__})")
    return obj


@dataclass
class RouterCheckpoint:
    """Router weights per layer and kind, plus the sizes the shapes imply."""

    path: str
    weights: dict[tuple[int, str], dict[str, torch.Tensor]]  # (layer, kind) -> {compressor.weight: ..}
    num_layers: int

    def groups(self, kind: str) -> int:
        return self.weights[(0, kind)]["router.weight"].shape[0] // 2

    @property
    def rank(self) -> int:
        return self.weights[(0, ROUTER_KINDS[0])]["compressor.weight"].shape[0]


def read_routers(path: str, num_layers: int, hidden: int) -> RouterCheckpoint:
    """Parse and check router.pth against a base model with `num_layers` layers of width `hidden`."""
    sd = load_state_dict(path, "router checkpoint")
    weights: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    unknown = []
    for key, value in sd.items():
        m = _ROUTER_KEY.search(key)
        if not m:
            unknown.append(key)
            continue
        layer, kind, lin, param = int(m[1]), m[2], m[3], m[4]
        weights.setdefault((layer, kind), {})[f"{lin}.{param}"] = value.detach().float()
    if unknown:
        raise WideError(f"{path}: {len(unknown)} key(s) are not WIDE router weights, e.g. {unknown[:3]} "
                        "(expected model.layers.{i}.router_{attention,ffn}.{compressor,router}.{weight,bias})")
    if not weights:
        raise WideError(f"{path}: no router weights found")
    layers = sorted({layer for layer, _ in weights})
    extra = [layer for layer in layers if layer >= num_layers]
    if extra:
        raise WideError(f"{path}: routers for layer(s) {extra}, but the base model has {num_layers} layers")
    missing = [f"layers.{i}.{kind}" for i in range(num_layers) for kind in ROUTER_KINDS if (i, kind) not in weights]
    if missing:
        raise WideError(f"{path}: routers missing for {len(missing)} sub-layer(s): {missing[:4]}"
                        f"{' ...' if len(missing) > 4 else ''} (the base model has {num_layers} layers)")
    for (layer, kind), params in sorted(weights.items()):
        lacking = [k for k in ("compressor.weight", "compressor.bias", "router.weight", "router.bias")
                   if k not in params]
        if lacking:
            raise WideError(f"{path}: layers.{layer}.{kind} lacks {', '.join(lacking)}")
    ckpt = RouterCheckpoint(path, weights, num_layers)
    for (layer, kind), params in sorted(weights.items()):
        _check_router(path, f"layers.{layer}.{kind}", params, hidden, ckpt.rank, ckpt.groups(kind))
    return ckpt


def _check_router(path: str, name: str, params: dict, hidden: int, rank: int, groups: int) -> None:
    if params["router.weight"].shape[0] % 2:
        raise WideError(f"{path}: {name}.router.weight has {params['router.weight'].shape[0]} rows; "
                        "a router emits 2 logits (execute, skip) per group")
    expect = {"compressor.weight": (rank, hidden), "compressor.bias": (rank,),
              "router.weight": (2 * groups, rank), "router.bias": (2 * groups,)}
    cw = params["compressor.weight"]
    if cw.ndim == 2 and cw.shape[1] != hidden:
        raise WideError(f"{path}: {name}.compressor.weight is {list(cw.shape)}: it reads {cw.shape[1]} features, "
                        f"but the base model's hidden size is {hidden}")
    for key, shape in expect.items():
        if tuple(params[key].shape) != shape:
            raise WideError(f"{path}: {name}.{key} has shape {list(params[key].shape)}, expected {list(shape)} "
                            f"(rank {rank}, {groups} groups, hidden {hidden}; all layers must agree)")


def resolve_group_size(path: str, kind: str, groups: int, total: int, what: str, given: int | None) -> int:
    """Group size from the router's group count and `total` heads/channels; `given` must agree with it."""
    flag = "--attn-group-size" if kind == "router_attention" else "--ffn-group-size"
    if given is not None:
        if given <= 0 or total % given:
            raise WideError(f"{flag} {given} does not divide the base model's {total} {what}")
        if total // given != groups:
            raise WideError(f"{flag} {given} gives {total // given} groups of {what}, but {path} routes "
                            f"{groups} groups ({kind}.router emits {2 * groups} logits)")
        return given
    if groups == 0 or total % groups:
        raise WideError(f"{path}: {kind} routes {groups} groups, which does not divide the base model's "
                        f"{total} {what}; pass {flag} explicitly or check the base model")
    return total // groups


def read_lora(path: str, alpha: float | None) -> dict[str, torch.Tensor]:
    """LoRA deltas per module path, `(B @ A) * alpha / r`, from lora.pth."""
    sd = load_state_dict(path, "LoRA checkpoint")
    if alpha is None:
        raise WideError(f"{path}: --lora needs --lora-alpha (LoRA's alpha is not stored in the checkpoint)")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        m = _LORA_KEY.match(key)
        if not m:
            raise WideError(f"{path}: key {key!r} is not a LoRA weight (expected <module>.lora_A/.lora_B.weight)")
        pairs.setdefault(m[1], {})[m[2]] = value.detach().float()
    deltas = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise WideError(f"{path}: {module} has lora_{next(iter(ab))} but no lora_{'B' if 'A' in ab else 'A'}")
        a, b = ab["A"], ab["B"]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0]:
            raise WideError(f"{path}: {module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not chain "
                            "(expected A [r, in], B [out, r])")
        deltas[module] = (b @ a) * (alpha / a.shape[0])
    if not deltas:
        raise WideError(f"{path}: no LoRA weights found")
    return deltas
