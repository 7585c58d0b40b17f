"""One gated kernel, described as plain data: what the lowering plans, the tuner tunes, the benchmark builds and the
GPU host times. Pure Python (imports neither TVM nor the kernels), so the GPU host's runtime-only checkout reads it.

A gated kernel is one of three kinds:

* ``gemm_mn_swiglu``: gate/up with the SwiGLU epilogue, ``x [T, K] -> h [T, G*gs]`` with two weights ``[G*gs, K]``;
  output channels come in G groups of gs, a token's skipped groups are zeros.
* ``gemm_mn``: the same without the epilogue and with one weight (a gated query projection).
* ``gemm_k``: ``a [T, G*gs] -> y [T, N]`` with one weight ``[N, G*gs]``; the reduction axis comes in groups, a token's
  skipped groups do not contribute (down, o_proj).

``dim`` is K of a gemm_mn and N of a gemm_k. Worked example, Llama-3.1-8B's FFN at groups of 128 on an H100:

    >>> up = KernelSpec.planned("gemm_mn_swiglu", 112, 128, 4096, "float16", "cuda")
    >>> up.layout, up.n, up.k, up.key
    ('tc', 14336, 4096, 'gemm_mn_swiglu/g112x128/d4096/float16')
    >>> down = KernelSpec.planned("gemm_k", 112, 128, 4096, "float32", "llvm")
    >>> down.layout, down.symbol
    ('kp', 'wide_gemm_k_g112x128_n4096_float32_kp')
"""

from __future__ import annotations

from dataclasses import dataclass

from .weight_layout import TC_CHUNK, TC_ROWS, cpu_k_layout

KINDS = ("gemm_mn_swiglu", "gemm_mn", "gemm_k")


def kernel_key(kind: str, groups: int, group_size: int, dim: int, dtype: str) -> str:
    """The key tuning results are filed under: `gemm_k/g112x128/d4096/float16` (no layout: one per shape)."""
    return f"{kind}/g{groups}x{group_size}/d{dim}/{dtype}"


def supports_mn(group_size: int, k_dim: int, dtype: str) -> bool:
    """Whether a gemm_mn of this shape runs the tensor-core kernels (fp16, 16-row tiles, 32-wide K chunks)."""
    return dtype == "float16" and group_size % TC_ROWS == 0 and k_dim % TC_CHUNK == 0


def supports_k(group_size: int, n_dim: int, dtype: str) -> bool:
    """Whether a gemm_k of this shape runs the tensor-core kernels (a group is whole K chunks)."""
    return dtype == "float16" and group_size % TC_CHUNK == 0 and n_dim % TC_ROWS == 0


def supports(kind: str, group_size: int, dim: int, dtype: str) -> bool:
    """Whether the tensor-core kernels take a kernel of `kind` (dim: N of gemm_k, K of gemm_mn), i.e. its weights go
    in the "tc" layout."""
    return (supports_k if kind == "gemm_k" else supports_mn)(group_size, dim, dtype)


def kernel_layout(kind: str, group_size: int, dim: int, dtype: str, target_kind: str) -> str | None:
    """The weight layout the compiler stores a kernel's weights in for `target_kind` ("cuda" / "llvm"), or None to
    keep them as the model stores them: tensor-core tiles ("tc") on CUDA where the shape has them; on the CPU
    gemm_k's weights folded to [K, N], in 16-column panels ("kp") where N has whole ones. The one place this is
    decided (the lowering, the tuner and the benchmark all ask here)."""
    if target_kind == "cuda":
        return "tc" if supports(kind, group_size, dim, dtype) else None
    if kind == "gemm_k":
        return cpu_k_layout(dim)
    return None


@dataclass(frozen=True)
class KernelSpec:
    """One gated kernel: kind, groups x group_size, dim (K of gemm_mn, N of gemm_k), dtype and the layout its weights
    are stored in ("nk" [N, K] as exported, "kn", "kp", "tc": wide_tvm/weight_layout.py)."""

    kind: str
    groups: int
    group_size: int
    dim: int
    dtype: str
    layout: str

    @classmethod
    def planned(cls, kind: str, groups: int, group_size: int, dim: int, dtype: str, target_kind: str,
                stored: str = "nk") -> "KernelSpec":
        """The kernel the compiler builds for `target_kind` when the model stores its weights as `stored`."""
        return cls(kind, groups, group_size, dim, dtype,
                   kernel_layout(kind, group_size, dim, dtype, target_kind) or stored)

    @property
    def key(self) -> str:
        return kernel_key(self.kind, self.groups, self.group_size, self.dim, self.dtype)

    @property
    def op(self) -> str:
        """"gemm_mn" (output groups) or "gemm_k" (reduction groups)."""
        return "gemm_k" if self.kind == "gemm_k" else "gemm_mn"

    @property
    def swiglu(self) -> bool:
        return self.kind == "gemm_mn_swiglu"

    @property
    def n(self) -> int:
        """Output columns."""
        return self.groups * self.group_size if self.op == "gemm_mn" else self.dim

    @property
    def k(self) -> int:
        """Reduction length."""
        return self.dim if self.op == "gemm_mn" else self.groups * self.group_size

    @property
    def symbol(self) -> str:
        """The kernel's function name in a compiled library."""
        axis = "k" if self.op == "gemm_mn" else "n"
        return f"wide_{self.kind}_g{self.groups}x{self.group_size}_{axis}{self.dim}_{self.dtype}_{self.layout}"
