"""NumPy references of the block-sparse kernels and the random masks the checks feed them.

Shared by the unit tests (CPU) and tools/gpu_check.py (H200), so both check the same semantics.
"""

from __future__ import annotations

import numpy as np

from .knobs import MAX_GROUPS, order_groups_ok

MASK_KINDS = ("random", "all_active", "all_skipped", "skewed")


def make_mask(kind: str, tokens: int, groups: int, rng: np.random.Generator, sparsity: float = 0.5) -> np.ndarray:
    """[tokens, groups] int32 mask at `sparsity`; "skewed": the keep probability rises from 0 (first group)
    to 1 (last group) as linspace**p, p = s / (1 - s), so active counts differ strongly between groups."""
    if kind == "all_active":
        return np.ones((tokens, groups), np.int32)
    if kind == "all_skipped":
        return np.zeros((tokens, groups), np.int32)
    if kind == "skewed":
        keep = np.linspace(0.0, 1.0, groups)[None, :] ** (sparsity / max(1e-6, 1.0 - sparsity))
        return (rng.random((tokens, groups)) < keep).astype(np.int32)
    return (rng.random((tokens, groups)) >= sparsity).astype(np.int32)


def ref_mask_reorder(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counts [G], order [G, n], used [G + 1]: used groups, then unused ones, then the used count) as the
    mask_reorder kernel defines them."""
    counts = (mask != 0).sum(axis=0).astype(np.int32)
    order = np.stack([np.concatenate([np.flatnonzero(col), np.flatnonzero(col == 0)]) for col in mask.T])
    groups = mask.shape[1]
    nz = np.flatnonzero(counts > 0)
    used = np.concatenate([nz, np.flatnonzero(counts == 0), [nz.size]]).astype(np.int32)
    return counts, order.astype(np.int32).reshape(groups, mask.shape[0]), used


def _kn(w: np.ndarray, layout: str) -> np.ndarray:
    return w.T if layout == "nk" else w


def ref_gemm_mn(x, wg, wu, mask, group_size: int, layout: str, swiglu: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    a = x64 @ _kn(wg, layout).astype(np.float64)
    if swiglu:
        a = a / (1.0 + np.exp(-a)) * (x64 @ _kn(wu, layout).astype(np.float64))
    return np.where(np.repeat(mask, group_size, axis=1) != 0, a, 0.0)


def ref_gemm_k(a, w, mask, group_size: int, layout: str) -> np.ndarray:
    gated = np.where(np.repeat(mask, group_size, axis=1) != 0, a.astype(np.float64), 0.0)
    return gated @ _kn(w, layout).astype(np.float64)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| (0 when both are 0)."""
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = float(np.abs(ref).max())
    diff = float(np.abs(out.astype(np.float64) - ref).max()) if out.size else 0.0
    return diff / scale if scale > 0 else diff


def ref_pattern_order(mask):
    """NumPy model of schedules/token_order.py's pattern_order perm for a mask [n, G]: tokens stably sorted by the
    inverse Gray code of their pattern (group 0 the most significant bit), so neighbouring patterns differ in one
    group. Worked example, G = 2: patterns 00, 01, 11, 10 rank 0, 1, 2, 3, so mask rows [[1, 0], [0, 0], [1, 1]]
    give perm [1, 2, 0]."""
    mask = np.asarray(mask) != 0
    if not order_groups_ok(mask.shape[1]):
        raise ValueError(f"tokens of {mask.shape[1]} groups cannot be ordered by mask pattern (1 .. {MAX_GROUPS} groups)")
    key = (mask * (1 << np.arange(mask.shape[1] - 1, -1, -1))).sum(1)
    shift = 1
    while shift < mask.shape[1]:  # inverse Gray code, as the kernel's
        key = key ^ (key >> shift)
        shift *= 2
    return np.argsort(key, kind="stable")
