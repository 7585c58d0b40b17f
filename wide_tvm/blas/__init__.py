"""Vendor BLAS inside compiled libraries: the externs (`*.cc`, TVM FFI functions), their build (`extern.py`) and
where their shared libraries come from at build and at run time (`libraries.py`).

| target | extern | library (wheel) |
| --- | --- | --- |
| cuda | `wide_cublaslt_matmul` (fp16 / bf16 / fp32, fp32 accumulation) | `libcublasLt.so.13` (`nvidia-cublas`, CUDA 13) |
| llvm | `wide_cblas_matmul` (fp32; fp16 / bf16 widened to fp32 block by block) | `libscipy_openblas.so` (`scipy-openblas32`) |

`passes/blas_dispatch.py` sends dense matmuls to them, `schedules/dense_fallback.py` calls them from a gated kernel's
host code. Importing this package loads nothing.
"""

WORKSPACE_BYTES = 32 << 20  # cuBLASLt's workspace a call gets (the recommended size on Hopper)
# what each target's extern takes (the CPU's fp16 / bf16 computed in fp32: OpenBLAS has no half-precision GEMM here)
DTYPES = {"cuda": ("float16", "bfloat16", "float32"), "llvm": ("float32", "float16", "bfloat16")}
FUNCTIONS = {"cuda": "wide_cublaslt_matmul", "llvm": "wide_cblas_matmul"}  # the externs' TVM FFI names
