"""Weight element access inside the SIMT/CPU kernels, per stored layout (see wide_tvm/weight_layout.py)."""

from __future__ import annotations

from ..weight_layout import PANEL


def _load_nk(w, k, n):
    return w[n, k]


def _load_kn(w, k, n):
    return w[k, n]


def _load_kp(w, k, n):
    return w[n // PANEL, k, n % PANEL]


def _no_elementwise(w, k, n):
    raise ValueError("'tc' weights are read as fragment vectors by the tensor-core kernels only")


def weight_loader(w_layout: str):
    """Function (buffer, k, n) -> element (k, n) of a weight stored in `w_layout`, used inside TVMScript by
    the SIMT and CPU kernels ("tc" tiles are read by the tensor-core kernels themselves)."""
    if w_layout == "nk":
        return _load_nk
    if w_layout == "kn":
        return _load_kn
    if w_layout == "kp":
        return _load_kp
    if w_layout == "tc":
        return _no_elementwise
    raise ValueError(f"unknown weight layout {w_layout!r}; expected 'nk', 'kn', 'kp' or 'tc'")


def check_layout(w_layout: str, target_kind: str, tensor_core_ok: bool) -> None:
    """The "tc" layout exists only for the CUDA tensor-core kernels (fp16, tile-divisible shapes), "kp" panels
    only for the CPU kernels."""
    if w_layout == "kp" and target_kind != "llvm":
        raise ValueError(f"the 'kp' weight layout (panels of {PANEL} columns) is read by the CPU kernels only; "
                         f"target {target_kind!r} takes 'nk', 'kn' or 'tc'")
    if w_layout == "tc" and (target_kind != "cuda" or not tensor_core_ok):
        raise ValueError("the 'tc' weight layout needs the CUDA tensor-core kernels (fp16, groups a multiple of "
                         f"the 16 x 32 tile); target {target_kind!r} or this shape does not have them")
