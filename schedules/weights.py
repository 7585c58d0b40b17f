"""Weight layouts: exporters hand weights as [N, K] (torch Linear) or pre-transposed [K, N] (ONNX)."""

from __future__ import annotations


def _load_nk(w, k, n):
    return w[n, k]


def _load_kn(w, k, n):
    return w[k, n]


def weight_loader(w_layout: str):
    """Function (buffer, k, n) -> element (k, n) of a weight stored in `w_layout`, used inside TVMScript."""
    if w_layout == "nk":
        return _load_nk
    if w_layout == "kn":
        return _load_kn
    raise ValueError(f"unknown weight layout {w_layout!r}; expected 'nk' or 'kn'")
