"""Decide whether a tensor is a router mask expanded over channel groups, and with which group size.

A gated layer multiplies activations by `expand(mask)`, where `mask [..., G]` comes from an argmax or a
comparison over router logits and `expand` is a chain of layout ops (astype, expand_dims, broadcast_to,
reshape, repeat, ...). Exporters write that chain in many ways, so instead of matching each spelling we
run the chain on a probe mask (group g holds the value g+1, token dimensions set to 1) with NumPy and
read the channel -> group map off the result. The map must be contiguous groups of equal size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

LAYOUT_OPS = {"relax.astype", "relax.expand_dims", "relax.broadcast_to", "relax.reshape", "relax.repeat",
              "relax.tile", "relax.permute_dims", "relax.squeeze"}
COMPARISONS = {"relax.equal", "relax.not_equal", "relax.less", "relax.less_equal", "relax.greater",
               "relax.greater_equal"}
ROUTER_SOURCES = {"relax.argmax", "relax.argmin", "relax.strided_slice", "relax.take"}


@dataclass
class MaskInfo:
    """The router mask (bool/int/float [..., G]) behind an expanded mask, and its channel grouping."""

    root: relax.Expr
    groups: int
    group_size: int


def op_name(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def resolve(expr, var2val):
    """Follow variable bindings to the bound value (stays a Var for function parameters)."""
    while isinstance(expr, relax.Var) and expr in var2val:
        expr = var2val[expr]
    return expr


def _concrete(dims) -> list[int]:
    out = []
    for d in dims:
        out.append(int(d.value) if isinstance(d, tvm.tirx.IntImm) else 1)  # symbolic (token) dims -> 1
    return out


def _shape_of(expr) -> list[int] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return _concrete(ty.shape.values)


def _apply(call: relax.Call, x: np.ndarray) -> np.ndarray:
    op, attrs = call.op.name, call.attrs
    if op == "relax.astype":
        return x
    if op == "relax.expand_dims":
        return np.expand_dims(x, tuple(int(a) for a in attrs.axis))
    if op == "relax.broadcast_to":
        return np.broadcast_to(x, _concrete(call.args[1].values))
    if op == "relax.reshape":
        return x.reshape(_concrete(call.args[1].values))
    if op == "relax.repeat":
        axis = None if attrs.axis is None else int(attrs.axis)
        return np.repeat(x, int(attrs.repeats), axis=axis)
    if op == "relax.tile":
        return np.tile(x, [int(r) for r in attrs.repeats])
    if op == "relax.permute_dims":
        return np.transpose(x, None if attrs.axes is None else [int(a) for a in attrs.axes])
    if op == "relax.squeeze":
        return np.squeeze(x, None if attrs.axis is None else tuple(int(a) for a in attrs.axis))
    raise ValueError(op)


def _is_router_decision(root, var2val) -> bool:
    """A comparison one of whose inputs is an argmax/argmin or a slice of router logits."""
    if op_name(root) not in COMPARISONS:
        return False
    for arg in root.args:
        value = resolve(arg, var2val)
        while op_name(value) in LAYOUT_OPS:
            value = resolve(value.args[0], var2val)
        if op_name(value) in ROUTER_SOURCES:
            return True
    return False


def analyse_mask(expanded, operand, channels: int, var2val) -> MaskInfo | None:
    """MaskInfo when `expanded` (multiplied with `operand`) is a router mask spread over `channels` in
    contiguous groups of equal size; None otherwise."""
    chain = []
    value = resolve(expanded, var2val)
    while op_name(value) in LAYOUT_OPS:
        chain.append(value)
        value = resolve(value.args[0], var2val)
    root = value
    if not _is_router_decision(root, var2val):
        return None
    root_shape, operand_shape = _shape_of(root), _shape_of(operand)
    if not root_shape or operand_shape is None:
        return None
    groups = root_shape[-1]
    if groups < 1 or channels % groups:
        return None
    probe = np.broadcast_to(np.arange(1, groups + 1, dtype=np.float64), root_shape)
    try:
        for call in reversed(chain):
            probe = _apply(call, probe)
        probe = np.broadcast_to(probe, np.broadcast_shapes(probe.shape, tuple(operand_shape)))
        row = np.asarray(probe).reshape(-1, channels)[0]
    except (ValueError, TypeError, AttributeError):
        return None
    group_size = channels // groups
    if not np.array_equal(row, np.repeat(np.arange(1, groups + 1), group_size)):
        return None
    return MaskInfo(root=root, groups=groups, group_size=group_size)
