"""Legalizations that TVM 0.27 gets wrong for exported LLM graphs.

`relax.full` with a -inf fill (the causal mask of `torch.full(..).triu(1)`) crashes in TVM's own
legalization: it hands `topi.full` a PrimType where a dtype string is expected
(`argument of type 'PrimType' is not iterable`), with symbolic and with static shapes.
"""

from __future__ import annotations

from tvm import relax, tirx, topi
from tvm.relax.transform.legalize_ops.common import _try_convert_to_scalar_const


def _legalize_full(bb: relax.BlockBuilder, call) -> relax.Expr:
    fill = _try_convert_to_scalar_const(call.args[1], python_native=True)
    shape = call.args[0]
    if isinstance(shape, relax.ShapeExpr):
        dims = shape.values
    else:
        shape = bb.emit(shape)
        dims = [tirx.Var(f"s{i}", "int64") for i in range(shape.ty.ndim)]
        bb.match_cast(shape, relax.ShapeType(dims))
    return bb.call_te(topi.full, dims, str(call.ty.dtype), fill, primfunc_name_hint="full")


WIDE_LEGALIZATIONS = {"relax.full": _legalize_full}
