"""Decide whether a tensor is a router gate spread over channel groups, and with which group size.

A gated layer multiplies activations by `expand(gate)`: `gate [..., G]` is 0 or 1 per token and group, the
router's two-way decision, and `expand` a chain of layout ops (astype, expand_dims, broadcast_to, reshape, repeat,
tile, ...). Exporters and authors write both in many ways, so both are checked by what they compute, not how:

* the gate's derivation (`gate_values`): the set of values each node can take, computed over the ops between the
  router's decision and the gate. A decision is an argmax / argmin over an axis of two (the (execute, skip) logits
  of WIDE's `[.., G, 2]` view) or a comparison of router outputs (two logits, a softmax or sigmoid against a
  threshold); `astype`, `logical_not`, `where`, arithmetic with constants and layout ops carry value sets through.
  A gate is accepted when its values are exactly {0, 1} and it derives from a decision. Worked examples, the
  value set after each op:

      argmax(l, -1) == 0                      {0, 1} -> {0, 1}          (equal: a decision)
      1 - argmax(l, -1)                       {0, 1} -> {1, 0}
      logical_not(astype(argmax(l), bool))    {0, 1} -> {0, 1} -> {1, 0} (WIDE's own inference code)
      where(argmax(l) == 0, 1.0, 0.0)         {0, 1} -> {1.0, 0.0}
      argmax(l, -1) + 1                       {0, 1} -> {1, 2}          rejected: not 0/1

* the expansion (`analyse_mask`): the chain is run on a probe gate (group g holds g + 1, token dimensions set to
  1) with NumPy, broadcast against the tensor it multiplies, and the channel -> group map read off the result:
  it must be contiguous groups of equal size. So `repeat_interleave`, `expand` + `reshape`, `tile`, and a view of
  the activations to `[.., G, gs]` times `gate[..., None]` (einops' `rearrange`) are one case.

Either check names the node where it stopped (`Mismatch`), which the lowering reports for gates it leaves dense.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

LAYOUT_OPS = {"relax.astype", "relax.expand_dims", "relax.broadcast_to", "relax.reshape", "relax.repeat",
              "relax.tile", "relax.permute_dims", "relax.squeeze"}
COMPARISONS = {"relax.equal", "relax.not_equal", "relax.less", "relax.less_equal", "relax.greater",
               "relax.greater_equal"}
DECISIONS = {"relax.argmax", "relax.argmin"}
# what a comparison reads when it is a router decision: one of the two logits (a slice of the pair), an argmax, or
# a softmax / sigmoid of the logits (against a threshold)
ROUTER_SOURCES = {"relax.argmax", "relax.argmin", "relax.strided_slice", "relax.take", "relax.nn.softmax",
                  "relax.sigmoid"}
ARITHMETIC = {"relax.add": operator.add, "relax.subtract": operator.sub, "relax.multiply": operator.mul}
GATE_VALUES = frozenset({0, 1})


@dataclass
class MaskInfo:
    """The router gate (bool/int/float [..., G], 0 or 1) behind an expanded mask, and its channel grouping."""

    root: relax.Expr
    groups: int
    group_size: int
    var: relax.Var | None = None  # the variable bound to `root`, where it has one


@dataclass
class Mismatch:
    """Why a multiplier is not a router gate: the node where the check stopped (a Relax variable name, or the op)
    and the reason."""

    node: str
    reason: str

    def __str__(self) -> str:
        return f"at {self.node}: {self.reason}"


def op_name(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def users_of(var2val: dict) -> dict:
    """Variable -> the variables whose bound call reads it directly (in binding order)."""
    users: dict = {}
    for var, value in var2val.items():
        if isinstance(value, relax.Call):
            for a in value.args:
                if isinstance(a, relax.Var):
                    users.setdefault(a, []).append(var)
    return users


def resolve(expr, var2val):
    """Follow variable bindings to the bound value (stays a Var for function parameters)."""
    while isinstance(expr, relax.Var) and expr in var2val:
        expr = var2val[expr]
    return expr


def strip_reshapes(expr, var2val):
    """`expr` seen through the reshapes that produce it (the tensor before the first of them)."""
    while op_name(resolve(expr, var2val)) == "relax.reshape":
        expr = resolve(expr, var2val).args[0]
    return expr


def node_name(expr, value=None) -> str:
    """How a report names a node: its variable and op (`lv87 = relax.equal`), or the op alone."""
    op = op_name(value if value is not None else expr) or type(value if value is not None else expr).__name__
    return f"{expr.name} = {op}" if isinstance(expr, relax.Var) else op


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


def axis_size(call: relax.Call) -> int | None:
    """The static length of the axis an argmax / argmin reduces (None: all axes, or not static)."""
    shape = call.args[0].ty.shape if isinstance(call.args[0].ty, relax.TensorType) else None
    if call.attrs.axis is None or shape is None:
        return None
    dim = shape.values[int(call.attrs.axis)]
    return int(dim) if isinstance(dim, tvm.tirx.IntImm) else None


def _scalar(value) -> frozenset | None:
    """{v} of a one-element constant, else None."""
    if isinstance(value, tvm.ir.GenericConst):
        arr = np.asarray(value.value.numpy())
        if arr.size == 1:
            v = arr.reshape(-1)[0].item()
            return frozenset({int(v) if float(v).is_integer() else v})
    return None


def _reads_router(expr, var2val) -> bool:
    """Whether a comparison input is a router output: behind layout ops, an argmax, a slice of a logit pair, or a
    softmax / sigmoid."""
    value = resolve(expr, var2val)
    while op_name(value) in LAYOUT_OPS:
        value = resolve(value.args[0], var2val)
    return op_name(value) in ROUTER_SOURCES


def gate_values(expr, var2val, depth: int = 0) -> tuple[frozenset | None, bool, Mismatch | None]:
    """(values, decided, stop) of a gate's derivation: the finite set of values `expr` can take (None where not
    known), whether it derives from a router's two-way decision, and where the analysis stopped when it could not
    follow (module docstring)."""
    value = resolve(expr, var2val)
    op = op_name(value)
    if depth > 32:
        return None, False, Mismatch(node_name(expr, value), "the gate's derivation is too long to follow")
    scalar = _scalar(value)
    if scalar is not None:
        return scalar, False, None
    if op in DECISIONS:
        n = axis_size(value)
        if n is None:
            return None, False, Mismatch(node_name(expr, value), "an argmax over an axis of unknown length")
        return frozenset(range(n)), n == 2, None
    if op in COMPARISONS:
        decided = any(_reads_router(a, var2val) for a in value.args)
        if not decided:
            return GATE_VALUES, False, Mismatch(node_name(expr, value), "a comparison of tensors that are not "
                                                "router outputs (an argmax, two logits, a softmax or sigmoid)")
        return GATE_VALUES, True, None
    if op in LAYOUT_OPS:
        values, decided, stop = gate_values(value.args[0], var2val, depth + 1)
        if op == "relax.astype" and str(value.attrs.dtype) == "bool" and values is not None:
            values = frozenset(int(v != 0) for v in values)
        return values, decided, stop
    if op == "relax.logical_not":
        values, decided, stop = gate_values(value.args[0], var2val, depth + 1)
        return (None if values is None else frozenset(int(not v) for v in values)), decided, stop
    if op in ARITHMETIC:
        (a, da, sa), (b, db, sb) = (gate_values(x, var2val, depth + 1) for x in value.args)
        if a is None or b is None:
            return None, da or db, sa or sb
        fn = ARITHMETIC[op]
        return frozenset(fn(u, v) for u in a for v in b), da or db, None
    if op == "relax.where":
        (c, dc, sc), (a, _, sa), (b, _, sb) = (gate_values(x, var2val, depth + 1) for x in value.args)
        if c is None or not c <= GATE_VALUES or a is None or b is None:
            return None, dc, sc or sa or sb or Mismatch(node_name(expr, value), "a where() of unknown values")
        return a | b, dc, None
    return None, False, Mismatch(node_name(expr, value), f"{op or 'a function input'} is not part of a router "
                                 "decision (argmax, comparison, logical_not, where, astype, arithmetic)")


def check_gate(root, var2val) -> Mismatch | None:
    """None when `root` is a router gate (0 / 1, from a two-way decision); else where and why not."""
    values, decided, stop = gate_values(root, var2val)
    if not decided:
        return stop or Mismatch(node_name(root, resolve(root, var2val)), "not derived from a router decision")
    if values is None or set(values) != set(GATE_VALUES):
        shown = "unknown" if values is None else sorted(values)
        return stop or Mismatch(node_name(root, resolve(root, var2val)), f"takes the values {shown}, not 0 and 1")
    return None


def analyse_mask(expanded, operand, channels: int, var2val) -> MaskInfo | Mismatch:
    """MaskInfo when `expanded` (multiplied with `operand`, the other factor as the graph writes it) is a router
    gate spread over `channels` in contiguous groups of equal size; otherwise a Mismatch naming the node where
    the check stopped."""
    chain = []
    expr, value = expanded, resolve(expanded, var2val)
    while op_name(value) in LAYOUT_OPS:
        chain.append(value)
        expr = value.args[0]
        value = resolve(expr, var2val)
    root, var = value, expr if isinstance(expr, relax.Var) else None
    bad = check_gate(var if var is not None else root, var2val)
    if bad is not None:
        return bad
    named = expanded if isinstance(expanded, relax.Var) else var if var is not None else root
    where = node_name(named, resolve(named, var2val))
    root_shape, operand_shape = _shape_of(root), _shape_of(operand)
    if not root_shape or operand_shape is None:
        return Mismatch(where, "the gate or the tensor it multiplies has no static rank")
    groups = root_shape[-1]
    if groups < 1 or channels % groups:
        return Mismatch(where, f"{groups} groups do not divide {channels} channels")
    probe = np.broadcast_to(np.arange(1, groups + 1, dtype=np.float64), root_shape)
    try:
        for call in reversed(chain):
            probe = _apply(call, probe)
        probe = np.broadcast_to(probe, np.broadcast_shapes(probe.shape, tuple(operand_shape)))
        row = np.asarray(probe).reshape(-1, channels)[0]
    except (ValueError, TypeError, AttributeError):
        return Mismatch(where, f"the expansion of the {groups}-group gate does not broadcast over "
                        f"{channels} channels of a tensor shaped {operand_shape}")
    group_size = channels // groups
    if not np.array_equal(row, np.repeat(np.arange(1, groups + 1), group_size)):
        return Mismatch(where, f"the expansion does not spread the {groups} groups over contiguous "
                        f"runs of {group_size} channels")
    return MaskInfo(root=root, groups=groups, group_size=group_size, var=var)
