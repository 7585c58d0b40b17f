"""DispatchDenseMatmuls: every dense matmul the gated lowering left goes to the target's vendor BLAS extern.

On CUDA, fp16 / bf16 / fp32 matmuls go to cuBLASLt (`wide_cublaslt_matmul`; fp32 exact, no TF32; an fp16 model's
attention exported through SDPA runs its products in fp32); on the CPU to OpenBLAS (`wide_cblas_matmul`; fp16 / bf16
widened to fp32 and the result rounded back); see wide_tvm/blas/. Matched forms (shapes row-major; `b` is the extern's second operand):

| Relax | extern call | example |
| --- | --- | --- |
| `matmul(x [.., M, K], permute_dims(w [N, K]))` | `b = w`, trans_b = 1 | Linear layers, LM head, routers |
| `matmul(x [.., M, K], w [K, N])` | `b = w`, trans_b = 0 | ONNX's pre-transposed weights |
| `matmul(q [B.., M, K], permute_dims(k [B.., N, K], swap last two))` | `b = k`, trans_b = 1 | attention scores |
| `matmul(p [B.., M, K], v [B.., K, N])` | `b = v`, trans_b = 0 | attention values |

A batched `b` must have the same leading dims as `x` (no broadcasting); anything else (1-D operands, mixed dtypes, an
`out_dtype` that differs from the inputs) is left to TVM. The CUDA call also returns cuBLASLt's
workspace (`WORKSPACE_BYTES`, uint8), allocated by TVM's memory planner like any other temporary, so the call
allocates nothing itself and can be captured in a CUDA graph:

    lv = R.call_dps_packed("wide_cublaslt_matmul", (x, w, R.prim_value(1), R.prim_value(0)),
                           out_ty=[R.Tensor((1, n, 1024), "float16"), R.Tensor((33554432,), "uint8")])
    y = lv[0]

The pass records each dispatched matmul (`self.dispatched`: `DispatchedMatmul`) and attaches the built extern to the
module's `external_mods`, which `tvm.compile` links into the library (also where only the gated kernels' dense
fallbacks call it: schedules/dense_fallback.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard
from tvm.sym.analyzer import Analyzer

from ..blas import DTYPES, FUNCTIONS, WORKSPACE_BYTES
from ..schedules.dense_fallback import BLAS_HELPER
from .mask_analysis import resolve



@dataclass(frozen=True)
class DispatchedMatmul:
    """One matmul sent to BLAS: the shapes as Relax printed them, the dtype and whether `b` is transposed."""

    x_shape: str
    b_shape: str
    dtype: str
    trans_b: bool
    batched: bool

    def to_json(self) -> dict:
        return {"x": self.x_shape, "b": self.b_shape, "dtype": self.dtype, "trans_b": self.trans_b,
                "batched": self.batched}


def _shape(expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _swaps_last_two(axes, ndim: int) -> bool:
    if axes is None:  # permute_dims with no axes reverses them: a swap of the last two only for 2-D
        return ndim == 2
    want = list(range(ndim - 2)) + [ndim - 1, ndim - 2]
    return [int(a) for a in axes] == want


def blas_operands(x, y, var2val):
    """(b, trans_b, batched) where `matmul(x, y)` is one the extern computes, else None (see the module's table)."""
    xs = _shape(x)
    if xs is None or len(xs) < 2:
        return None
    value = resolve(y, var2val)
    if isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.permute_dims"):
        inner = value.args[0]
        inner_shape = _shape(inner)
        if inner_shape is None or not _swaps_last_two(value.attrs.axes, len(inner_shape)):
            return None
        b, bs, trans = inner, inner_shape, True
    else:
        b, bs, trans = y, _shape(y), False
    if bs is None:
        return None
    if len(bs) == 2:
        return b, trans, False
    analyzer = Analyzer()
    if len(bs) != len(xs) or not all(analyzer.can_prove_equal(p, q) for p, q in zip(xs[:-2], bs[:-2])):
        return None
    return b, trans, True


@tvm.transform.module_pass(opt_level=0, name="DispatchDenseMatmuls")
class DispatchDenseMatmuls:
    """Rewrite the dense matmuls of `kind` ("cuda" / "llvm") into calls of the BLAS extern `extern`
    (wide_tvm/blas/extern.py: BlasExtern, or None to only plan: `dispatched` is filled, the module is unchanged)."""

    def __init__(self, kind: str, extern=None):
        self.kind = kind
        self.extern = extern
        self.dispatched: list[DispatchedMatmul] = []

    def _call(self, x, b, trans: bool, out_ty):
        args = [x, b, relax.prim_value(int(trans))]
        if self.kind != "cuda":
            return relax.call_dps_packed(FUNCTIONS[self.kind], relax.Tuple(args), out_ty)
        args.append(relax.prim_value(0))  # cuBLASLt's first heuristic pick
        workspace = relax.TensorType(relax.ShapeExpr([WORKSPACE_BYTES]), "uint8")
        call = relax.call_dps_packed(FUNCTIONS[self.kind], relax.Tuple(args), [out_ty, workspace])
        return relax.TupleGetItem(call, 0)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.dispatched = []
        if self.kind not in FUNCTIONS:
            return mod
        x, y = wildcard(), wildcard()
        pattern = is_op("relax.matmul")(x, y)
        rewritten = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            var2val = relax.analysis.get_var2val(func)

            def callback(expr, m, var2val=var2val):
                xv, yv = m[x], m[y]
                dtype = str(xv.ty.dtype) if isinstance(xv.ty, relax.TensorType) else ""
                out_dtype = str(expr.attrs.out_dtype or "")
                if (dtype not in DTYPES[self.kind] or str(yv.ty.dtype) != dtype
                        or out_dtype not in ("", "None", "void", dtype)):
                    return expr
                operands = blas_operands(xv, yv, var2val)
                if operands is None:
                    return expr
                b, trans, batched = operands
                self.dispatched.append(DispatchedMatmul(str(_shape(xv)), str(_shape(b)), dtype, trans, batched))
                if self.extern is None:
                    return expr
                return self._call(xv, b, trans, expr.ty)

            rewritten[gv] = rewrite_call(pattern, callback, func)
        # (the gated kernels' dense fallbacks call the extern too, through the module's BLAS helper)
        helper = any(gv.name_hint == BLAS_HELPER for gv in mod.functions)
        if self.extern is None or not (self.dispatched or helper):
            return mod
        builder = relax.BlockBuilder(mod)
        for gv, func in rewritten.items():
            builder.update_func(gv, func)
        mod = builder.get()
        external = list(mod.attrs["external_mods"]) if mod.attrs and "external_mods" in mod.attrs else []
        return mod.with_attr("external_mods", [*external, self.extern.module()])
