"""Legalizations that TVM 0.27 gets wrong for exported LLM graphs.

`relax.full` with a -inf fill (the causal mask of `torch.full(..).triu(1)`) crashes in TVM's own
legalization: it hands `topi.full` a PrimType where a dtype string is expected
(`argument of type 'PrimType' is not iterable`), with symbolic and with static shapes.

`relax.power(x, 2.0)` (RMSNorm's `x.pow(2)`) legalizes to CUDA `powf`, which returned NaN for every
element of an RMSNorm on the H200 (seen with a 1 x 3 x 64 fp32 input; `mean` alone was exact). Small
integral exponents become multiplications, exactly as PyTorch computes them.
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


def _legalize_power(bb: relax.BlockBuilder, call) -> relax.Expr:
    base, exponent = call.args
    value = _try_convert_to_scalar_const(exponent, python_native=True)
    if isinstance(value, (int, float)) and float(value) in (1.0, 2.0, 3.0):
        times = int(value)
        return bb.call_te(lambda x: _repeat_multiply(x, times), base, primfunc_name_hint="power")
    return bb.call_te(topi.power, base, exponent, primfunc_name_hint="power")


def _repeat_multiply(x, times: int):
    from tvm import te

    def body(*idx):
        out = x(*idx)
        for _ in range(times - 1):
            out = out * x(*idx)
        return out

    return te.compute(x.shape, body, name="power")


WIDE_LEGALIZATIONS = {"relax.full": _legalize_full, "relax.power": _legalize_power}
