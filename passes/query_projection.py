"""Find the query projection of a gated attention: the matmul whose head groups feed only the same head groups.

A gated attention multiplies its output `[tokens, G * gs]` by the router mask before `o_proj`. Where token t
skips group g, nothing of that token's query heads in g survives the mask, so the query projection may skip
them too (gemm_mn, as gate/up): provided query group g of token t feeds output group g of token t and nothing
else. Exporters spell attention in many ways (GQA repeats, RoPE slices, q_norm, batched matmuls), so instead of
matching a spelling we check that property by running the graph on labels: each element of a tensor carries
which (token, query group) it depends on, propagated with NumPy from a candidate matmul to the gated operand
(symbolic dimensions set to PROBE_TOKENS, so attention's mixing over tokens shows). K and V projections fail the
check (every query token reads every key token); so does any head permutation between q and o.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax

from .mask_analysis import MaskInfo, op_name, resolve

PROBE_TOKENS = 3  # every symbolic dimension, so that tokens mix visibly through attention
FREE, MIXED = -1, -2  # labels: depends on no query element / on several (token, group) pairs

ELEMENTWISE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power", "relax.maximum",
               "relax.minimum", "relax.where", "relax.negative", "relax.exp", "relax.sqrt", "relax.rsqrt",
               "relax.sigmoid", "relax.tanh", "relax.abs", "relax.cos", "relax.sin", "relax.erf", "relax.astype",
               "relax.nn.silu", "relax.square", "relax.clip", "relax.equal", "relax.not_equal", "relax.less",
               "relax.less_equal", "relax.greater", "relax.greater_equal", "relax.logical_and", "relax.logical_or",
               "relax.logical_not"}  # (comparisons: torch.export's SDPA checks for fully masked rows)
REDUCTIONS = {"relax.mean", "relax.sum", "relax.max", "relax.min", "relax.variance"}


class _Unsupported(Exception):
    """An op on the path from the candidate to the gated operand that the label run does not model."""


def _dim(e) -> int:
    """A shape dimension with every symbolic variable set to PROBE_TOKENS."""
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, tvm.tirx.IntImm):
        return int(e.value)
    if isinstance(e, tvm.tirx.Var):
        return PROBE_TOKENS
    ops = {tvm.tirx.Add: lambda a, b: a + b, tvm.tirx.Sub: lambda a, b: a - b, tvm.tirx.Mul: lambda a, b: a * b,
           tvm.tirx.FloorDiv: lambda a, b: a // b, tvm.tirx.FloorMod: lambda a, b: a % b, tvm.tirx.Max: max,
           tvm.tirx.Min: min}
    for kind, fn in ops.items():
        if isinstance(e, kind):
            return fn(_dim(e.a), _dim(e.b))
    if isinstance(e, tvm.tirx.Cast):
        return _dim(e.value)
    raise _Unsupported(f"shape dimension {e}")


def _shape(expr) -> tuple[int, ...]:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise _Unsupported("a tensor of unknown shape")
    return tuple(_dim(d) for d in ty.shape.values)


def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Labels of an element computed from elements labelled a and b (broadcast)."""
    a, b = np.broadcast_arrays(a, b)
    return np.where(a == FREE, b, np.where((b == FREE) | (b == a), a, MIXED))


def _reduce(labels: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    """Labels after a reduction over `axes` (None: all)."""
    axes = range(labels.ndim) if axes is None else [int(a) % labels.ndim for a in axes]
    for ax in sorted(axes, reverse=True):
        labels = np.expand_dims(functools.reduce(_merge, np.moveaxis(labels, ax, 0)), ax)
    return labels if keepdims else np.squeeze(labels, tuple(axes))


def _ints(expr) -> list[int]:
    fields = expr.values if isinstance(expr, relax.ShapeExpr) else expr.fields
    return [_dim(f.value if hasattr(f, "value") and not isinstance(f, tvm.tirx.IntImm) else f) for f in fields]


def _strided_slice(labels: np.ndarray, call: relax.Call) -> np.ndarray:
    axes, begin, end, strides = (_ints(a) for a in call.args[1:5])
    index = [slice(None)] * labels.ndim
    for ax, b, e, s in zip(axes, begin, end, strides):
        index[ax] = slice(b, e, s)
    return labels[tuple(index)]


class _LabelRun:
    """Labels of every tensor between one candidate source binding and the gated operand."""

    def __init__(self, source: relax.Var, groups: int, group_size: int, var2val, order: dict):
        self.source, self.var2val, self.order = source, var2val, order
        rows_cols = _shape(source)
        self.rows = int(np.prod(rows_cols[:-1]))
        cols = rows_cols[-1]
        self.expected_source = (np.arange(self.rows)[:, None] * groups + np.arange(cols)[None] // group_size)
        self.source_labels = self.expected_source.reshape(rows_cols)
        self.memo: dict = {}

    def labels(self, expr) -> np.ndarray | None:
        """Labels of `expr`, None where it does not depend on the source."""
        if isinstance(expr, relax.Var):
            if expr.same_as(self.source):
                return self.source_labels
            if expr not in self.var2val or self.order.get(expr, -1) <= self.order[self.source]:
                return None  # a parameter, or bound before the source: independent of it
            if expr not in self.memo:
                value = self.var2val[expr]
                self.memo[expr] = self._call(value, expr) if isinstance(value, relax.Call) else self.labels(value)
            return self.memo[expr]
        if isinstance(expr, (tvm.ir.Constant, relax.ShapeExpr)):
            return None
        if isinstance(expr, relax.Call):
            return self._call(expr, expr)
        raise _Unsupported(f"an expression of type {type(expr).__name__}")

    def _arg(self, arg) -> np.ndarray:
        lab = self.labels(arg)
        return np.full(_shape(arg), FREE) if lab is None else lab

    def _call(self, call: relax.Call, bound) -> np.ndarray | None:
        op = op_name(call)
        tensors = [a for a in call.args if isinstance(a, (relax.Var, relax.Call, tvm.ir.Constant))]
        if op == "relax.concat":
            tensors = list(call.args[0].fields)
        deps = [self.labels(a) for a in tensors]
        if all(d is None for d in deps):
            return None
        x = self._arg(call.args[0]) if op != "relax.concat" else None
        attrs = call.attrs
        if op in ELEMENTWISE:
            out = functools.reduce(_merge, [self._arg(a) for a in tensors])
        elif op in ("relax.reshape", "relax.broadcast_to"):
            target = _shape(bound)
            out = x.reshape(target) if op == "relax.reshape" else np.broadcast_to(x, target)
        elif op == "relax.permute_dims":
            out = np.transpose(x, None if attrs.axes is None else [int(a) for a in attrs.axes])
        elif op == "relax.expand_dims":
            out = x
            for ax in sorted(int(a) % (x.ndim + len(attrs.axis)) for a in attrs.axis):
                out = np.expand_dims(out, ax)
        elif op == "relax.squeeze":
            out = np.squeeze(x, None if attrs.axis is None else tuple(int(a) for a in attrs.axis))
        elif op == "relax.repeat":
            out = np.repeat(x, int(attrs.repeats), axis=None if attrs.axis is None else int(attrs.axis))
        elif op == "relax.tile":
            out = np.tile(x, [int(r) for r in attrs.repeats])
        elif op == "relax.strided_slice":
            out = _strided_slice(x, call)
        elif op == "relax.concat":
            out = np.concatenate([self._arg(a) for a in tensors], axis=int(attrs.axis))
        elif op in REDUCTIONS:
            out = _reduce(x, attrs.axis, bool(attrs.keepdims))
        elif op in ("relax.nn.softmax", "relax.nn.log_softmax"):
            out = np.broadcast_to(_reduce(x, [attrs.axis], True), x.shape)
        elif op == "relax.nn.rms_norm":
            out = _merge(np.broadcast_to(_reduce(x, attrs.axes, True), x.shape), self._arg(call.args[1]))
        elif op in ("relax.full_like", "relax.zeros_like", "relax.ones_like"):  # only x's shape is read
            out = np.full(_shape(bound), FREE)
        elif op == "relax.matmul":
            a, b = x, self._arg(call.args[1])
            if a.ndim < 2 or b.ndim < 2:
                raise _Unsupported("a matmul with a vector operand")
            out = _reduce(_merge(a[..., :, :, None], b[..., None, :, :]), [-2], False)
        else:
            raise _Unsupported(f"op {op}")
        if tuple(out.shape) != _shape(bound):
            raise _Unsupported(f"{op}: labels of shape {out.shape}, the tensor has {_shape(bound)}")
        return np.ascontiguousarray(out)

    def feeds_only_own_group(self, operand, channels: int) -> bool:
        """Whether element (token t, channel c) of `operand` depends, among the source's elements, only on token
        t's query group of c, and some of them do."""
        labels = self.labels(operand)
        if labels is None or labels.size != self.rows * channels:
            return False
        labels = labels.reshape(self.rows, channels)
        return bool(np.all((labels == FREE) | (labels == self.expected_source)) and np.any(labels >= 0))


def _weight_param(value, var2val, params):
    """W of `value` = x @ W or x @ permute_dims(W), W a 2-D function parameter; None otherwise."""
    if op_name(value) != "relax.matmul":
        return None
    weight = resolve(value.args[1], var2val)
    if op_name(weight) == "relax.permute_dims":
        weight = weight.args[0]
    if not isinstance(weight, relax.Var) or not any(weight.same_as(p) for p in params):
        return None
    return weight if weight.ty.shape is not None and len(weight.ty.shape.values) == 2 else None


def _weight_matmuls_above(operand: relax.Var, var2val, params) -> list:
    """The weight matmuls (_weight_param) that `operand` reads through activations alone: the walk up the bindings
    stops at each of them (q, k, v of an attention), so it stays inside the layer."""
    found, seen, todo = [], set(), [operand]
    while todo:
        var = todo.pop()
        if var in seen or var not in var2val:
            continue
        seen.add(var)
        value = var2val[var]
        if _weight_param(value, var2val, params) is not None:
            found.append(var)
        elif isinstance(value, relax.Var):
            todo.append(value)
        elif isinstance(value, relax.Call):
            for arg in value.args:
                todo.extend(arg.fields if isinstance(arg, relax.Tuple) else [arg])
    return found


@functools.lru_cache(maxsize=4)
def _bindings(func: relax.Function) -> tuple[dict, list]:
    """(each bound variable -> its position, [(variable, the variables its value reads)] in binding order) of
    `func`: walked once per function, not once per gated attention (a 32-layer model has thousands of bindings)."""
    flat = [b for block in func.body.blocks for b in block.bindings]
    return {b.var: i for i, b in enumerate(flat)}, [(b.var, frozenset(vars_read(b.value))) for b in flat]


def binding_order(func: relax.Function) -> dict:
    """Each bound variable of `func` -> its position among the function's bindings."""
    return _bindings(func)[0]


def _feeds_only(source: relax.Var, operand: relax.Var, labelled: set, func: relax.Function) -> bool:
    """Whether everything computed from `source` is on its way to `operand` (the `labelled` bindings) or computed
    from `operand`: zeroing a skipped group of the source then changes nothing but what the gating discards."""
    order, reads = _bindings(func)
    from_source, from_operand = {source}, {operand}
    for var, read in reads[order[source] + 1:]:  # nothing bound before the source reads it
        if read & from_operand:
            from_operand.add(var)
        if read & from_source:
            from_source.add(var)
    if set(vars_read(func.body.body)) & {source}:
        return False  # the function returns q itself
    return all(v is source or v in labelled or v in from_operand for v in from_source)


def vars_read(expr) -> list:
    """The variables an expression reads (dataflow variables included)."""
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def find_query_projection(func: relax.Function, operand, info: MaskInfo, var2val) -> relax.Var | None:
    """The binding of the one weight matmul (q = x @ Wq) whose output groups feed only the same groups of the
    gated attention output `operand` (module docstring), and nothing else that the gating does not discard; None
    when there is none or more than one."""
    order = binding_order(func)
    if not isinstance(operand, relax.Var):  # a pattern match may hand over the bound value
        operand = next((v for v, val in var2val.items() if val.same_as(operand)), None)
        if operand is None:
            return None
    channels = info.groups * info.group_size
    found = []
    for var in _weight_matmuls_above(operand, var2val, func.params):
        try:
            run = _LabelRun(var, info.groups, info.group_size, var2val, order)
            if _shape(var)[-1] == channels and run.feeds_only_own_group(operand, channels):
                labelled = {v for v, lab in run.memo.items() if lab is not None}
                if _feeds_only(var, operand, labelled, func):
                    found.append(var)
        except _Unsupported:
            continue
    return found[0] if len(found) == 1 else None
