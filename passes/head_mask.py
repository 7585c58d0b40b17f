"""Masking an attention's output by head group inside the transpose that writes it.

A gated o_proj reads `attn [1, H, T, D]` brought back to tokens, `t = transpose(attn) [1, T, H, D]`, reshaped to
[T, H * D], times the router's mask per head group. The gated kernel skips the masked groups itself; a dense
fallback (schedules/dense_fallback.py) that runs the vendor BLAS needs its input masked first. Done here, the mask
is one elementwise function of `t` that FuseOps fuses into the transpose, so it costs no pass of its own:

    out[0, t, h, d] = t[0, t, h, d] if mask[0, t, h // (H / G)] != 0 else 0

Worked example: 32 heads of 128 in G = 8 groups (4 heads a group), mask [1, T, 8] bool: head 13 reads
mask[.., 3]. (Masking after the reshape would not fuse: TVM's reshape of a symbolic shape, like its bounds-clipped
take, is an opaque kernel.)
"""

from __future__ import annotations

from tvm import relax, te, tirx
from tvm.sym.analyzer import Analyzer

from .mask_analysis import op_name, resolve, strip_reshapes


def head_mask(heads: int, dim: int, groups: int, dtype: str, mask_dtype: str) -> tirx.PrimFunc:
    """PrimFunc (t [1, T, heads, dim] dtype, mask [1, T, groups] mask_dtype) -> t masked by head group."""
    n = tirx.Var("n", "int64")
    one, h64, d64, g64 = (tirx.IntImm("int64", v) for v in (1, heads, dim, groups))  # (as TVM's legalized ops)
    t = te.placeholder((one, n, h64, d64), dtype, name="t")
    mask = te.placeholder((one, n, g64), mask_dtype, name="mask")
    per_group = heads // groups

    def body(b, i, h, d):
        active = mask[b, i, h // tirx.IntImm("int64", per_group)]
        if mask_dtype != "bool":
            active = active != tirx.const(0, mask_dtype)
        return tirx.Select(active, t[b, i, h, d], tirx.const(0, dtype))

    out = te.compute((one, n, h64, d64), body, name="head_mask")
    # private (create_prim_func names it "main"): once fused into the transpose, nothing keeps it in the library
    return te.create_prim_func([t, mask, out]).without_attr("global_symbol")


def _static(*dims) -> bool:
    return all(isinstance(d, tirx.IntImm) for d in dims)


def masked_in_transpose(operand, mask, groups: int, tokens, k: int, var2val, add_func) -> relax.Expr | None:
    """The gated `operand` masked by `mask` [1, T, groups] inside the transpose that writes it, as [tokens, k];
    None where the operand is not a transpose [1, T, H, D] (through reshapes) with H * D = k and H a multiple of
    `groups`. `add_func(name, primfunc)` adds the masking function to the module and returns its GlobalVar."""
    t = strip_reshapes(operand, var2val)
    if op_name(resolve(t, var2val)) != "relax.permute_dims" or not isinstance(mask.ty, relax.TensorType):
        return None
    shape, mshape = t.ty.shape, mask.ty.shape
    if shape is None or mshape is None or len(shape.values) != 4 or len(mshape.values) != 3:
        return None
    b, rows, heads, dim = shape.values
    if not _static(b, heads, dim, mshape.values[2]) or int(b) != 1 or int(heads) * int(dim) != k:
        return None
    if int(heads) % groups or int(mshape.values[2]) != groups:
        return None
    prove = Analyzer().can_prove_equal
    if not (prove(b, mshape.values[0]) and prove(rows, mshape.values[1])):
        return None
    dtype, mask_dtype = str(t.ty.dtype), str(mask.ty.dtype)
    name = f"wide_head_mask_h{int(heads)}x{int(dim)}_g{groups}_{dtype}_{mask_dtype}"
    gv = add_func(name, head_mask(int(heads), int(dim), groups, dtype, mask_dtype))
    masked = relax.call_tir(gv, [t, mask], out_ty=relax.TensorType(shape, dtype))
    return relax.op.reshape(masked, relax.ShapeExpr([tokens, k]))
