"""wide-bench dense: every dense matmul of a Llama-3.1-8B WIDE model, as a compiled library runs it, against
torch.matmul on the same device, with TVM's own kernels beside it and the roofline limit.

    wide-bench dense-build DIR [--target cuda|llvm]    # here (no GPU needed)
    wide-bench dense-run DIR --json OUT.json            # where the library runs (the GPU host, or this CPU)

DIR/dense_blas.so: one function per shape through wide-compile's pipeline, dense matmuls dispatched to the vendor BLAS
(cuBLASLt on CUDA, OpenBLAS on the CPU: passes/blas_dispatch.py); DIR/dense_tvm.so: the same with `blas=False`
(TVM's own kernels, as before the dispatch); DIR/dense.json: the shapes. Token counts are symbolic in both.

Shapes (`DENSE_SHAPES`): K / V projections 4096 -> 1024 (each; fused 4096 -> 2048), the LM head 4096 -> 128256, the
routers (compressor 4096 -> 128, router 128 -> 2 x groups for the FFN's 112 and attention's 8 groups; a rank of 128
is this benchmark's choice), and attention's batched score (q k^T over 32 heads of 128) and value (p v) matmuls.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
CPU_TOKENS = (1, 16, 128)


@dataclass(frozen=True)
class DenseShape:
    """One dense matmul of T tokens. `form` "linear": x [T, k] @ w[n, k]^T; "scores": q [heads, T, k] @ k^T ->
    [heads, T, T]; "values": p [heads, T, T] @ v [heads, T, n]."""

    name: str
    n: int
    k: int
    form: str = "linear"
    heads: int = 0

    def operands(self, tokens: int) -> tuple[tuple, tuple, tuple]:
        """Shapes of (x, b, out) at `tokens`, with b as the Relax function takes it."""
        t = tokens
        if self.form == "scores":
            return (self.heads, t, self.k), (self.heads, t, self.k), (self.heads, t, t)
        if self.form == "values":
            return (self.heads, t, t), (self.heads, t, self.n), (self.heads, t, self.n)
        return (t, self.k), (self.n, self.k), (t, self.n)

    def flops(self, tokens: int) -> int:
        x, b, out = self.operands(tokens)
        k = x[-1]
        batch = x[0] if len(x) == 3 else 1
        return 2 * batch * out[-2] * out[-1] * k

    def bytes(self, tokens: int, itemsize: int) -> int:
        return itemsize * sum(_numel(s) for s in self.operands(tokens))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


DENSE_SHAPES = (
    DenseShape("k_or_v_proj", 1024, 4096),
    DenseShape("kv_fused", 2048, 4096),
    DenseShape("lm_head", 128256, 4096),
    DenseShape("router_compressor", 128, 4096),
    DenseShape("router_ffn", 224, 128),
    DenseShape("router_attn", 16, 128),
    DenseShape("attn_scores", 0, 128, "scores", 32),
    DenseShape("attn_values", 128, 0, "values", 32),
)


def dense_shape_module(shapes, dtype: str):
    """One Relax function per shape (token count symbolic), written as an importer writes them."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    for s in shapes:
        t = tvm.tirx.Var("t", "int64")
        if s.form == "scores":
            x = relax.Var("q", relax.TensorType([s.heads, t, s.k], dtype))
            b = relax.Var("kt", relax.TensorType([s.heads, t, s.k], dtype))
        elif s.form == "values":
            x = relax.Var("p", relax.TensorType([s.heads, t, t], dtype))
            b = relax.Var("v", relax.TensorType([s.heads, t, s.n], dtype))
        else:
            x = relax.Var("x", relax.TensorType([t, s.k], dtype))
            b = relax.Var("w", relax.TensorType([s.n, s.k], dtype))
        with bb.function(s.name, [x, b]):
            with bb.dataflow():
                rhs = relax.op.permute_dims(b, [0, 2, 1]) if s.form == "scores" else (
                    b if s.form == "values" else relax.op.permute_dims(b))
                y = bb.emit_output(relax.op.matmul(x, rhs))
            bb.emit_func_output(y)
    return bb.get()


def export_dense(mod, tgt, path: str, blas: bool):
    """Compile `mod` through wide-compile's pipeline without gating and write the library to `path` (under `tgt`):
    with `blas`, its dense matmuls on the target's vendor BLAS (linked), else on TVM's own kernels. Returns (the
    BlasExtern linked or None, how many matmuls went to it)."""
    import tvm

    from ..blas.extern import extern_for
    from ..passes import DispatchDenseMatmuls, LowerGatedLayers, wide_pipeline

    kind = tgt.kind.name
    extern = extern_for(kind) if blas else None
    dispatch = DispatchDenseMatmuls(kind, extern) if blas else None
    lower = LowerGatedLayers(kind, enabled=False)
    ex = tvm.compile(mod, tgt, relax_pipeline=wide_pipeline(tgt, lower, None, dispatch))
    ex.export_library(path, options=extern.link_options() if extern else [])
    return extern, len(dispatch.dispatched) if dispatch else 0


def build_dense(out_dir: str, target: str = "cuda", shapes=DENSE_SHAPES, dtype: str | None = None) -> str:
    """DIR/dense_blas.so, DIR/dense_tvm.so and DIR/dense.json for `target`, in `dtype` (default fp16 on CUDA, fp32
    on the CPU)."""
    from ..cuda_aot import cuda_codegen
    from ..targets import parse_target

    tgt = parse_target(target)
    kind = tgt.kind.name
    if kind == "cuda":
        cuda_codegen()
    dtype = dtype or ("float16" if kind == "cuda" else "float32")
    os.makedirs(out_dir, exist_ok=True)
    with tgt:
        extern, dispatched = export_dense(dense_shape_module(shapes, dtype), tgt,
                                          os.path.join(out_dir, "dense_blas.so"), blas=True)
        if dispatched != len(shapes):
            raise RuntimeError(f"only {dispatched} of {len(shapes)} dense shapes were dispatched")
        export_dense(dense_shape_module(shapes, dtype), tgt, os.path.join(out_dir, "dense_tvm.so"), blas=False)
    with open(os.path.join(out_dir, "dense.json"), "w") as f:
        json.dump({"target": str(tgt), "device": "cuda" if kind == "cuda" else "cpu", "dtype": dtype,
                   "blas": extern.library.name, "shapes": [asdict(s) for s in shapes]}, f, indent=1)
    return out_dir
