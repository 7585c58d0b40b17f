"""ONNX and torch.export models compiled for the CPU, run through the TVM runtime, against PyTorch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import wide_tvm
from wide_tvm.compiler import NoGatedLayersWarning
from wide_tvm.model import example_inputs
from wide_tvm.weight_layout import pack

from conftest import module_sources

TOKENS = [1, 7, 33]


def _compile_and_load(path, tmp_path, **kw):
    compiled = wide_tvm.compile(path, "llvm", **kw)
    lib = str(tmp_path / (os.path.basename(path).replace(".", "_") + ".so"))
    compiled.export(lib)
    return compiled, wide_tvm.load(lib), lib


@pytest.mark.parametrize("cfg_name,fmt", [("default", "onnx"), ("groups_1_16", "pt2"), ("partial", "onnx"),
                                          pytest.param("default", "pt2", marks=pytest.mark.slow),
                                          pytest.param("groups_1_16", "onnx", marks=pytest.mark.slow),
                                          pytest.param("partial", "pt2", marks=pytest.mark.slow)])
def test_matches_pytorch(exported, tmp_path, fmt, cfg_name):
    path, model, cfg = exported(cfg_name, fmt)
    compiled, runner, _ = _compile_and_load(path, tmp_path)
    n_gated = sum(cfg.is_gated(i) for i in range(cfg.num_layers))
    assert sum(layer.kind == "ffn" for layer in compiled.layers) == n_gated
    assert sum(layer.kind == "attention" for layer in compiled.layers) == n_gated
    # each gated attention's query projection runs as gemm_mn over the attention's head groups
    assert all(layer.kernels[-1].startswith(f"wide_gemm_mn_g{layer.groups}x{layer.group_size}_")
               for layer in compiled.layers if layer.kind == "attention")
    for t in TOKENS:
        x = example_inputs(cfg, t, seed=t)
        with torch.no_grad():
            ref = model(x).numpy()
        out = runner(x.numpy())
        assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5
        assert np.array_equal(out, runner(x.numpy()))  # deterministic run to run


def test_group_structure_reported(exported, tmp_path):
    path, _, cfg = exported("default", "pt2")
    compiled = wide_tvm.compile(path, "llvm")
    ffn = [layer for layer in compiled.layers if layer.kind == "ffn"]
    attn = [layer for layer in compiled.layers if layer.kind == "attention"]
    assert {(layer.groups, layer.group_size) for layer in ffn} == {(cfg.ffn_groups, cfg.ffn_group_size)}
    assert {(layer.groups, layer.group_size) for layer in attn} == {(cfg.attn_groups, cfg.attn_group_size * cfg.head_dim)}
    assert any(k.startswith("wide_mask_reorder") for k in ffn[0].kernels)
    assert "p_layers_0_mlp_down_proj_weight" in ffn[0].weights
    assert "gated FFN layers lowered: 2" in compiled.summary()


def test_dense_model_compiles_with_warning(exported, tmp_path):
    path, model, cfg = exported("dense", "onnx")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled, runner, _ = _compile_and_load(path, tmp_path)
    assert compiled.layers == []
    assert any(issubclass(w.category, NoGatedLayersWarning) for w in caught)
    x = example_inputs(cfg, 5)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(runner(x.numpy()) - ref).max() / np.abs(ref).max() < 1e-5


def test_cpu_down_weights_without_whole_panels_are_stored_transposed(tmp_path):
    """A hidden size that is no multiple of 16 cannot be cut into panels: gemm_k then reads plain [K, N]."""
    from wide_tvm.frontends.export import export_model
    from wide_tvm.model import WideConfig, build_example

    cfg = WideConfig(hidden_size=40, num_layers=1)
    model = build_example(cfg)
    path = str(tmp_path / "h40.onnx")
    export_model(model, example_inputs(cfg), path)
    cpu = wide_tvm.compile(path, "llvm")
    downs = [layer for layer in cpu.layers if layer.kind == "ffn"]
    assert downs and all(layer.kernels[-1].endswith("_kn") for layer in downs)
    stored = dict(zip(cpu.model.weight_names, cpu.model.weights))[downs[0].weights[-1]]
    assert stored.shape == (cfg.intermediate_size, cfg.hidden_size)
    runner = wide_tvm.load(cpu.export(str(tmp_path / "m.so")))
    x = example_inputs(cfg, 7, seed=5)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(runner(x.numpy()) - ref).max() / np.abs(ref).max() < 1e-5


def test_torch_tensors_through_dlpack(exported, tmp_path):
    path, model, cfg = exported("default", "pt2")
    _, runner, _ = _compile_and_load(path, tmp_path)
    x = example_inputs(cfg, 4)
    out = runner(x)
    assert isinstance(out, torch.Tensor)
    with torch.no_grad():
        assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-5)


def test_exported_program_in_memory(exported, tmp_path):
    from wide_tvm.frontends.export import export_program

    _, model, cfg = exported("default", "pt2")
    compiled = wide_tvm.compile(export_program(model, example_inputs(cfg, 6)), "llvm")
    assert len(compiled.layers) == 2 * cfg.num_layers


def test_runtime_only_load(exported, tmp_path):
    """wide-compile in a process of its own prints its summary and nothing on stderr (no TVM C++ warnings, no torch
    log lines); `wide_tvm.load` of the library with TVM in runtime-only mode (no compiler library) in a fresh process."""
    path, model, cfg = exported("default", "onnx")
    lib = str(tmp_path / "m.so")
    proc = subprocess.run([sys.executable, "-c", "import sys; from wide_tvm.cli import compile_main; "
                           "sys.exit(compile_main(sys.argv[1:]))", path, "-o", lib],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "gated FFN layers lowered: 2" in proc.stdout
    x = example_inputs(cfg, 9)
    np.save(tmp_path / "x.npy", x.numpy())
    code = ("import sys, numpy as np, wide_tvm; m = wide_tvm.load(sys.argv[1]); "
            "np.save(sys.argv[3], m(np.load(sys.argv[2]))); import tvm, os; "
            "assert 'tvm.relax' not in sys.modules")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    subprocess.run([sys.executable, "-c", code, lib, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                   check=True, env=env, timeout=300)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(np.load(tmp_path / "y.npy") - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.slow
def test_cpu_down_weights_are_stored_in_panels(exported, tmp_path):
    """On the CPU gemm_k reads W^T [K, N] in panels of 16 columns ("kp": a group's slice of a panel is contiguous):
    the compiler repacks the stored array once; CUDA keeps fp32 weights as [N, K] rows for its SIMT kernels (fp16
    ones become tensor-core tiles, tests/test_weight_layout.py). Results are unchanged."""
    path, model, cfg = exported("default", "pt2")
    cpu = wide_tvm.compile(path, "llvm")
    downs = [layer for layer in cpu.layers if layer.kind == "ffn"]
    assert all(layer.kernels[-1].endswith("_kp") for layer in downs)
    name = downs[0].weights[-1]
    stored = dict(zip(cpu.model.weight_names, cpu.model.weights))[name]
    assert stored.shape == (cfg.hidden_size // 16, cfg.intermediate_size, 16)
    np.testing.assert_array_equal(stored, pack(model.layers[0].mlp.down_proj.weight.detach().numpy(), "kp"))
    if shutil.which("nvcc"):
        gpu = wide_tvm.compile(path, "cuda")
        # (where the cost model gives the down projection a dense fallback, its kernel name says so)
        assert all(layer.kernels[-1].split("_dense")[0].endswith("_nk") for layer in gpu.layers
                   if layer.kind == "ffn")
    runner = wide_tvm.load(cpu.export(str(tmp_path / "m.so")))
    x = example_inputs(cfg, 11, seed=4)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(runner(x.numpy()) - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("dtype,tol,fmt", [("float16", 5e-3, "onnx"), ("bfloat16", 3e-2, "pt2"),
                                           pytest.param("float16", 5e-3, "pt2", marks=pytest.mark.slow),
                                           pytest.param("bfloat16", 3e-2, "onnx", marks=pytest.mark.slow)])
def test_fp16_and_bf16_models_match_pytorch_in_their_dtype(tmp_path, fmt, dtype, tol):
    """A WIDE model in fp16 / bf16 (as trained checkpoints ship), through ONNX and torch.export: its gated layers
    lowered to the fp16 / bf16 CPU kernels (fp32 accumulation), the output within the dtype's rounding of the same
    model run by PyTorch in that dtype, deterministic. torch.export's products stay in the model's dtype
    (frontends.torch_import.SAME_DTYPE_PRODUCTS), a bf16 router's argmax compiles (passes.legalize), and bf16 weights
    survive the .weights.npz (artifact.save_weights)."""
    from wide_tvm.frontends.export import export_model
    from wide_tvm.model import WideConfig, build_example

    cfg = WideConfig()
    model = build_example(cfg, seed=3).to(getattr(torch, dtype))
    path = str(tmp_path / f"m.{fmt}")
    export_model(model, example_inputs(cfg, 6), path)
    compiled, runner, _ = _compile_and_load(path, tmp_path)
    # every FFN as gate/up + SwiGLU and down (torch.export writes a half-precision silu as fp32 math between casts)
    assert [layer.kind for layer in compiled.layers].count("ffn") == cfg.num_layers
    assert len(compiled.layers) == 2 * cfg.num_layers
    assert all(k.endswith(("_nk", "_kp")) and dtype in k for layer in compiled.layers for k in layer.kernels
               if "gemm" in k)
    # its dense matmuls in the model's dtype on OpenBLAS (widened to fp32), none left to TVM's unscheduled loops
    assert dtype in {m.dtype for m in compiled.blas_matmuls}
    assert not re.search(r"define [^\n]*matmul", module_sources(compiled.executable))
    for t in (1, 7, 33):
        x = example_inputs(cfg, t, seed=t)
        with torch.no_grad():
            ref = model(x).float().numpy()
        out = runner(x.numpy())
        assert str(out.dtype) == dtype
        err = np.abs(out.astype("float32") - ref).max() / np.abs(ref).max()
        assert err < tol, (t, err)
        assert np.array_equal(out, runner(x.numpy()))


def test_half_precision_reductions_accumulate_in_fp32():
    """RMSNorm's mean of squares over 4096 fp16 values passes fp16's 65504 once the mean square passes 16: summed in
    fp16 it was inf (an fp16 Llama-3.1-8B's logits all zero on the H100), PyTorch sums in fp32; so do we
    (passes/legalize.py), for sum and mean, fp16 and bf16: the mean of squares that overflowed, and a sum that fits
    but that fp16 steps could not resolve."""
    import tvm
    from tvm import relax

    from wide_tvm.passes.legalize import WIDE_LEGALIZATIONS

    rng = np.random.default_rng(4)
    for dtype in ("float16", "bfloat16"):
        bb = relax.BlockBuilder()
        big = relax.Var("big", relax.TensorType([3, 4096], dtype))
        small = relax.Var("small", relax.TensorType([3, 4096], dtype))
        with bb.function("main", [big, small]):
            with bb.dataflow():
                out = bb.emit_output(relax.Tuple([
                    bb.emit(relax.op.mean(bb.emit(relax.op.multiply(big, big)), axis=[-1], keepdims=True)),
                    bb.emit(relax.op.sum(small, axis=[-1]))]))
            bb.emit_func_output(out)
        mod = relax.transform.LegalizeOps(customize_legalize_map=WIDE_LEGALIZATIONS)(bb.get())
        vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        x = torch.from_numpy(rng.standard_normal((3, 4096)) * 6).to(getattr(torch, dtype))
        y = torch.from_numpy(rng.random((3, 4096))).to(getattr(torch, dtype))
        mean, total = vm["main"](tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y))
        want_mean = (x * x).float().mean(-1, keepdim=True)  # (the squares rounded to the dtype, as the graph's are)
        assert torch.allclose(torch.from_dlpack(mean).float(), want_mean, rtol=1e-2), dtype
        assert torch.allclose(torch.from_dlpack(total).float(), y.float().sum(-1), rtol=4e-3), dtype
