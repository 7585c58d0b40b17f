"""LowerGatedLayers: replace router-gated FFN and attention output projections with block-sparse kernels.

Gated SwiGLU FFN  ->  mask_reorder + gemm_mn (gate/up, SwiGLU epilogue) + gemm_k (down)
Gated attention   ->  attention stays dense; mask gating + o_proj -> mask_reorder + gemm_k
The router itself (and its argmax) stays in the graph: its mask feeds the kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.dpl import rewrite_call

from ..kernel_knobs import kernel_key
from ..schedules import gemm_k, gemm_mn, mask_reorder
from ..schedules.gemv import GemvKnobs
from ..schedules.tiles import TileConfig
from ..schedules.root_block import with_root_block
from .mask_analysis import MaskInfo, analyse_mask, op_name, resolve
from .patterns import gated_projection, gated_swiglu_ffn


@dataclass
class GatedLayer:
    """One lowered gated layer, for the compile summary."""

    kind: str  # "ffn" | "attention" | "projection"
    groups: int
    group_size: int
    kernels: list[str]
    weights: list[str]


@dataclass
class _State:
    target_kind: str
    var2val: dict
    builder: relax.BlockBuilder
    knobs: dict = field(default_factory=dict)  # kernel key -> tuned knobs (wide_tvm.kernel_knobs)
    params: tuple = ()  # the function's parameters (weights among them)
    folded: dict = field(default_factory=dict)  # weight param -> its [K, N] replacement (CPU gemm_k)
    kernels: dict = field(default_factory=dict)  # name -> GlobalVar, shared by the module's functions
    layers: list = field(default_factory=list)

    def kernel(self, name: str, build) -> tvm.ir.GlobalVar:
        if name not in self.kernels:
            func = with_root_block(build()).with_attr("global_symbol", name).with_attr("tirx.is_scheduled", True)
            self.kernels[name] = self.builder.add_func(func, name)
        return self.kernels[name]


def _weight(expr, var2val):
    """(weight tensor, layout) with layout "nk" for permute_dims(W[N, K]) and "kn" for a plain W[K, N]."""
    value = resolve(expr, var2val)
    if op_name(value) == "relax.permute_dims" and len(value.args[0].ty.shape.values) == 2:
        axes = value.attrs.axes
        if axes is not None and [int(a) for a in axes] == [1, 0]:
            return value.args[0], "nk"
    return expr, "kn"


def _weight_dims(weight, layout: str) -> tuple[int, int] | None:
    """(N, K) of a weight tensor stored in `layout`."""
    if weight.ty.shape is None:
        return None
    rows, cols = (int(d) for d in weight.ty.shape.values)
    return (rows, cols) if layout == "nk" else (cols, rows)


def _name(expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else "<expr>"


def _strip_reshape(expr, var2val):
    value = resolve(expr, var2val)
    while op_name(value) == "relax.reshape":
        expr = value.args[0]
        value = resolve(expr, var2val)
    return expr


def _tokens_and_channels(expr) -> tuple[tvm.ir.PrimExpr, int] | None:
    shape = expr.ty.shape
    if shape is None:
        return None
    dims = list(shape.values)
    if not isinstance(dims[-1], tvm.tirx.IntImm):
        return None
    tokens = dims[0]
    for d in dims[1:-1]:
        tokens = tokens * d
    return tokens, int(dims[-1])


def _flat_mask(info: MaskInfo, tokens) -> relax.Expr:
    return relax.op.astype(relax.op.reshape(info.root, relax.ShapeExpr([tokens, info.groups])), "int32")


def _is_attention(operand, var2val, depth: int = 10) -> bool:
    """The gated operand is an attention output: a softmax within a few producers upstream."""
    frontier = [operand]
    for _ in range(depth):
        nxt = []
        for expr in frontier:
            value = resolve(expr, var2val)
            if op_name(value) == "relax.nn.softmax":
                return True
            if isinstance(value, relax.Call):
                nxt.extend(a for a in value.args if isinstance(a, relax.Var))
        frontier = nxt
    return False


def _tuned(state: _State, kind: str, groups: int, group_size: int, dim: int, dtype: str) -> dict:
    """Keyword arguments with the tuned knobs of one kernel, {} when the tuning log has none."""
    entry = state.knobs.get(kernel_key(kind, groups, group_size, dim, dtype))
    if not entry:
        return {}
    if state.target_kind == "cuda" and "decode" in entry:
        return {"decode_knobs": tuple(GemvKnobs(*wu) for wu in entry["decode"])}
    if state.target_kind == "llvm" and "cpu" in entry:
        return {"cpu_tile": TileConfig(**entry["cpu"])}
    return {}


def _reorder_call(state: _State, info: MaskInfo, tokens):
    """(kernel name, call) of the mask reorder: counts [G], order [G, tokens], used [G + 1]."""
    G = info.groups
    name = f"wide_mask_reorder_g{G}"
    gv = state.kernel(name, lambda: mask_reorder(G, state.target_kind))
    call = relax.call_tir(gv, [_flat_mask(info, tokens)],
                          out_ty=[relax.TensorType([G], "int32"), relax.TensorType([G, tokens], "int32"),
                                  relax.TensorType([G + 1], "int32")])
    return name, call


def _fold_to_kn(state: _State, weight):
    """On the CPU, a [N, K] weight parameter of gemm_k becomes a [K, N] parameter (the compiler transposes
    the stored array once): a group's K-slice is then one contiguous block instead of a strided column."""
    if state.target_kind != "llvm" or not any(weight.same_as(p) for p in state.params):
        return None
    if weight not in state.folded:
        rows, cols = (int(d) for d in weight.ty.shape.values)
        state.folded[weight] = relax.Var(weight.name, relax.TensorType([cols, rows], weight.ty.dtype))
    return state.folded[weight]


def _gemm_k_call(state: _State, a2, tokens, dtype: str, weight_expr, info: MaskInfo, used, out_expr):
    """(a2 [tokens, K] * mask) @ W through gemm_k, reshaped like `out_expr`; (None, None) if W does not fit."""
    weight, layout = _weight(weight_expr, state.var2val)
    n_dim, k_dim = _weight_dims(weight, layout)
    if k_dim != info.groups * info.group_size or str(weight.ty.dtype) != dtype:
        return None, None
    folded = _fold_to_kn(state, weight) if layout == "nk" else None
    if folded is not None:
        weight, layout = folded, "kn"
    name = f"wide_gemm_k_g{info.groups}x{info.group_size}_n{n_dim}_{dtype}_{layout}"
    extra = _tuned(state, "gemm_k", info.groups, info.group_size, n_dim, dtype)
    gv = state.kernel(name, lambda: gemm_k(info.groups, info.group_size, n_dim, dtype, layout, state.target_kind,
                                           **extra))
    y = relax.call_tir(gv, [a2, weight, _flat_mask(info, tokens), used],
                       out_ty=relax.TensorType([tokens, n_dim], dtype))
    return relax.op.reshape(y, out_expr.ty.shape), (name, weight)


def _channels_of(weight_expr, var2val) -> int | None:
    dims = _weight_dims(*_weight(weight_expr, var2val))
    return dims[1] if dims else None


def _rewrite_ffn(state: _State, pat):
    def callback(expr, m):
        v2v = state.var2val
        k = _channels_of(m[pat.proj.weight], v2v)
        info = analyse_mask(m[pat.proj.mask], m[pat.act], k, v2v) if k else None
        if info is None:
            return expr
        xg, xu = _strip_reshape(m[pat.x_gate], v2v), _strip_reshape(m[pat.x_up], v2v)
        if not xg.same_as(xu):
            return expr
        wg, lg = _weight(m[pat.w_gate], v2v)
        wu, lu = _weight(m[pat.w_up], v2v)
        tc = _tokens_and_channels(xg)
        if lg != lu or tc is None or str(wg.ty.dtype) != str(xg.ty.dtype):
            return expr
        tokens, hidden = tc
        dtype = str(xg.ty.dtype)
        G, gs = info.groups, info.group_size
        reorder_name, reorder = _reorder_call(state, info, tokens)
        mn_name = f"wide_gemm_mn_swiglu_g{G}x{gs}_k{hidden}_{dtype}_{lg}"
        extra = _tuned(state, "gemm_mn_swiglu", G, gs, hidden, dtype)
        gv_mn = state.kernel(mn_name, lambda: gemm_mn(G, gs, hidden, dtype, lg, True, state.target_kind, **extra))
        x2 = relax.op.reshape(xg, relax.ShapeExpr([tokens, hidden]))
        h = relax.call_tir(gv_mn, [x2, wg, wu, relax.TupleGetItem(reorder, 0), relax.TupleGetItem(reorder, 1)],
                           out_ty=relax.TensorType([tokens, G * gs], dtype))
        out, down = _gemm_k_call(state, h, tokens, dtype, m[pat.proj.weight], info,
                                 relax.TupleGetItem(reorder, 2), expr)
        if out is None:
            return expr
        state.layers.append(GatedLayer("ffn", G, gs, [reorder_name, mn_name, down[0]],
                                       [_name(wg), _name(wu), _name(down[1])]))
        return out

    return callback


def _rewrite_projection(state: _State, pat):
    def callback(expr, m):
        v2v = state.var2val
        k = _channels_of(m[pat.weight], v2v)
        info = analyse_mask(m[pat.mask], m[pat.operand], k, v2v) if k else None
        if info is None:
            return expr
        operand = m[pat.operand]
        tc = _tokens_and_channels(operand)
        if tc is None:
            return expr
        tokens, _ = tc
        a2 = relax.op.reshape(operand, relax.ShapeExpr([tokens, k]))
        reorder_name, reorder = _reorder_call(state, info, tokens)
        out, kern = _gemm_k_call(state, a2, tokens, str(operand.ty.dtype), m[pat.weight], info,
                                 relax.TupleGetItem(reorder, 2), expr)
        if out is None:
            return expr
        kind = "attention" if _is_attention(m[pat.operand], v2v) else "projection"
        state.layers.append(GatedLayer(kind, info.groups, info.group_size, [reorder_name, kern[0]],
                                       [_name(kern[1])]))
        return out

    return callback


def _replace_params(func: relax.Function, folded: dict) -> relax.Function:
    """`func` with each folded parameter swapped for its [K, N] replacement; any other use of the old
    parameter reads it back through a transpose."""
    params = [folded.get(p, p) for p in func.params]
    body = func.body
    still_used = [p for p in folded if any(p.same_as(v) for v in relax.analysis.free_vars(body))]
    if still_used:
        back = relax.BindingBlock([relax.VarBinding(p, relax.op.permute_dims(folded[p])) for p in still_used])
        body = relax.SeqExpr([back, *body.blocks], body.body)
    return relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)


@tvm.transform.module_pass(opt_level=0, name="LowerGatedLayers")
class LowerGatedLayers:
    """Find router-gated layers with dpl patterns and lower them; `self.layers` reports what was lowered."""

    def __init__(self, target_kind: str, enabled: bool = True, knobs: dict | None = None):
        self.target_kind = target_kind
        self.enabled = enabled
        self.knobs = knobs or {}
        self.transposed: set[str] = set()  # weight parameters now expected as [K, N] (the compiler transposes them)
        self.layers: list[GatedLayer] = []

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled:
            return mod
        builder = relax.BlockBuilder(mod)
        kernels: dict = {}
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            state = _State(self.target_kind, relax.analysis.get_var2val(func), builder, self.knobs,
                           tuple(func.params), kernels=kernels)
            ffn = gated_swiglu_ffn()
            func = rewrite_call(ffn.root, _rewrite_ffn(state, ffn), func)
            state.var2val = relax.analysis.get_var2val(func)
            proj = gated_projection()
            func = rewrite_call(proj.root, _rewrite_projection(state, proj), func)
            if state.folded:
                func = _replace_params(func, state.folded)
                self.transposed.update(p.name for p in state.folded)
            builder.update_func(gv, func)
            self.layers.extend(state.layers)
        return builder.get()
