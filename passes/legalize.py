"""Legalizations that TVM 0.27 gets wrong for exported LLM graphs.

`relax.full` with a -inf fill (the causal mask of `torch.full(..).triu(1)`) crashes in TVM's own
legalization: it hands `topi.full` a PrimType where a dtype string is expected
(`argument of type 'PrimType' is not iterable`), with symbolic and with static shapes.

`relax.power(x, 2.0)` (RMSNorm's `x.pow(2)`) legalizes to CUDA `powf`, which returned NaN for every
element of an RMSNorm on the H200 (seen with a 1 x 3 x 64 fp32 input; `mean` alone was exact). Small
integral exponents become multiplications, exactly as PyTorch computes them.

`relax.take` in its default "fast" mode reads out of bounds for an index past the table (a token id >= the vocabulary
reaching the embedding: a segfault at 1e9, TVM warns on every compile); clip mode keeps every read in the table, so a
caller that bypasses the Python wrapper's id check (runtime.py) cannot read past it.

`relax.argmax` / `relax.argmin` over bf16 (a bf16 model's router picking execute or skip) legalizes to a reduction
whose bf16 comparison TVM's BF16 legalization cannot lower ("Check failed: StructuralEqual(value->ty, var->ty)");
bf16 widens to fp32 exactly, so the reduction runs over the fp32 values and picks the same index.

`relax.sum` / `relax.mean` over fp16 or bf16 accumulate in that type: RMSNorm's `x.pow(2).mean(-1)` of an fp16
Llama-3.1-8B overflowed to inf once a token's mean square passed 16 (65504 / 4096: from the fourth layer of random
weights on), its rsqrt was 0 and the logits of all 32 layers came out zero (H100; 2 layers: 14 % off at 16 tokens).
PyTorch accumulates half-precision reductions in fp32; so do these, then cast the result back.
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


def _search_in_fp32(te_func):
    def legalize(bb: relax.BlockBuilder, call) -> relax.Expr:
        def body(x, axis, keepdims):
            return te_func(topi.cast(x, "float32") if x.dtype == "bfloat16" else x, axis, keepdims)

        return bb.call_te(body, call.args[0], call.attrs.axis, call.attrs.keepdims,
                          primfunc_name_hint=te_func.__name__)

    return legalize


def _reduce_in_fp32(mean: bool):
    def legalize(bb: relax.BlockBuilder, call) -> relax.Expr:
        def body(x, axis, keepdims):
            half = x.dtype in ("float16", "bfloat16")
            wide = topi.cast(x, "float32") if half else x
            out = _mean(wide, axis, keepdims) if mean else topi.sum(wide, axis, keepdims)
            return topi.cast(out, x.dtype) if half else out

        return bb.call_te(body, call.args[0], call.attrs.axis, call.attrs.keepdims,
                          primfunc_name_hint="mean" if mean else "sum")

    return legalize


def _mean(x, axis, keepdims):
    count = tirx.const(1, "int32")
    for dim in (list(axis) if axis is not None else range(len(x.shape))):
        count = count * x.shape[int(dim)]
    return topi.divide(topi.sum(x, axis, keepdims), count)


def _legalize_take(bb: relax.BlockBuilder, call) -> relax.Expr:
    mode = "clip" if str(call.attrs.mode) == "fast" else str(call.attrs.mode)
    return bb.call_te(topi.take, call.args[0], call.args[1], call.attrs.axis, mode=mode, primfunc_name_hint="take")


WIDE_LEGALIZATIONS = {"relax.full": _legalize_full, "relax.power": _legalize_power, "relax.take": _legalize_take,
                      "relax.argmax": _search_in_fp32(topi.argmax), "relax.argmin": _search_in_fp32(topi.argmin),
                      "relax.sum": _reduce_in_fp32(mean=False), "relax.mean": _reduce_in_fp32(mean=True)}
