"""Each block-sparse kernel against the NumPy reference, on the CPU (llvm), fresh random inputs."""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (numpy learns the name bfloat16)
import numpy as np
import pytest
import tvm

from conftest import build_cpu
from wide_tvm.kernel_reference import (MASK_KINDS, make_mask, ref_gemm_k, ref_gemm_mn, ref_mask_reorder,
                                       rel_err)
from wide_tvm.schedules import gemm_k, gemm_mn, mask_reorder

TOKENS = [1, 5, 8, 13, 33]  # one token, counts that do not fill a tile (BM=8 on CPU), several tiles
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def _t(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a))


@pytest.mark.parametrize("groups", [1, 3, 16])
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_mask_reorder(groups, tokens, kind):
    rng = np.random.default_rng(tokens * 7 + groups)
    mask = make_mask(kind, tokens, groups, rng)
    counts, order = _t(np.zeros(groups, np.int32)), _t(np.full((groups, tokens), -1, np.int32))
    used = _t(np.full(groups + 1, -1, np.int32))
    build_cpu(mask_reorder(groups, "llvm"))(_t(mask), counts, order, used)
    ref_counts, ref_order, ref_used = ref_mask_reorder(mask)
    np.testing.assert_array_equal(counts.numpy(), ref_counts)
    np.testing.assert_array_equal(order.numpy(), ref_order)
    np.testing.assert_array_equal(used.numpy(), ref_used)  # used groups, then the unused ones, then the count


def _run_mn(func, x, wg, wu, mask, n_out, dtype):
    counts, order, used = ref_mask_reorder(mask)
    out = _t(np.full((x.shape[0], n_out), np.nan, dtype))
    func(_t(x), _t(wg), _t(wu), _t(mask), _t(counts), _t(order), _t(used), out)
    return out.numpy()


@pytest.mark.parametrize("group_size", [1, 8, 32, 128])
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("swiglu", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemm_mn(group_size, layout, swiglu, dtype):
    groups, k_dim = max(1, 256 // group_size) if group_size < 128 else 2, 24
    n_out = groups * group_size
    func = build_cpu(gemm_mn(groups, group_size, k_dim, dtype, layout, swiglu, "llvm"))
    rng = np.random.default_rng(group_size)
    wshape = (n_out, k_dim) if layout == "nk" else (k_dim, n_out)
    for tokens in TOKENS:
        for kind in MASK_KINDS:
            x = rng.standard_normal((tokens, k_dim)).astype(dtype)
            wg = (rng.standard_normal(wshape) / np.sqrt(k_dim)).astype(dtype)
            wu = (rng.standard_normal(wshape) / np.sqrt(k_dim)).astype(dtype)
            mask = make_mask(kind, tokens, groups, rng)
            out = _run_mn(func, x, wg, wu, mask, n_out, dtype)
            ref = ref_gemm_mn(x, wg, wu, mask, group_size, layout, swiglu)
            assert rel_err(out, ref) < TOL[dtype], (tokens, kind)
            assert np.array_equal(out, _run_mn(func, x, wg, wu, mask, n_out, dtype))  # deterministic


def _run_k(func, a, w, mask, n_out, dtype):
    out = _t(np.full((a.shape[0], n_out), np.nan, dtype))
    counts, order, used = ref_mask_reorder(mask)
    func(_t(a), _t(w), _t(mask), _t(counts), _t(order), _t(used), out)
    return out.numpy()


@pytest.mark.parametrize("group_size", [1, 8, 32, 128])
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemm_k(group_size, layout, dtype):
    groups, n_out = max(1, 256 // group_size) if group_size < 128 else 2, 40
    k_dim = groups * group_size
    func = build_cpu(gemm_k(groups, group_size, n_out, dtype, layout, "llvm"))
    rng = np.random.default_rng(group_size + 1)
    for tokens in TOKENS:
        for kind in MASK_KINDS:
            a = rng.standard_normal((tokens, k_dim)).astype(dtype)
            w = (rng.standard_normal((n_out, k_dim) if layout == "nk" else (k_dim, n_out)) / np.sqrt(k_dim)).astype(dtype)
            mask = make_mask(kind, tokens, groups, rng)
            out = _run_k(func, a, w, mask, n_out, dtype)
            assert rel_err(out, ref_gemm_k(a, w, mask, group_size, layout)) < TOL[dtype], (tokens, kind)
            assert np.array_equal(out, _run_k(func, a, w, mask, n_out, dtype))  # deterministic


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("swiglu", [True, False])
def test_cpu_gemm_mn_register_tiles_over_k_chunks(swiglu, dtype, monkeypatch):
    """The CPU gemm_mn over [N, K] weights with register tiles of 1-8 tokens x 1-4 weight rows, K split in 4
    chunks (a small L1 budget): the partial sums kept between chunks, tails of a tile, groups no token runs; fp16 /
    bf16 chunks converted once where a group has more tokens than a tile, read in place where not."""
    from wide_tvm.schedules import cpu_gemm
    from wide_tvm.schedules.tiles import TileConfig

    monkeypatch.setattr(cpu_gemm, "L1_CHUNK_BYTES", 4 * 16)  # a K chunk of 16 (one vector) whatever the rows
    groups, gs, k_dim = 3, 8, 64
    rng = np.random.default_rng(11)
    wg, wu = ((rng.standard_normal((groups * gs, k_dim)) / 8).astype(dtype) for _ in range(2))
    for bm, bn in ((1, 1), (3, 2), (8, 4)):
        assert cpu_gemm._k_chunk(k_dim, 16, 2 * bn if swiglu else bn) == 16
        func = build_cpu(gemm_mn(groups, gs, k_dim, dtype, "nk", swiglu, "llvm", cpu_tile=TileConfig(bm, bn)))
        for tokens in TOKENS:
            for kind in MASK_KINDS:
                x = rng.standard_normal((tokens, k_dim)).astype(dtype)
                mask = make_mask(kind, tokens, groups, rng)
                out = _run_mn(func, x, wg, wu, mask, groups * gs, dtype)
                ref = ref_gemm_mn(*(v.astype("float32") for v in (x, wg, wu)), mask, gs, "nk", swiglu)
                assert rel_err(out.astype("float32"), ref) < TOL[dtype], (bm, bn, tokens, kind)
                assert np.array_equal(out, _run_mn(func, x, wg, wu, mask, groups * gs, dtype))


@pytest.mark.parametrize("layout,dtype", [("kn", "float32"), ("kp", "float32"), ("kp", "float16"),
                                          ("kp", "bfloat16")])
def test_cpu_gemm_k_register_tiles(layout, dtype):
    """The CPU gemm_k over [K, N] weights (a group's block copied to a contiguous buffer) or over panels of 16
    columns ("kp", read in place; fp16 / bf16 panels converted once where a group has more tokens than a tile) with
    register tiles of 1-8 tokens x 16-64 columns (tile tails repeating the last token): every mask kind, odd token
    counts."""
    from wide_tvm.schedules.tiles import TileConfig
    from wide_tvm.weight_layout import pack

    groups, gs, n_out = 5, 16, 64
    rng = np.random.default_rng(12)
    w = (rng.standard_normal((groups * gs, n_out)) / 8).astype(dtype)
    stored = w if layout == "kn" else pack(w.T, "kp")
    for bm, bn in ((1, 64), (3, 16), (8, 32)):
        func = build_cpu(gemm_k(groups, gs, n_out, dtype, layout, "llvm", cpu_tile=TileConfig(bm, bn)))
        for tokens in TOKENS:
            for kind in MASK_KINDS:
                a = rng.standard_normal((tokens, groups * gs)).astype(dtype)
                mask = make_mask(kind, tokens, groups, rng)
                out = _run_k(func, a, stored, mask, n_out, dtype)
                ref = ref_gemm_k(a.astype("float32"), w.astype("float32"), mask, gs, "kn")
                assert rel_err(out.astype("float32"), ref) < TOL[dtype], (bm, bn, tokens, kind)
                assert np.array_equal(out, _run_k(func, a, stored, mask, n_out, dtype))


def test_kp_panels_need_whole_panels_and_the_cpu():
    """A "kp" kernel's tile width must be whole 16-column panels, and only the CPU kernels read panels; the default
    tile over an N with panels is whole panels (N = 48: 16, not 24)."""
    from wide_tvm.schedules.tiles import TileConfig, cpu_default_tile

    with pytest.raises(ValueError, match="multiple of the 16-column weight panels"):
        gemm_k(4, 16, 48, "float32", "kp", "llvm", cpu_tile=TileConfig(2, 24))
    with pytest.raises(ValueError, match="CPU kernels only"):
        gemm_k(4, 16, 48, "float16", "kp", "cuda")
    assert cpu_default_tile(False, 48).bn == 16 and cpu_default_tile(False, 40).bn == 20
    gemm_k(4, 16, 48, "float32", "kp", "llvm")  # builds with its default tile


def test_roofline_counts_the_weights_dtype():
    """The benchmarks' roofline reads the used groups' weights at their dtype's size (fp16 on the GPU, fp32 on the
    CPU), or is the active FLOPs at the measured throughput, whichever is longer."""
    from wide_tvm.bench.measure import roofline_us
    from wide_tvm.bench.workloads import Workload

    mask = np.zeros((2, 4), np.int32)
    mask[0, 1] = mask[1, 3] = 1  # 2 of 4 groups used
    slow_memory = {"bandwidth_gbs": 1.0, "tensor_tflops": 1e6}
    for dtype, size in (("float16", 2), ("float32", 4)):
        w = Workload("k", "gemm_k", 4, 8, 16, dtype=dtype)  # K = 32, N = 16
        assert roofline_us(w, 2, mask, slow_memory) == pytest.approx((2 * 8 * 16 + 2 * (32 + 16)) * size / 1e3)
    slow_math = {"bandwidth_gbs": 1e9, "tensor_tflops": 1e-6}
    assert roofline_us(Workload("k", "gemm_k", 4, 8, 16, dtype="float32"), 2, mask, slow_math) == \
        pytest.approx(2 * 2 * 8 * 16 / 1e-6 * 1e-6)


def test_gemm_k_never_touches_skipped_work():
    """NaN in every skipped activation and in the weights of a group no token uses: output stays finite."""
    groups, gs, n_out, tokens = 4, 8, 16, 13
    rng = np.random.default_rng(5)
    mask = make_mask("random", tokens, groups, rng)
    mask[:, 2] = 0
    a = rng.standard_normal((tokens, groups * gs)).astype("float32")
    a[np.repeat(mask, gs, axis=1) == 0] = np.nan
    w = rng.standard_normal((groups * gs, n_out)).astype("float32")
    w[2 * gs:3 * gs] = np.nan
    out = _run_k(build_cpu(gemm_k(groups, gs, n_out, "float32", "kn", "llvm")), a, w, mask, n_out, "float32")
    assert np.all(np.isfinite(out))
    assert rel_err(out, ref_gemm_k(np.nan_to_num(a), np.nan_to_num(w), mask, gs, "kn")) < 1e-5


def test_gemm_mn_never_touches_skipped_work():
    """NaN in the weights of a group no token uses and in tokens active nowhere: output is exact zeros there."""
    groups, gs, k_dim, tokens = 3, 8, 16, 11
    rng = np.random.default_rng(6)
    mask = make_mask("random", tokens, groups, rng)
    mask[:, 1] = 0
    mask[4, :] = 0
    x = rng.standard_normal((tokens, k_dim)).astype("float32")
    x[4] = np.nan
    wg = rng.standard_normal((groups * gs, k_dim)).astype("float32")
    wu = rng.standard_normal((groups * gs, k_dim)).astype("float32")
    wg[gs:2 * gs] = np.nan
    out = _run_mn(build_cpu(gemm_mn(groups, gs, k_dim, "float32", "nk", True, "llvm")), x, wg, wu, mask,
                  groups * gs, "float32")
    assert np.all(np.isfinite(out))
    assert np.all(out[:, gs:2 * gs] == 0) and np.all(out[4] == 0)


@pytest.mark.parametrize("kind,swiglu", [("gemm_mn", True), ("gemm_mn", False), ("gemm_k", False)])
def test_benchmark_torch_reference_matches_numpy(kind, swiglu):
    """The benchmark's and tools/stress_bench_kernel.py's torch reference (W as [n * weights, k], gate rows first)
    agrees with the NumPy references the kernel tests use, on random inputs and masks (odd token count, one
    all-skipped token, one all-active)."""
    import torch

    from wide_tvm.bench.measure import torch_reference
    from wide_tvm.bench.workloads import Workload

    rng = np.random.default_rng(7)
    w = Workload("w", kind, 3, 8, 16, swiglu=swiglu)
    x = rng.standard_normal((7, w.k)).astype(np.float32)
    wcat = rng.standard_normal((w.n * w.weights, w.k)).astype(np.float32)
    mask = make_mask("random", 7, 3, rng, 0.5)
    mask[0], mask[1] = 0, 1
    got = torch_reference(w, torch.from_numpy(x), torch.from_numpy(wcat), torch.from_numpy(mask)).numpy()
    if kind == "gemm_mn":
        ref = ref_gemm_mn(x, wcat[:w.n], wcat[w.n:] if swiglu else None, mask, w.group_size, "nk", swiglu)
    else:
        ref = ref_gemm_k(x, wcat, mask, w.group_size, "nk")
    assert rel_err(got, ref) < 1e-5
    if kind == "gemm_mn":
        assert not got[0].any()  # a token that skips every group: zeros


def test_stress_tool_reports_a_run_that_dies(tmp_path):
    """tools/stress_bench_kernel.py runs each (tokens, mask) in a child process and turns a child that dies (here:
    a folder without a benchmark build) into a failed run with its error, in its JSON and exit status."""
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "tools", "stress_bench_kernel.py")
    spec = importlib.util.spec_from_file_location("stress_bench_kernel", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "stress.json"
    assert tool.main([str(tmp_path), "o_proj_h4", "--tokens", "9", "--masks", "random", "--calls", "1",
                      "--json", str(out)]) == 1
    (run,) = json.loads(out.read_text())["runs"]
    assert run["tokens"] == 9 and "bench.json" in run["crashed"] and "exit status 1" in run["crashed"]
