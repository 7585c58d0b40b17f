"""CUDA builds on this GPU-less machine must embed compiled device code, never CUDA source."""

from __future__ import annotations

import shutil

import pytest
import tvm

import wide_tvm
from wide_tvm.schedules import gemm_k, gemm_mn, mask_reorder

FATBIN_MAGIC = b"\x50\xed\x55\xba"  # 0xBA55ED50, little endian

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _assert_device_code(path):
    data = open(path, "rb").read()
    assert FATBIN_MAGIC in data, "no fatbin embedded"
    assert b"__global__" not in data and b"extern \"C\"" not in data, "CUDA source embedded"


def test_kernels_build_to_fatbin(tmp_path):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024})
    funcs = {"reorder": mask_reorder(112, "cuda"), "mn": gemm_mn(112, 128, 4096, "float16", "kn", True, "cuda"),
             "k": gemm_k(112, 128, 4096, "float16", "nk", "cuda"), "q": gemm_mn(8, 512, 4096, "float16", "nk", False, "cuda")}
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with target:
        tvm.compile(mod, target).export_library(str(tmp_path / "k.so"))
    _assert_device_code(tmp_path / "k.so")


def test_model_builds_for_cuda(exported, tmp_path):
    path, _, cfg = exported("default", "pt2")
    compiled = wide_tvm.compile(path, "cuda")
    assert len(compiled.layers) == 2 * cfg.num_layers
    lib = compiled.export(str(tmp_path / "m.so"))
    _assert_device_code(lib)
    assert (tmp_path / "m.weights.npz").exists()
