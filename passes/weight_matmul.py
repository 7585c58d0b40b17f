"""FuseWeightTranspose: `x @ permute_dims(W[N, K])` -> one NT matmul kernel, with no transposed copy of W.

Exporters write Linear layers as a matmul with a transposed weight; legalized as is, every call would
first materialise W^T (a full copy of the weight) and then multiply. TVM's FuseTransposeMatmul does this
rewrite but fails on batched 4-D transposes (attention scores) in 0.27, so this pass handles exactly the
2-D weight case and leaves everything else alone. Accumulation is in float32.
"""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .mask_analysis import resolve


def _nt_matmul(x: te.Tensor, w: te.Tensor) -> te.Tensor:
    k = te.reduce_axis((0, w.shape[1]), name="k")
    acc = te.compute((*x.shape[:-1], w.shape[0]),
                     lambda *i: te.sum(x[(*i[:-1], k)].astype("float32") * w[i[-1], k].astype("float32"), axis=k),
                     name="NT_matmul")
    if x.dtype == "float32":
        return acc
    return te.compute(acc.shape, lambda *i: acc[i].astype(x.dtype), name="NT_matmul_cast")


@tvm.transform.module_pass(opt_level=0, name="FuseWeightTranspose")
class FuseWeightTranspose:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod)
        x, w = wildcard(), wildcard()
        perm = is_op("relax.permute_dims")(w)
        pattern = is_op("relax.matmul")(x, perm)
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            var2val = relax.analysis.get_var2val(func)

            def callback(expr, m, var2val=var2val):
                weight = m[w]
                shape = weight.ty.shape
                value = resolve(m[perm], var2val)
                axes = value.attrs.axes if isinstance(value, relax.Call) else None
                if shape is None or len(shape.values) != 2 or (axes is not None and [int(a) for a in axes] != [1, 0]):
                    return expr
                if str(weight.ty.dtype) != str(m[x].ty.dtype):
                    return expr
                return builder.call_te(_nt_matmul, m[x], weight, primfunc_name_hint="NT_matmul")

            builder.update_func(gv, rewrite_call(pattern, callback, func))
        return builder.get()
