"""Routers whose gates the lowering left dense, each named, with the node where recognition stopped.

A router is found by what it computes, independent of the gate recognition (mask_analysis): a two-way decision
over a tensor whose last axis is 2 (WIDE's `[.., G, 2]` view of `router(compressor(x))`), reduced by an argmax /
argmin, or compared as two logits (slices of the pair). A router is lowered when the gate of some lowered layer
derives from its decision. For every other router, `unlowered_gates` says where its gate stopped: the mismatch
the lowering recorded for a multiply the gate reaches, else the first node past the gate's derivation and
expansion that is neither.

    >>> [str(g) for g in unlowered_gates(func, var2val, used, mismatches)]      # doctest: +SKIP
    ['router layers.0.router_ffn.router.weight (6 groups): gate not lowered, at lv57 = relax.multiply: the
      expansion of the 6-group gate does not broadcast over 192 channels of a tensor shaped [1, 1, 3, 64]']
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
from tvm import relax

from .mask_analysis import (ARITHMETIC, COMPARISONS, DECISIONS, LAYOUT_OPS, Mismatch, axis_size, node_name,
                            op_name, resolve, users_of)

# ops a gate passes through between its decision and the multiply (mask_analysis follows each)
_GATE_OPS = LAYOUT_OPS | COMPARISONS | set(ARITHMETIC) | {"relax.logical_not", "relax.where"}
_SLICES = {"relax.strided_slice", "relax.take"}


@dataclass
class UnloweredGate:
    """A router whose gate runs dense: its weight (the router's name in the model), groups, and why."""

    router: str
    groups: int
    node: str
    reason: str

    def __str__(self) -> str:
        return f"router {self.router} ({self.groups} groups): gate not lowered, at {self.node}: {self.reason}"

    def to_json(self) -> dict:
        return {"router": self.router, "groups": self.groups, "node": self.node, "reason": self.reason}


def _last_dim(expr) -> int | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not ty.shape.values:
        return None
    d = ty.shape.values[-1]
    return int(d) if hasattr(d, "value") else None


def _is_pair(expr, var2val) -> bool:
    """Whether `expr` is (behind layout ops, a softmax or sigmoid) a slice of a tensor whose last axis is 2."""
    value = resolve(expr, var2val)
    while op_name(value) in LAYOUT_OPS | {"relax.nn.softmax", "relax.sigmoid"}:
        value = resolve(value.args[0], var2val)
    return op_name(value) in _SLICES and _last_dim(value.args[0]) == 2


def find_routers(func: relax.Function, var2val: dict) -> list[relax.Var]:
    """The variables bound to router decisions in `func`, in binding order."""
    out = []
    for var, value in var2val.items():
        op = op_name(value)
        if op in DECISIONS and axis_size(value) == 2:
            out.append(var)
        elif op in COMPARISONS and any(_is_pair(a, var2val) for a in value.args):
            out.append(var)
    return out


def router_name(decision: relax.Var, var2val: dict, params: tuple, depth: int = 12) -> str:
    """The router a decision reads, by the parameters of its linear layers: the first one upstream whose name the
    exporter kept (`layers.0.router_ffn.router.bias` -> `layers.0.router_ffn.router`; ONNX exports may name weights
    `val_151`), else the decision's variable."""
    by_id = {id(p): p for p in params}
    frontier, found = [decision], []
    for _ in range(depth):
        nxt = []
        for expr in frontier:
            value = resolve(expr, var2val)
            if isinstance(value, relax.Call):
                for a in value.args:
                    if isinstance(a, relax.Var) and any(a.same_as(p) for p in by_id.values()):
                        found.append(a.name)
                    elif isinstance(a, relax.Var):
                        nxt.append(a)
        frontier = nxt
    named = [n for n in found if not re.fullmatch(r"(val|onnx\w*)_\d+", n)]
    if not named:
        return found[0] if found else decision.name
    return re.sub(r"([._](weight|bias))$", "", named[0])


def derivation_vars(root, var2val) -> set:
    """Every variable the gate `root` is computed from through gate ops (its decisions among them)."""
    seen, stack = set(), [root]
    while stack:
        expr = stack.pop()
        if isinstance(expr, relax.Var):
            if expr in seen:
                continue
            seen.add(expr)
        value = resolve(expr, var2val)
        if op_name(value) in _GATE_OPS | DECISIONS | _SLICES:
            stack.extend(a for a in value.args if isinstance(a, (relax.Var, relax.Call)))
    return seen


def _stop_of(decision, var2val, users, mismatches: dict) -> tuple[str, str]:
    """(node, reason) where the decision's gate stopped: a recorded mismatch of a multiply it reaches, else the
    first node past its derivation and expansion."""
    frontier, seen = [decision], set()
    while frontier:
        var = frontier.pop(0)
        for user in users.get(var, []):
            if user in seen:
                continue
            seen.add(user)
            if user in mismatches:
                miss: Mismatch = mismatches[user]
                return miss.node, miss.reason
            value = var2val[user]
            op = op_name(value)
            if op in _GATE_OPS - {"relax.multiply"} or (op == "relax.multiply" and _constant_factor(value)):
                frontier.append(user)
                continue
            what = ("the gated tensor is not a SwiGLU intermediate (silu(x @ Wg) * (x @ Wu)) or an attention "
                    "output whose matmul with a 2-D weight the lowering recognises") if op == "relax.multiply" \
                else "the gate is used here, which is neither part of its derivation nor of its expansion"
            return node_name(user, value), what
    return decision.name, "the gate is never multiplied into a layer"


def _constant_factor(value) -> bool:
    return any(isinstance(a, tvm.ir.GenericConst) for a in value.args)


def unlowered_gates(func: relax.Function, var2val: dict, used: set, mismatches: dict) -> list[UnloweredGate]:
    """The routers of `func` (find_routers) none of whose gates the lowering used (`used`: the derivation_vars of
    the lowered layers' gates, taken when they were lowered); `mismatches`: variable of a gated multiply -> the
    Mismatch the lowering found there."""
    users = users_of(var2val)
    out = []
    for decision in find_routers(func, var2val):
        if decision in used:
            continue
        groups = _last_dim(decision)
        node, reason = _stop_of(decision, var2val, users, mismatches)
        out.append(UnloweredGate(router_name(decision, var2val, tuple(func.params)), groups or 0, node, reason))
    return out
