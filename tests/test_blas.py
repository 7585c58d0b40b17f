"""Dense matmuls go to the vendor BLAS linked into the library (wide_tvm/blas/, passes/blas_dispatch.py): OpenBLAS on
the CPU (run and checked here), cuBLASLt on CUDA (built and linked here; run on the GPU host by
tools/gpu_check.py and wide-bench dense-run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import wide_tvm
from wide_tvm.blas.extern import extern_for
from wide_tvm.blas.libraries import load as load_blas
from wide_tvm.errors import WideError
from wide_tvm.frontends.export import export_model
from wide_tvm.model import WideConfig, build_example, example_inputs
from wide_tvm.passes import DispatchDenseMatmuls, LowerGatedLayers, wide_pipeline
from wide_tvm.targets import parse_target

from conftest import assert_matches_model, module_sources


def _needed(lib: str) -> list[str]:
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _forms_module(dtype: str) -> tuple[tvm.IRModule, dict]:
    """One Relax function per matmul form of blas_dispatch's table, plus two it must leave to TVM; token count t
    symbolic. Returns the module and, per function, (whether it is dispatched, a NumPy reference of it)."""
    bb = relax.BlockBuilder()
    forms = {}

    def fn(name, params, body, dispatched, ref):
        with bb.function(name, params):
            with bb.dataflow():
                out = bb.emit_output(body(*params))
            bb.emit_func_output(out)
        forms[name] = (dispatched, ref)

    t = tvm.tirx.Var("t", "int64")
    var = lambda name, *shape: relax.Var(name, relax.TensorType(list(shape), dtype))  # noqa: E731
    mm, perm = relax.op.matmul, relax.op.permute_dims
    fn("linear_nt", [var("x", t, 24), var("w", 40, 24)], lambda x, w: mm(x, perm(w)), True, lambda x, w: x @ w.T)
    fn("linear_nn", [var("x", 1, t, 24), var("w", 24, 40)], mm, True, lambda x, w: x @ w)
    # big enough at 33 tokens for the CPU extern to split the work over threads: by column blocks (1000 is no
    # multiple of the 16-column block), by rows, by batch entry
    fn("linear_wide", [var("x", t, 72), var("w", 1000, 72)], lambda x, w: mm(x, perm(w)), True, lambda x, w: x @ w.T)
    fn("linear_narrow", [var("x", t, 512), var("w", 512, 8)], mm, True, lambda x, w: x @ w)
    fn("scores", [var("q", 2, 3, t, 64), var("k", 2, 3, t, 64)], lambda q, k: mm(q, perm(k, [0, 1, 3, 2])), True,
       lambda q, k: q @ np.swapaxes(k, -1, -2))
    fn("values", [var("p", 2, 3, t, t), var("v", 2, 3, t, 8)], mm, True, lambda p, v: p @ v)
    fn("broadcast_batch", [var("x", 2, t, 8), var("w", 1, 8, 5)], mm, False, lambda x, w: x @ w)
    fn("permuted_batch", [var("x", 2, t, 8), var("w", 8, 2, 5)], lambda x, w: mm(x, perm(w, [1, 0, 2])), False,
       lambda x, w: x @ np.transpose(w, (1, 0, 2)))
    return bb.get(), forms


def _shape_of(param, t: int) -> list[int]:
    return [t if not isinstance(d, tvm.tirx.IntImm) else int(d) for d in param.ty.shape.values]


@pytest.mark.parametrize("dtype,tokens", [("float32", 1), ("float32", 7), ("float32", 33), ("float16", 1),
                                          ("float16", 33), ("bfloat16", 33)])
def test_every_dispatched_form_matches_numpy_on_the_cpu(tmp_path, dtype, tokens):
    """fp16 / bf16 go to OpenBLAS too, widened to fp32 (no unscheduled TVM matmul is left for them): the result is
    the float64 product of the same inputs, rounded once to the dtype."""
    import ml_dtypes  # noqa: F401  (numpy learns bfloat16)

    mod, forms = _forms_module(dtype)
    tgt = parse_target("llvm")
    extern = extern_for("llvm")
    dispatch = DispatchDenseMatmuls("llvm", extern)
    with tgt:
        ex = tvm.compile(mod, tgt, relax_pipeline=wide_pipeline(tgt, LowerGatedLayers("llvm", enabled=False), None,
                                                                 dispatch))
    assert len(dispatch.dispatched) == sum(d for d, _ in forms.values())
    lib = str(tmp_path / "forms.so")
    ex.export_library(lib, options=extern.link_options())
    assert "libscipy_openblas.so" in _needed(lib)
    load_blas(["openblas"])  # as wide_tvm.load does: the library names it without a path
    vm = relax.VirtualMachine(tvm.runtime.load_module(lib), tvm.cpu())
    rng = np.random.default_rng(tokens)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]  # (the output's rounding, and fp32 sums)
    for name, (dispatched, ref) in forms.items():
        args = [rng.standard_normal(_shape_of(p, tokens)).astype(dtype) for p in mod[name].params]
        out = vm[name](*[tvm.runtime.tensor(a) for a in args]).numpy().astype(np.float64)
        want = ref(*[a.astype(np.float64) for a in args])
        assert np.abs(out - want).max() <= tol * max(1.0, np.abs(want).max()), name
        assert np.array_equal(out, vm[name](*[tvm.runtime.tensor(a) for a in args]).numpy().astype(np.float64)), name


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_half_precision_rounds_as_numpy(tmp_path, dtype):
    """An outer product (K = 1: each fp32 product exact) rounded to fp16 / bf16 by the extern equals NumPy's
    round-to-nearest-even, over normal, subnormal, overflowing, infinite and NaN values."""
    import ml_dtypes  # noqa: F401

    bb = relax.BlockBuilder()
    x, w = (relax.Var(name, relax.TensorType(shape, dtype)) for name, shape in (("x", [64, 1]), ("w", [96, 1])))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.op.permute_dims(w)))
        bb.emit_func_output(out)
    tgt, extern = parse_target("llvm"), extern_for("llvm")
    with tgt:
        ex = tvm.compile(bb.get(), tgt, relax_pipeline=wide_pipeline(tgt, LowerGatedLayers("llvm", enabled=False),
                                                                     None, DispatchDenseMatmuls("llvm", extern)))
    ex.export_library(str(tmp_path / "outer.so"), options=extern.link_options())
    load_blas(["openblas"])
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "outer.so")), tvm.cpu())
    rng = np.random.default_rng(0)
    xs = (rng.standard_normal((64, 1)) * 2.0 ** rng.integers(-20, 12, (64, 1))).astype(np.float32)
    xs[:4, 0] = [np.inf, -np.inf, np.nan, 0.0]
    ws = (rng.standard_normal((96, 1)) * 2.0 ** rng.integers(-16, 10, (96, 1))).astype(np.float32)
    xs, ws = xs.astype(dtype), ws.astype(dtype)
    got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ws)).numpy()
    want = (xs.astype(np.float32) @ ws.astype(np.float32).T).astype(dtype)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got.astype(np.float32))
                                                          & np.isnan(want.astype(np.float32)))
    assert same.all(), (got[~same][:5], want[~same][:5])


def test_cpu_model_runs_its_dense_matmuls_on_openblas(exported, tmp_path):
    path, model, cfg = exported("default", "onnx")
    compiled = wide_tvm.compile(path, "llvm")
    assert compiled.blas_matmuls and {m.dtype for m in compiled.blas_matmuls} == {"float32"}
    assert not re.search(r"define [^\n]*matmul", module_sources(compiled.executable))  # no TVM matmul kernel is left
    lib = compiled.export(str(tmp_path / "m.so"))
    assert "libscipy_openblas.so" in _needed(lib)
    runner = wide_tvm.load(lib)
    assert runner.meta["blas"] == ["openblas"] and len(runner.meta["blas_matmuls"]) == len(compiled.blas_matmuls)
    assert_matches_model(runner, model, cfg)


def test_no_blas_leaves_matmuls_to_tvm(exported, tmp_path):
    from wide_tvm.cli import compile_main

    path, _, _ = exported("dense", "onnx")
    assert compile_main([path, "--no-blas", "-o", str(tmp_path / "plain.so")]) == 0
    assert "libscipy_openblas.so" not in _needed(str(tmp_path / "plain.so"))
    assert wide_tvm.load(str(tmp_path / "plain.so")).meta["blas"] == []


def test_a_missing_blas_wheel_is_one_clear_error(exported, tmp_path, monkeypatch):
    path, _, cfg = exported("dense", "onnx")
    lib = wide_tvm.compile(path, "llvm").export(str(tmp_path / "m.so"))
    np.savez(tmp_path / "in.npz", input_ids=example_inputs(cfg, 3).numpy())
    env = dict(os.environ, WIDE_TVM_OPENBLAS=str(tmp_path / "nowhere" / "libscipy_openblas.so"))
    code = f"import sys; from wide_tvm.cli import run_main; sys.exit(run_main([{lib!r}, '--inputs', {str(tmp_path / 'in.npz')!r}]))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().count("\n") == 0 and "scipy-openblas32" in run.stderr, run.stderr
    monkeypatch.setenv("WIDE_TVM_OPENBLAS", str(tmp_path / "nowhere" / "libscipy_openblas.so"))
    with pytest.raises(WideError, match="scipy-openblas32"):
        wide_tvm.compile(path, "llvm")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_model_links_cublaslt_and_has_no_tvm_matmul(tmp_path):
    """Also the gated kernels' dense fallbacks (every count here): their host code calls cuBLASLt through the
    module's one helper, and the fallbacks keep the stored [N, K] weights beside the tensor-core tiles. (The default
    suite's sample: tests/test_cuda_build.py builds a CUDA model with its fallbacks from the cost model, and
    tests/test_fallback.py the CUDA dense paths; the benchmark's kernels with their fallbacks are built in the slow suite.)"""
    cfg = WideConfig()
    path = str(tmp_path / "fp16.onnx")
    export_model(build_example(cfg).half(), example_inputs(cfg), path)
    compiled = wide_tvm.compile(path, "cuda", fallback="always")
    assert set(compiled.fallbacks) == {s.symbol for layer in compiled.layers for s in layer.specs}
    names = compiled.model.weight_names
    assert [n for n in names if n.endswith(".tc")] and all(n[:-3] in names for n in names if n.endswith(".tc"))
    assert compiled.blas_matmuls and {m.dtype for m in compiled.blas_matmuls} == {"float16"}
    assert any(m.batched for m in compiled.blas_matmuls)  # attention's scores and values too
    kernels = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(',
                         module_sources(compiled.executable))
    assert kernels and not [k for k in kernels if "matmul" in k]
    lib = compiled.export(str(tmp_path / "m.so"))
    assert "libcublasLt.so.13" in _needed(lib)
    symbols = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    assert "__tvm_ffi_wide_cublaslt_matmul" in symbols and "__tvm_ffi_wide_fallback_blas" in symbols


@pytest.mark.parametrize("causal,kv_extra,bias", [(None, 0, False), ("TopLeft", 0, False), ("BottomRight", 3, False),
                                                  (None, 2, True)])
def test_attention_is_written_out_for_blas_and_means_the_same(tmp_path, causal, kv_extra, bias):
    """R.nn.attention (torch SDPA's import) decomposed into BLAS-dispatched matmuls equals TVM's own legalization.
    Query and key lengths differ only in static shapes (TVM's own legalization fails on symbolic ones that do)."""
    from wide_tvm.passes.attention_matmuls import DecomposeAttention

    s = tvm.tirx.Var("s", "int64") if kv_extra == 0 else 4
    s_kv = s if kv_extra == 0 else 4 + kv_extra
    ty = lambda *shape: relax.TensorType(list(shape), "float32")  # noqa: E731
    params = [relax.Var("q", ty(1, s, 3, 8)), relax.Var("k", ty(1, s_kv, 3, 8)), relax.Var("v", ty(1, s_kv, 3, 5))]
    if bias:
        params.append(relax.Var("bias", ty(1, 3, s, s_kv)))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            call = (relax.op.nn.attention(*params[:3], params[3] if bias else None, causal_mask=causal))
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    mod = bb.get()
    tgt = parse_target("llvm")
    extern = extern_for("llvm")
    decompose, dispatch = DecomposeAttention(), DispatchDenseMatmuls("llvm", extern)
    with tgt:
        plain = tvm.compile(mod, tgt, relax_pipeline=wide_pipeline(tgt, LowerGatedLayers("llvm", enabled=False)))
        ex = tvm.compile(mod, tgt, relax_pipeline=tvm.transform.Sequential(
            [decompose, wide_pipeline(tgt, LowerGatedLayers("llvm", enabled=False), None, dispatch)]))
    assert decompose.count == 1 and len(dispatch.dispatched) == 2  # scores and values
    lib = str(tmp_path / "att.so")
    ex.export_library(lib, options=extern.link_options())
    load_blas(["openblas"])
    ours, ref = (relax.VirtualMachine(m, tvm.cpu()) for m in (tvm.runtime.load_module(lib), plain.jit()))
    rng = np.random.default_rng(5)
    for tokens in (1, 6) if kv_extra == 0 else (4,):
        args = [rng.standard_normal(_shape_of(p, tokens)).astype("float32") for p in params]
        got = ours["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
        want = ref["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
