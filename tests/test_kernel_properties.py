"""Property test of the CPU gated kernels against NumPy over random shapes, group sizes, layouts, dtypes, token
counts and masks (a small fixed budget per run; each run draws fresh cases: the seed is in every failure message,
`WIDE_PROPERTY_SEED=N` replays it)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import build_cpu
from test_kernels import TOL, _run_k, _run_mn
from wide_tvm.kernel_reference import MASK_KINDS, make_mask, ref_gemm_k, ref_gemm_mn, rel_err
from wide_tvm.schedules import gemm_k, gemm_mn

SEED = int(os.environ.get("WIDE_PROPERTY_SEED") or np.random.SeedSequence().entropy % 2**32)
CASES = 24  # kernels built per run (one each), each checked at 4 token counts: ~6 s


def _case(rng: np.random.Generator) -> dict:
    return {"kind": str(rng.choice(["gemm_mn_swiglu", "gemm_mn", "gemm_k"])), "groups": int(rng.integers(1, 13)),
            "group_size": int(rng.choice([1, 2, 3, 4, 8, 16, 32, 64])), "dim": int(rng.choice([8, 16, 24, 40, 64])),
            "layout": str(rng.choice(["nk", "kn"])), "dtype": str(rng.choice(["float32", "float16"]))}


@pytest.mark.parametrize("index", range(CASES))
def test_random_kernels_match_numpy(index):
    rng = np.random.default_rng([SEED, index])
    case = _case(rng)
    where = f"seed {SEED} (WIDE_PROPERTY_SEED), case {index}: {case}"
    g, gs, dim, layout, dtype = case["groups"], case["group_size"], case["dim"], case["layout"], case["dtype"]
    tokens = [1, *(int(t) for t in rng.integers(2, 48, 3))]
    if case["kind"] == "gemm_k":
        func = build_cpu(gemm_k(g, gs, dim, dtype, layout, "llvm"))
        for t in tokens:
            mask = make_mask(str(rng.choice(MASK_KINDS)), t, g, rng, float(rng.uniform(0.1, 0.9)))
            a = rng.standard_normal((t, g * gs)).astype(dtype)
            w = (rng.standard_normal((dim, g * gs) if layout == "nk" else (g * gs, dim)) / np.sqrt(g * gs)).astype(dtype)
            out = _run_k(func, a, w, mask, dim, dtype)
            assert rel_err(out, ref_gemm_k(a, w, mask, gs, layout)) < TOL[dtype], (where, t)
        return
    swiglu = case["kind"] == "gemm_mn_swiglu"
    func = build_cpu(gemm_mn(g, gs, dim, dtype, layout, swiglu, "llvm"))
    shape = (g * gs, dim) if layout == "nk" else (dim, g * gs)
    for t in tokens:
        mask = make_mask(str(rng.choice(MASK_KINDS)), t, g, rng, float(rng.uniform(0.1, 0.9)))
        x = rng.standard_normal((t, dim)).astype(dtype)
        wg, wu = ((rng.standard_normal(shape) / np.sqrt(dim)).astype(dtype) for _ in range(2))
        out = _run_mn(func, x, wg, wu, mask, g * gs, dtype)
        assert rel_err(out, ref_gemm_mn(x, wg, wu, mask, gs, layout, swiglu)) < TOL[dtype], (where, t)
