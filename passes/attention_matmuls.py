"""DecomposeAttention: `R.nn.attention` (what TVM's importers make of torch's scaled_dot_product_attention) as the
Relax ops it means, so its two batched matmuls reach the BLAS dispatch (passes/blas_dispatch.py).

TVM legalizes `nn.attention` into one TE function holding both matmuls, which no matmul schedule (nor BLAS) takes.
This pass writes out exactly what that legalization computes (relax/transform/legalize_ops/nn.py: `_te_attention`),
in the same dtype and order, for q [B, S, H, D], k [B, S_kv, H, D], v [B, S_kv, H, Dv] -> [B, S, H, Dv]:

    q3 = reshape(permute_dims(q, [0, 2, 1, 3]), [B * H, S, D])       (k3, v3 likewise)
    p  = matmul(q3, permute_dims(k3, [0, 2, 1])) * scale               (scale: 1 / sqrt(D) when not given)
    p  = p + bias                                                      (attention_bias: [B, H, S, S_kv])
    s  = softmax(p), or with a causal mask (offset 0 "TopLeft", |S - S_kv| "BottomRight"):
         e = tril(exp(tril(p, o) - max(tril(p, o), -1)), o);  s = e / sum(e, -1)
    out = permute_dims(reshape(matmul(s, v3), [B, H, S, Dv]), [0, 2, 1, 3])

Sliding-window attention (`window_size`) is left alone (TVM cannot legalize it either).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard


def _decompose(call: relax.Call) -> relax.Expr | None:
    attrs = call.attrs
    if attrs.window_size is not None or attrs.causal_mask not in (None, "TopLeft", "BottomRight"):
        return None
    q, k, v = call.args[:3]
    shapes = [a.ty.shape for a in (q, k, v)]
    if any(not isinstance(s, relax.ShapeExpr) or len(s.values) != 4 for s in shapes):
        return None
    (b, s, h, d), (_, s_kv, _, _), (_, _, _, dv) = (list(x.values) for x in shapes)
    if not isinstance(d, tvm.tirx.IntImm):
        return None
    op = relax.op

    def heads_first(x, length, width):  # [B, L, H, W] -> [B * H, L, W]
        return op.reshape(op.permute_dims(x, [0, 2, 1, 3]), relax.ShapeExpr([b * h, length, width]))

    q3, k3, v3 = heads_first(q, s, d), heads_first(k, s_kv, d), heads_first(v, s_kv, dv)
    dtype = str(q.ty.dtype)
    p = op.matmul(q3, op.permute_dims(k3, [0, 2, 1]))
    if attrs.scale is not None:
        p = op.multiply(p, relax.const(float(attrs.scale), dtype))
    else:
        p = op.divide(p, relax.const(math.sqrt(int(d)), dtype))
    if len(call.args) > 3:  # attention_bias
        p4 = op.reshape(p, relax.ShapeExpr([b, h, s, s_kv]))
        p = op.reshape(op.add(p4, call.args[3]), relax.ShapeExpr([b * h, s, s_kv]))
    if attrs.causal_mask is None:
        probs = op.nn.softmax(p, axis=-1)
    else:
        offset = 0
        if attrs.causal_mask == "BottomRight":
            diff = tvm.tirx.abs(s - s_kv)
            offset = int(diff) if isinstance(diff, tvm.tirx.IntImm) else relax.prim_value(diff)
        masked = op.tril(p, offset)
        e = op.tril(op.exp(op.subtract(masked, op.max(masked, axis=-1, keepdims=True))), offset)
        probs = op.divide(e, op.sum(e, axis=-1, keepdims=True))
    out = op.matmul(probs, v3)
    return op.permute_dims(op.reshape(out, relax.ShapeExpr([b, h, s, dv])), [0, 2, 1, 3])


@tvm.transform.module_pass(opt_level=0, name="DecomposeAttention")
class DecomposeAttention:
    """Rewrite every `nn.attention` / `nn.attention_bias` it can (see the module docstring); `count`: how many."""

    def __init__(self):
        self.count = 0

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.count = 0
        builder = relax.BlockBuilder(mod)
        patterns = (is_op("relax.nn.attention")(wildcard(), wildcard(), wildcard()),
                    is_op("relax.nn.attention_bias")(wildcard(), wildcard(), wildcard(), wildcard()))
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue

            def callback(expr, _m):
                new = _decompose(expr)
                if new is None:
                    return expr
                self.count += 1
                return new

            for pattern in patterns:
                func = rewrite_call(pattern, callback, func)
            builder.update_func(gv, func)
        return builder.get()
