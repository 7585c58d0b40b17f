"""Vendor BLAS inside compiled libraries: the externs (`*.cc`, TVM FFI functions), their build (`extern.py`) and
where their shared libraries come from at build and at run time (`libraries.py`).

| target | extern | library (wheel) |
| --- | --- | --- |
| cuda | `wide_cublaslt_matmul` (fp16 / bf16 / fp32, fp32 accumulation) | `libcublasLt.so.13` (`nvidia-cublas`, CUDA 13) |
| llvm | `wide_cblas_matmul` (fp32) | `libscipy_openblas.so` (`scipy-openblas32`) |

`passes/blas_dispatch.py` sends dense matmuls to them. Importing this package loads nothing.
"""
