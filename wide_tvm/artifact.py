"""The deployable output: `NAME.so` (TVM library) plus `NAME.weights.npz` (weights and metadata).

Both are written to temporary names first and renamed at the end, so a failed compile leaves no
partial output file behind.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # a runtime-only install without it: it has no bf16 arrays to save, and loads refuse them
    BF16 = None
META_KEY = "__wide_meta__"


def weights_path(lib_path: str) -> str:
    root, _ = os.path.splitext(lib_path)
    return root + ".weights.npz"


@contextmanager
def atomic_outputs(lib_path: str):
    """Yields (tmp_lib, tmp_weights); renames them onto the real names only if the body succeeds."""
    out_dir = os.path.dirname(os.path.abspath(lib_path))
    os.makedirs(out_dir, exist_ok=True)
    tmp_lib = os.path.join(out_dir, f".{os.path.basename(lib_path)}.{os.getpid()}.tmp.so")
    tmp_w = os.path.join(out_dir, f".{os.path.basename(lib_path)}.{os.getpid()}.tmp.npz")
    try:
        yield tmp_lib, tmp_w
        os.replace(tmp_w, weights_path(lib_path))
        os.replace(tmp_lib, lib_path)
    finally:
        for tmp in (tmp_lib, tmp_w):
            if os.path.exists(tmp):
                os.remove(tmp)


def save_weights(path: str, weights: list[np.ndarray], meta: dict) -> None:
    """Weights as w0, w1, ... plus the metadata; bf16 arrays (ml_dtypes, which .npz cannot name: they would load
    back as raw `|V2` bytes) stored as their uint16 bits, their dtype named in the metadata."""
    arrays = {f"w{i}": np.ascontiguousarray(w).view(np.uint16) if w.dtype == BF16 else np.ascontiguousarray(w)
              for i, w in enumerate(weights)}
    meta = meta | {"bf16_weights": [i for i, w in enumerate(weights) if w.dtype == BF16]}
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_weights(path: str) -> tuple[list[np.ndarray], dict]:
    with np.load(path) as data:
        meta = json.loads(bytes(data[META_KEY]).decode())
        weights = [data[f"w{i}"] for i in range(len(meta["weight_names"]))]
    if meta.get("bf16_weights") and BF16 is None:
        from .errors import WideError

        raise WideError(f"{path}: holds bf16 weights; loading them needs the ml_dtypes package (pip install ml_dtypes)")
    for i in meta.get("bf16_weights", []):
        weights[i] = weights[i].view(BF16)
    return weights, meta
