"""Relax dataflow patterns (tvm.relax.dpl) of router-gated layers, one per gated-layer kind.

They describe the arithmetic only; whether the multiplier really is a router mask expanded over
channel groups is checked afterwards by `mask_analysis.analyse_mask`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.relax.dpl import DFPattern, is_op, wildcard


def _opt_reshape(p: DFPattern) -> DFPattern:
    """p, or p behind one or two reshapes (torch.export writes [1, T, C] -> [T, C] around each linear)."""
    once = is_op("relax.reshape")(p, wildcard())
    return p | once | is_op("relax.reshape")(once, wildcard())


def _opt_cast(p: DFPattern) -> DFPattern:
    """p, or p cast (torch.export writes an fp16 / bf16 silu as fp32 math between two astype)."""
    return p | is_op("relax.astype")(p)


def _mul(a: DFPattern, b: DFPattern) -> DFPattern:
    return is_op("relax.multiply")(a, b) | is_op("relax.multiply")(b, a)


def _linear(x: DFPattern, w: DFPattern) -> DFPattern:
    """x @ w as exporters write it: optional reshapes around a matmul."""
    return _opt_reshape(is_op("relax.matmul")(_opt_reshape(x), w))


@dataclass
class GatedProjection:
    """`matmul(reshape?(operand * mask_e), weight)`: a reduction over mask-gated channel groups."""

    root: DFPattern
    operand: DFPattern
    mask: DFPattern
    weight: DFPattern
    gated: DFPattern


def gated_projection() -> GatedProjection:
    operand, mask, weight = wildcard(), wildcard(), wildcard()
    gated = _mul(_opt_reshape(operand), mask)
    root = is_op("relax.matmul")(_opt_reshape(gated), weight)
    return GatedProjection(root=root, operand=operand, mask=mask, weight=weight, gated=gated)


@dataclass
class GatedSwiGLU:
    """`down(mask_e * silu(x @ w_gate) * (x @ w_up))`, silu written as nn.silu or x * sigmoid(x), also in fp32
    between casts (torch.export's fp16 / bf16 silu: astype(g * sigmoid(g), f16) with g = astype(gate, f32))."""

    root: DFPattern
    x_gate: DFPattern
    x_up: DFPattern
    w_gate: DFPattern
    w_up: DFPattern
    act: DFPattern
    proj: GatedProjection


def gated_swiglu_ffn() -> GatedSwiGLU:
    x_gate, x_up, w_gate, w_up = wildcard(), wildcard(), wildcard(), wildcard()
    gate = _linear(x_gate, w_gate)
    up = _linear(x_up, w_up)
    g = _opt_cast(gate)
    silu = _opt_cast(is_op("relax.nn.silu")(g) | _mul(g, is_op("relax.sigmoid")(g)))
    act = _mul(silu, up)
    mask, w_down = wildcard(), wildcard()
    gated = _mul(_opt_reshape(act), mask)
    root = is_op("relax.matmul")(_opt_reshape(gated), w_down)
    proj = GatedProjection(root=root, operand=act, mask=mask, weight=w_down, gated=gated)
    return GatedSwiGLU(root=root, x_gate=x_gate, x_up=x_up, w_gate=w_gate, w_up=w_up, act=act, proj=proj)
