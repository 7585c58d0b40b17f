"""LowerGatedLayers: replace router-gated FFN and attention projections with block-sparse kernels.

Gated SwiGLU FFN  ->  mask_reorder + gemm_mn (gate/up, SwiGLU epilogue) + gemm_k (down)
Gated attention   ->  attention stays dense; mask gating + o_proj -> mask_reorder + gemm_k, and q_proj ->
                      mask_reorder + gemm_mn where its head groups feed only their own (query_projection.py)
(on CUDA gemm_k reads the mask itself, so a reorder only it consumes launches nothing)
The router itself (and its argmax) stays in the graph: its mask feeds the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..knobs import UNREAD
from ..errors import WideError
from ..kernel_spec import KernelSpec, kernel_layout
from ..blas import DTYPES as BLAS_DTYPES
from ..fallback import decide as decide_fallback
from ..schedules import gemm_k, gemm_mn, gemm_mn_reorder_bound, mask_reorder
from ..schedules.dense_fallback import BLAS_HELPER, blas_helper, with_dense_fallback
from ..knobs import decode_knobs
from ..knobs import DEFAULT_TILES, tile_knobs
from ..weight_layout import TC_CHUNK, TC_ROWS, stored_shape
from ..schedules.tiles import tiles_from_log
from ..tuning.nearest import knobs_entry
from ..schedules.root_block import with_root_block
from ..schedules.launch_bounds import as_built
from .head_mask import masked_in_transpose
from .gate_report import UnloweredGate, derivation_vars, unlowered_gates
from .mask_analysis import MaskInfo, Mismatch, analyse_mask, op_name, resolve, strip_reshapes
from .patterns import gated_projection, gated_swiglu_ffn
from .query_projection import binding_order, find_query_projection, vars_read


@dataclass
class GatedLayer:
    """One lowered gated layer: what it runs (`kernels`: every kernel's symbol, mask reorders included; `specs`: the
    gated GEMMs as kernel_spec.KernelSpec) on which weights."""

    kind: str  # "ffn" | "attention" | "projection"
    groups: int
    group_size: int
    kernels: list[str]
    weights: list[str]
    specs: list[KernelSpec] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"kind": self.kind, "groups": self.groups, "group_size": self.group_size, "kernels": self.kernels,
                "weights": self.weights, "specs": [vars(s) for s in self.specs]}


@dataclass
class GatedPlan:
    """What LowerGatedLayers lowered in a module, as data: the layers, and each weight parameter the kernels read in
    another layout (name -> (layout as stored, layout the kernels read); the compiler repacks the arrays once)."""

    layers: list[GatedLayer] = field(default_factory=list)
    repacked: dict[str, tuple[str, str]] = field(default_factory=dict)
    unlowered: list[UnloweredGate] = field(default_factory=list)  # routers whose gates stay dense, and why
    derived: dict[str, str] = field(default_factory=dict)  # untuned kernel key -> the tuned key whose knobs it took
    # kernel symbol -> (token ranges on the dense fallback, where they come from: wide_tvm/fallback.py)
    fallbacks: dict[str, tuple] = field(default_factory=dict)
    # parameter a dense fallback reads as stored -> (its repacked copy's name, its layout, the copy's): the original
    # stays a parameter, and the compiler adds the copy right after it
    copies: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    @property
    def kernels(self) -> list[KernelSpec]:
        """Every distinct gated GEMM of the plan, by key (what wide-tune tunes)."""
        specs = {s for layer in self.layers for s in layer.specs}
        return sorted(specs, key=lambda s: (s.key, s.layout))


@dataclass
class _QueryPlan:
    """A gated attention's query projection (`call`: x @ Wq) to lower with the attention's mask."""

    call: relax.Call
    info: MaskInfo
    weight: relax.Var  # as the kernel reads it (repacked where that pays)
    layout: str
    stored: tuple  # (weight, layout) as the model stores it (what a dense fallback reads)
    hidden: int
    layer: GatedLayer  # the attention's summary entry, which gains the query kernels


@dataclass
class _State:
    target_kind: str
    var2val: dict
    builder: relax.BlockBuilder
    knobs: dict = field(default_factory=dict)  # kernel key -> tuned knobs (tuning/database.py: load)
    params: tuple = ()  # the function's parameters (weights among them)
    repacked: dict = field(default_factory=dict)  # weight param -> (replacement param, source layout, layout)
    kernels: dict = field(default_factory=dict)  # name -> GlobalVar, shared by the module's functions
    layers: list = field(default_factory=list)
    func: relax.Function | None = None  # the function being rewritten (binding order for query_projection)
    queries: list = field(default_factory=list)  # _QueryPlan of each gated attention's query projection
    wgmma: bool = False  # the target compiles Hopper wgmma (sm_90a): tuned wgmma tile picks are kept
    dependent: bool = False  # kernels launched as programmatic dependents (sm_90 on: schedules/dependent_launch.py)
    build: bool = True  # False: plan only (every kernel an empty stand-in; the module is not for compiling)
    used: set = field(default_factory=set)  # the variables every lowered layer's gate is derived from
    mismatches: dict = field(default_factory=dict)  # gated multiply's variable -> why its gate was not lowered
    derived: dict = field(default_factory=dict)  # untuned kernel key -> tuned key whose knobs it took (nearest.py)
    fallback: str = "off"  # dense fallback mode (wide_tvm/fallback.py: MODES)
    crossovers: dict = field(default_factory=dict)  # kernel key -> measured crossover entry (fallback.py)
    fallbacks: dict = field(default_factory=dict)  # kernel symbol -> (ranges, source)
    keep: set = field(default_factory=set)  # repacked parameters a dense fallback still reads as stored
    helper: dict = field(default_factory=dict)  # "dtype": the one dtype the module's BLAS helper is built for

    def analyse(self, gated, mask, channels: int | None) -> MaskInfo | None:
        """mask_analysis.analyse_mask of the multiply `gated` (mask times the other factor), recording a mismatch
        under the multiply's variable for the report of unlowered gates."""
        if not channels:
            return None
        value = resolve(gated, self.var2val)
        factor = next((a for a in value.args if not a.same_as(mask)), value.args[0])
        info = analyse_mask(mask, factor, channels, self.var2val)
        if isinstance(info, Mismatch):
            var = gated if isinstance(gated, relax.Var) else next(
                (v for v, b in self.var2val.items() if b.same_as(value)), None)
            if var is not None:
                self.mismatches.setdefault(var, info)
            return None
        return info

    def function(self, name: str, func: tvm.tirx.PrimFunc) -> tvm.ir.GlobalVar:
        """An unscheduled PrimFunc added once by `name` (fused and scheduled by the pipeline as TVM's own are)."""
        if name not in self.kernels:
            self.kernels[name] = self.builder.add_func(func, name)
        return self.kernels[name]

    def kernel(self, name: str, build) -> tvm.ir.GlobalVar:
        if name not in self.kernels:
            func = as_built(build(), self.dependent) if self.build else tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
            func = with_root_block(func).with_attr("global_symbol", name).with_attr("tirx.is_scheduled", True)
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
    shape = weight.ty.shape if isinstance(weight.ty, relax.TensorType) else None
    if shape is None or len(shape.values) != 2 or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None  # (a batched or symbolic operand: attention's probs @ v, not a weight)
    rows, cols = (int(d) for d in shape.values)
    return (rows, cols) if layout == "nk" else (cols, rows)


def _name(expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else "<expr>"


def _tokens_and_channels(expr, channels: int | None = None) -> tuple[tvm.ir.PrimExpr, int] | None:
    """(rows, channels) of `expr` seen as a [rows, channels] matrix: channels its last dimension, or the given
    count, which trailing static dimensions must make up exactly (a gated attention output [1, T, G, gs] read as
    [T, G * gs]); None when the shape does not split so."""
    shape = expr.ty.shape
    if shape is None:
        return None
    dims = list(shape.values)
    tail = 1
    while dims and (tail < channels if channels else tail == 1):
        d = dims.pop()
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        tail *= int(d)
    if not dims or (channels and tail != channels):
        return None
    tokens = dims[0]
    for d in dims[1:]:
        tokens = tokens * d
    return tokens, tail


def _flat_mask(info: MaskInfo, tokens) -> relax.Expr:
    return relax.op.astype(relax.op.reshape(info.root, relax.ShapeExpr([tokens, info.groups])), "int32")


ATTENTION_OPS = {"relax.nn.softmax", "relax.nn.attention", "relax.nn.attention_bias", "relax.nn.attention_var_len"}


def _is_attention(operand, var2val, depth: int = 64) -> bool:
    """The gated operand is an attention output: a softmax (or an attention op) upstream of it, found without
    crossing a linear layer (a matmul with a 2-D weight), so another layer's attention never counts."""
    frontier, seen = [operand], set()
    for _ in range(depth):
        nxt = []
        for expr in frontier:
            value = resolve(expr, var2val)
            if op_name(value) in ATTENTION_OPS:
                return True
            if op_name(value) == "relax.matmul" and _weight_dims(*_weight(value.args[1], var2val)) is not None:
                continue
            if isinstance(value, relax.Call):
                for a in value.args:
                    if isinstance(a, relax.Var) and a not in seen:
                        seen.add(a)
                        nxt.append(a)
        frontier = nxt
    return False


def _tuned(state: _State, kind: str, groups: int, group_size: int, dim: int, dtype: str) -> dict:
    """Keyword arguments with the tuned knobs of one kernel: its own entry, else those of the nearest tuned shape's
    that fit it (tuning/nearest.py), {} when there is neither."""
    spec = KernelSpec.planned(kind, groups, group_size, dim, dtype, state.target_kind)
    entry, source = knobs_entry(state.knobs, spec, state.wgmma)
    if not entry:
        return {}
    if source:
        state.derived[spec.key] = source
    try:
        return _knob_arguments(state, kind, entry)
    except (TypeError, ValueError, KeyError) as err:
        raise WideError(f"tuning log entry {source or spec.key}: unusable knobs ({err}); re-tune it or delete the "
                        "entry") from None


def _knob_arguments(state: _State, kind: str, entry: dict) -> dict:
    if state.target_kind == "cuda":
        return {**({"decode_knobs": decode_knobs(entry["decode"])} if "decode" in entry else {}),
                "tile_knobs": tile_knobs(entry.get("tiles"), state.wgmma, kind)}
    if state.target_kind == "llvm" and "cpu" in entry:
        return {"cpu_tile": tiles_from_log(entry["cpu"])}
    return {}


def _reorder_bound(state: _State, mn_layout: str | None, mn_knobs: dict | None = None) -> int:
    """Token counts up to which no consumer reads the mask reorder, so it launches nothing: on CUDA, where the
    reorder feeds a tensor-core gemm_mn (`mn_layout` "tc", `mn_knobs` its _tuned keywords), up to its direct
    kernels and the many-token kernels that sort their tokens themselves (schedules.gemm_mn_reorder_bound), or every
    count where it feeds gemm_k alone (`mn_layout` None); on the CPU none (its gemm_k walks the reorder's lists)."""
    if state.target_kind != "cuda":
        return 0
    if mn_layout is None:
        return UNREAD
    if mn_layout != "tc":
        return 0
    return gemm_mn_reorder_bound((mn_knobs or {}).get("tile_knobs", DEFAULT_TILES))


def _reorder_call(state: _State, info: MaskInfo, tokens, direct_tokens: int):
    """(kernel name, call) of the mask reorder: counts [G], order [G, tokens], used [G + 1]. `direct_tokens`:
    up to this many tokens no consumer reads it (_reorder_bound), so it runs nothing."""
    G = info.groups
    name = f"wide_mask_reorder_g{G}" + ("_unread" if direct_tokens == UNREAD
                                        else f"_d{direct_tokens}" if direct_tokens else "")
    gv = state.kernel(name, lambda: mask_reorder(G, state.target_kind, direct_tokens))
    call = relax.call_tir(gv, [_flat_mask(info, tokens)],
                          out_ty=[relax.TensorType([G], "int32"), relax.TensorType([G, tokens], "int32"),
                                  relax.TensorType([G + 1], "int32")])
    return name, call


def _repack(state: _State, weight, layout: str, want: str):
    """A weight parameter stored in `layout` becomes a parameter in the `want` layout (the compiler repacks
    the stored array once, wide_tvm/weight_layout.py): "kp" (or "kn") for CPU gemm_k (a group's K-slice of a
    task's columns is one contiguous run instead of a strided column), "tc" tensor-core tiles for the CUDA fp16 kernels.
    None when `weight` is not a parameter (computed weights keep their layout)."""
    if not any(weight.same_as(p) for p in state.params):
        return None
    if weight not in state.repacked:
        n, k = _weight_dims(weight, layout)
        new = relax.Var(weight.name, relax.TensorType(list(stored_shape(want, n, k)), weight.ty.dtype))
        state.repacked[weight] = (new, layout, want)
    new, _, have = state.repacked[weight]
    return new if have == want else None


def _kernel_layout(state: _State, weights: list, layout: str, kind: str, group_size: int, dim: int, dtype: str):
    """(weights, layout) the kernel of `kind` reads: the layout kernel_spec.kernel_layout decides (repacked where
    the weights are parameters), otherwise unchanged."""
    want = kernel_layout(kind, group_size, dim, dtype, state.target_kind)
    if want is None or want == layout:
        return weights, layout
    new = [_repack(state, w, layout, want) for w in weights]
    return (new, want) if all(v is not None for v in new) else (weights, layout)


def _gemm_k_plan(state: _State, weight_expr, info: MaskInfo, dtype: str):
    """(weight, layout, N, (weight, layout) as stored) gemm_k will read (repacked where that pays), or None if W
    does not fit."""
    stored, stored_layout = _weight(weight_expr, state.var2val)
    dims = _weight_dims(stored, stored_layout)
    if dims is None:
        return None
    n_dim, k_dim = dims
    if k_dim != info.groups * info.group_size or str(stored.ty.dtype) != dtype:
        return None
    (weight,), layout = _kernel_layout(state, [stored], stored_layout, "gemm_k", info.group_size, n_dim, dtype)
    return weight, layout, n_dim, (stored, stored_layout)


def _fallback_ranges(state: _State, spec: KernelSpec, dense: list) -> tuple:
    """Token ranges on which the kernel `spec` runs its dense fallback (wide_tvm/fallback.py), () for none: the mode
    is off, the target's BLAS does not take the dtype, a weight is not a 2-D [N, K] / [K, N] array, or the module's
    BLAS helper is already built for another dtype."""
    if state.fallback == "off" or spec.dtype not in BLAS_DTYPES.get(state.target_kind, ()):
        return ()
    if any(layout not in ("nk", "kn") for _, layout in dense):
        return ()
    if state.helper.setdefault("dtype", spec.dtype) != spec.dtype:
        return ()
    ranges, source = decide_fallback(spec.key, spec.kind, state.target_kind, state.fallback, state.crossovers)
    if ranges:
        state.fallbacks[spec.symbol] = (ranges, source)
    return ranges


def _gated_call(state: _State, spec: KernelSpec, build, args: list, dense: list, out_ty, masked_input: bool = False,
                masked_output: bool = True):
    """(call_tir of the gated kernel `spec`, built by `build`, on `args`; the symbol it calls): through the kernel's
    dense fallback (schedules/dense_fallback.py) where one is decided, which also reads `dense`, the weights as the
    model stores them ([(var, "nk" / "kn")]; repacked parameters among them stay parameters too)."""
    gv = state.kernel(spec.symbol, build)
    ranges = _fallback_ranges(state, spec, dense)
    if not ranges:
        return relax.call_tir(gv, args, out_ty=out_ty), spec.symbol
    state.kernel(BLAS_HELPER, lambda: blas_helper(spec.dtype, state.target_kind))
    name = f"{spec.symbol}_dense{'_in' if masked_input else ''}{'' if masked_output else '_unmasked'}"
    funcs = with_dense_fallback(name, spec.symbol, spec.kind, spec.groups, spec.group_size, spec.dim, spec.dtype,
                                stored_shape(spec.layout, spec.n, spec.k), dense[0][1], state.target_kind, ranges,
                                masked_input, masked_output) if name not in state.kernels else {}
    for func_name, func in funcs.items():
        state.kernel(func_name, lambda func=func: func)
    wrapper = state.kernels[name]
    for var, _ in dense:
        if var in state.repacked:
            state.keep.add(var)
    return relax.call_tir(wrapper, [*args, *(var for var, _ in dense)], out_ty=out_ty), name


def _gemm_k_call(state: _State, a2, tokens, dtype: str, plan, info: MaskInfo, reorder, out_expr,
                 masked_input: bool = False, masked=None):
    """(a2 [tokens, K] * mask) @ W through gemm_k, reshaped like `out_expr`, and (kernel name, weight, spec).
    `masked_input`: a2 is already zero where a token skips a group (a gemm_mn of the same mask wrote it).
    `masked`: () -> a2 * mask [tokens, K] computed where it costs nothing, or None: what the kernel reads instead
    where a dense fallback is decided (the fallback then needs no masking pass of its own; the gated kernel skips
    those groups anyway)."""
    weight, layout, n_dim, stored = plan
    spec = KernelSpec("gemm_k", info.groups, info.group_size, n_dim, dtype, layout)
    if masked is not None and not masked_input and _fallback_ranges(state, spec, [stored]):
        a2_masked = masked()
        if a2_masked is not None:
            a2, masked_input = a2_masked, True
    extra = _tuned(state, "gemm_k", info.groups, info.group_size, n_dim, dtype)
    reordered = [relax.TupleGetItem(reorder, i) for i in range(3)]  # counts, order, used
    y, name = _gated_call(state, spec, lambda: gemm_k(info.groups, info.group_size, n_dim, dtype, layout,
                                                      state.target_kind, **extra),
                          [a2, weight, _flat_mask(info, tokens), *reordered], [stored],
                          relax.TensorType([tokens, n_dim], dtype), masked_input=masked_input)
    return relax.op.reshape(y, out_expr.ty.shape), (name, weight, spec)


def _channels_of(weight_expr, var2val) -> int | None:
    dims = _weight_dims(*_weight(weight_expr, var2val))
    return dims[1] if dims else None


def _rewrite_ffn(state: _State, pat):
    def callback(expr, m):
        v2v = state.var2val
        info = state.analyse(m[pat.proj.gated], m[pat.proj.mask], _channels_of(m[pat.proj.weight], v2v))
        if info is None:
            return expr
        xg, xu = strip_reshapes(m[pat.x_gate], v2v), strip_reshapes(m[pat.x_up], v2v)
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
        down_plan = _gemm_k_plan(state, m[pat.proj.weight], info, dtype)
        if down_plan is None:
            return expr
        stored = [(wg, lg), (wu, lg)]
        (wg, wu), lg = _kernel_layout(state, [wg, wu], lg, "gemm_mn_swiglu", gs, hidden, dtype)
        mn_spec = KernelSpec("gemm_mn_swiglu", G, gs, hidden, dtype, lg)
        extra = _tuned(state, "gemm_mn_swiglu", G, gs, hidden, dtype)
        reorder_name, reorder = _reorder_call(state, info, tokens, _reorder_bound(state, lg, extra))
        x2 = relax.op.reshape(xg, relax.ShapeExpr([tokens, hidden]))
        h, mn_name = _gated_call(state, mn_spec, lambda: gemm_mn(G, gs, hidden, dtype, lg, True, state.target_kind,
                                                                  **extra),
                                 [x2, wg, wu, _flat_mask(info, tokens), *[relax.TupleGetItem(reorder, i)
                                                                          for i in range(3)]],
                                 stored, relax.TensorType([tokens, G * gs], dtype))
        out, down = _gemm_k_call(state, h, tokens, dtype, down_plan, info, reorder, expr, masked_input=True)
        state.layers.append(GatedLayer("ffn", G, gs, [reorder_name, mn_name, down[0]],
                                       [_name(wg), _name(wu), _name(down[1])], [mn_spec, down[2]]))
        state.used |= derivation_vars(info.var if info.var is not None else info.root, state.var2val)
        return out

    return callback


def _rewrite_projection(state: _State, pat):
    def callback(expr, m):
        v2v = state.var2val
        k = _channels_of(m[pat.weight], v2v)
        info = state.analyse(m[pat.gated], m[pat.mask], k)
        if info is None:
            return expr
        operand = m[pat.operand]
        tc = _tokens_and_channels(operand, k)  # the operand may still be split into groups: [.., G, gs] -> [.., k]
        if tc is None:
            return expr
        tokens, _ = tc
        plan = _gemm_k_plan(state, m[pat.weight], info, str(operand.ty.dtype))
        if plan is None:
            return expr
        a2 = relax.op.reshape(operand, relax.ShapeExpr([tokens, k]))
        reorder_name, reorder = _reorder_call(state, info, tokens, _reorder_bound(state, None))
        out, kern = _gemm_k_call(state, a2, tokens, str(operand.ty.dtype), plan, info, reorder, expr,
                                 masked=lambda: masked_in_transpose(operand, info.root, info.groups, tokens, k, v2v,
                                                                    state.function))
        kind = "attention" if _is_attention(m[pat.operand], v2v) else "projection"
        layer = GatedLayer(kind, info.groups, info.group_size, [reorder_name, kern[0]], [_name(kern[1])], [kern[2]])
        state.layers.append(layer)
        state.used |= derivation_vars(info.var if info.var is not None else info.root, state.var2val)
        if kind == "attention":
            plan = _query_plan(state, m[pat.operand], info, str(operand.ty.dtype), layer)
            if plan is not None:
                state.queries.append(plan)
        return out

    return callback


def _bound_before(expr, var: relax.Var, func: relax.Function) -> bool:
    """Whether every variable `expr` reads is a parameter or bound before `var` (so `var`'s binding may use it)."""
    order = binding_order(func)
    return all(order.get(v, -1) < order[var] for v in vars_read(expr))


def _query_plan(state: _State, operand, info: MaskInfo, dtype: str, layer: GatedLayer) -> _QueryPlan | None:
    """How to lower the query projection of the gated attention whose gated output is `operand`; None when it
    has none that find_query_projection accepts, or its weight, shape or mask does not fit gemm_mn."""
    v2v = state.var2val
    q = find_query_projection(state.func, operand, info, v2v)
    if q is None or not _bound_before(info.root, q, state.func):
        return None
    call = v2v[q]
    tc = _tokens_and_channels(call.args[0])
    weight, layout = _weight(call.args[1], v2v)
    if tc is None or str(call.args[0].ty.dtype) != dtype or str(weight.ty.dtype) != dtype:
        return None
    hidden = tc[1]
    if _weight_dims(weight, layout) != (info.groups * info.group_size, hidden):
        return None
    stored = (weight, layout)
    (weight,), layout = _kernel_layout(state, [weight], layout, "gemm_mn", info.group_size, hidden, dtype)
    return _QueryPlan(call, info, weight, layout, stored, hidden, layer)


def _rewrite_query(state: _State):
    """Callback of a matmul pattern: a planned query projection x @ Wq -> mask_reorder + gemm_mn over the
    attention's head groups (zeros where a token skips a group, which its o_proj gating discards anyway)."""

    def callback(expr, _m):
        plan = next((p for p in state.queries if p.call.same_as(expr)), None)
        if plan is None:
            return expr
        state.queries.remove(plan)
        info, x = plan.info, expr.args[0]
        G, gs, K = info.groups, info.group_size, plan.hidden
        tokens, _ = _tokens_and_channels(x)
        dtype = str(x.ty.dtype)
        spec = KernelSpec("gemm_mn", G, gs, K, dtype, plan.layout)
        extra = _tuned(state, "gemm_mn", G, gs, K, dtype)
        reorder_name, reorder = _reorder_call(state, info, tokens, _reorder_bound(state, plan.layout, extra))
        # (the fallback leaves skipped head groups unmasked: the attention's output gating discards them)
        q, name = _gated_call(state, spec, lambda: gemm_mn(G, gs, K, dtype, plan.layout, False, state.target_kind,
                                                           **extra),
                              [relax.op.reshape(x, relax.ShapeExpr([tokens, K])), plan.weight, plan.weight,
                               _flat_mask(info, tokens), *[relax.TupleGetItem(reorder, i) for i in range(3)]],
                              [plan.stored, plan.stored], relax.TensorType([tokens, G * gs], dtype),
                              masked_output=False)
        plan.layer.kernels += [reorder_name, name]
        plan.layer.specs.append(spec)
        plan.layer.weights.append(_name(plan.weight))
        return relax.op.reshape(q, expr.ty.shape)

    return callback


def _original_from(new: relax.Var, src: str, have: str, n: int, k: int) -> relax.Expr:
    """Relax expression giving a repacked parameter back in its source layout (for other uses of it)."""
    if have == "tc":
        t = relax.op.reshape(new, relax.ShapeExpr([n // TC_ROWS, k // TC_CHUNK, 2, 8, 4, 8]))
        nk = relax.op.reshape(relax.op.permute_dims(t, [0, 2, 3, 1, 4, 5]), relax.ShapeExpr([n, k]))
    elif have == "kp":
        nk = relax.op.reshape(relax.op.permute_dims(new, [0, 2, 1]), relax.ShapeExpr([n, k]))
    else:  # "kn"
        nk = relax.op.permute_dims(new)
    return nk if src == "nk" else relax.op.permute_dims(nk)


def _replace_params(func: relax.Function, repacked: dict, keep: set) -> relax.Function:
    """`func` with each repacked parameter swapped for its replacement, or followed by it where a dense fallback
    still reads it as stored (`keep`); any other use of a swapped parameter reads it back through the inverse
    layout change."""
    params = []
    for p in func.params:
        params += [p, repacked[p][0]] if p in keep else [repacked[p][0]] if p in repacked else [p]
    body = func.body
    still_used = [p for p in repacked
                  if p not in keep and any(p.same_as(v) for v in relax.analysis.free_vars(body))]
    if still_used:
        bindings = []
        for p in still_used:
            new, src, have = repacked[p]
            bindings.append(relax.VarBinding(p, _original_from(new, src, have, *_weight_dims(p, src))))
        back = relax.BindingBlock(bindings)
        body = relax.SeqExpr([back, *body.blocks], body.body)
    return relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)


@tvm.transform.module_pass(opt_level=0, name="LowerGatedLayers")
class LowerGatedLayers:
    """Find router-gated layers with dpl patterns and lower them; `self.plan` (GatedPlan) says what was lowered.

    `build=False` plans only: the module it returns calls empty stand-ins instead of the kernels (seconds instead of
    a build of every kernel; what `wide-tune MODEL` reads). Routers whose gates stay dense are listed in
    `plan.unlowered` (gate_report.py)."""

    def __init__(self, target_kind: str, enabled: bool = True, knobs: dict | None = None, wgmma: bool = False,
                 dependent: bool = False, build: bool = True, fallback: str = "off", crossovers: dict | None = None):
        self.target_kind = target_kind
        self.fallback = fallback  # dense fallback mode (wide_tvm/fallback.py); needs the BLAS extern linked
        self.crossovers = crossovers or {}
        self.wgmma = wgmma
        self.dependent = dependent
        self.enabled = enabled
        self.build = build
        self.knobs = knobs or {}
        self.plan = GatedPlan()

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled:
            return mod
        builder = relax.BlockBuilder(mod)
        kernels: dict = {}
        helper: dict = {}
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            state = _State(self.target_kind, relax.analysis.get_var2val(func), builder, self.knobs,
                           tuple(func.params), kernels=kernels, wgmma=self.wgmma, dependent=self.dependent,
                           build=self.build, fallback=self.fallback, crossovers=self.crossovers, helper=helper)
            ffn = gated_swiglu_ffn()
            func = rewrite_call(ffn.root, _rewrite_ffn(state, ffn), func)
            state.var2val = relax.analysis.get_var2val(func)
            proj = gated_projection()
            state.func = func
            func = rewrite_call(proj.root, _rewrite_projection(state, proj), func)
            if state.queries:
                func = rewrite_call(is_op("relax.matmul")(wildcard(), wildcard()), _rewrite_query(state), func)
            self.plan.unlowered.extend(unlowered_gates(func, relax.analysis.get_var2val(func), state.used,
                                                       state.mismatches))
            if state.repacked:
                func = _replace_params(func, state.repacked, state.keep)
                self.plan.repacked.update({p.name: (src, have) for p, (_, src, have) in state.repacked.items()
                                           if p not in state.keep})
                self.plan.copies.update({p.name: (f"{p.name}.{have}", src, have)
                                         for p, (_, src, have) in state.repacked.items() if p in state.keep})
            self.plan.fallbacks.update(state.fallbacks)
            builder.update_func(gv, func)
            self.plan.layers.extend(state.layers)
            self.plan.derived.update(state.derived)
        return builder.get()
