"""Tensor-core tile layout ("tc"): where every weight element lands, its inverse, and the compiler using it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import wide_tvm
from wide_tvm.model import example_inputs
from wide_tvm.passes.lower_gated import _original_from
from wide_tvm.weight_layout import pack, stored_shape, unpack


def test_tc_puts_each_lane_vector_where_the_kernel_reads_it():
    """Lane 4g + q of chunk c, half h reads W[16r + 8h + g, 32c + 8q : +8] at ((c * 2 + h) * 32 + lane) * 8."""
    n, k = 48, 96
    w = np.arange(n * k, dtype=np.int64).reshape(n, k)
    p = pack(w, "tc")
    assert p.shape == stored_shape("tc", n, k) == (n // 16, 16 * k)
    for r in range(n // 16):
        for c in range(k // 32):
            for h in range(2):
                for lane in range(32):
                    g, q = divmod(lane, 4)
                    start = ((c * 2 + h) * 32 + lane) * 8
                    np.testing.assert_array_equal(p[r, start:start + 8], w[16 * r + 8 * h + g, 32 * c + 8 * q:32 * c + 8 * q + 8])


@pytest.mark.parametrize("layout", ["nk", "kn", "tc", "kp"])
def test_pack_round_trips_in_numpy_and_torch(layout):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 160)).astype(np.float16)
    p = pack(w, layout)
    np.testing.assert_array_equal(unpack(p, layout, 64, 160), w)
    pt = pack(torch.from_numpy(w), layout)  # the GPU benchmark packs torch tensors
    assert pt.is_contiguous()
    np.testing.assert_array_equal(pt.numpy(), p)


def test_kp_panels_hold_16_columns_of_w_transposed():
    """Panel p of "kp" is W^T[:, 16p : 16p + 16]: a group's K-slice of one panel is one contiguous run."""
    n, k = 48, 40
    w = np.arange(n * k, dtype=np.int64).reshape(n, k)
    p = pack(w, "kp")
    assert p.shape == stored_shape("kp", n, k) == (n // 16, k, 16)
    for panel in range(n // 16):
        np.testing.assert_array_equal(p[panel], w.T[:, 16 * panel:16 * panel + 16])


def test_pack_rejects_shapes_without_whole_tiles():
    with pytest.raises(ValueError, match="cannot be tiled"):
        pack(np.zeros((24, 64), np.float16), "tc")
    with pytest.raises(ValueError, match="panels of 16 columns"):
        pack(np.zeros((24, 64), np.float32), "kp")
    with pytest.raises(ValueError, match="unknown weight layout"):
        pack(np.zeros((16, 32), np.float16), "rows")


@pytest.mark.parametrize("src", ["nk", "kn"])
@pytest.mark.parametrize("have", ["tc", "kn", "kp"])
def test_relax_inverse_restores_the_source_layout(src, have):
    """Other uses of a repacked parameter read it back through `_original_from` (a reshape/permute chain)."""
    if src == "kn" and have == "kn":
        pytest.skip("a [K, N] source is never repacked to [K, N]")
    n, k = 32, 64
    w_nk = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
    stored = pack(w_nk, have)
    bb = relax.BlockBuilder()
    p = relax.Var("p", relax.TensorType(list(stored.shape), "float32"))
    with bb.function("main", [p]):
        out = bb.emit(_original_from(p, src, have, n, k))
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(stored))).numpy()
    np.testing.assert_array_equal(got, w_nk if src == "nk" else w_nk.T)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_fp16_model_stores_tensor_core_tiles_for_cuda(tmp_path):
    """fp16 gate/up/down weights are repacked into tiles once, at compile time; fp32 ones stay [N, K]."""
    from wide_tvm.frontends.export import export_model
    from wide_tvm.model import WideConfig, build_example

    cfg = WideConfig()
    model = build_example(cfg).half()
    path = str(tmp_path / "m16.onnx")
    export_model(model, example_inputs(cfg), path)
    compiled = wide_tvm.compile(path, "cuda", fallback="off")  # (with the dense fallback: both forms, tests/test_fallback.py)
    stored = dict(zip(compiled.model.weight_names, compiled.model.weights))
    ffn = [layer for layer in compiled.layers if layer.kind == "ffn"]
    # gate/up and down read tiles, and their reorder runs nothing up to 32 tokens (gate/up's direct kernels read
    # the mask themselves, and down's kernels at every count)
    assert ffn and all(layer.kernels[0].endswith("_d32") and all(k.endswith("_tc") for k in layer.kernels[1:])
                       for layer in ffn)
    # the attention output projection's reorder runs nothing at any token count: gemm_k reads the mask itself
    attn = [layer for layer in compiled.layers if layer.kind == "attention"]
    assert {layer.kernels[0] for layer in attn} == {f"wide_mask_reorder_g{cfg.attn_groups}_unread"}
    # the query projection reads tiles too, and its reorder runs nothing up to its direct kernels' bound at least
    assert all(layer.kernels[-1].endswith("_tc") and "_d" in layer.kernels[-2] for layer in attn)
    q = stored[attn[0].weights[-1]]
    assert q.shape == (cfg.num_heads * cfg.head_dim // 16, 16 * cfg.hidden_size)
    gate = stored[ffn[0].weights[0]]
    assert gate.shape == (cfg.intermediate_size // 16, 16 * cfg.hidden_size) and gate.dtype == np.float16
    down = stored[ffn[0].weights[-1]]
    assert down.shape == (cfg.hidden_size // 16, 16 * cfg.intermediate_size)
    ref = dict(model.named_parameters())["layers.0.mlp.down_proj.weight"].detach().numpy()
    np.testing.assert_array_equal(unpack(down, "tc", cfg.hidden_size, cfg.intermediate_size), ref)
    compiled.export(str(tmp_path / "m16.so"))
    assert (tmp_path / "m16.weights.npz").exists()
