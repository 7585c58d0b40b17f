"""Attention onto TVM's paged KV cache: the stateless `main` (input_ids [1, T] -> logits) also as `prefill` and
`decode`, whose attention reads and appends the cache (issue 55: generation).

The compiler finds each attention core in the imported graph by what it computes, as it finds gated layers:

    scores = matmul(q', k'^T) * c                    q [1, H, T, D] after RoPE (and any q-norm), through views; the
                                                      constant c anywhere on scores, q' or k' (torch's SDPA
                                                      decomposition scales both by sqrt(c))
    probs  = softmax(scores + mask)                   mask: computed from the token count alone (the causal mask)
    out    = matmul(probs, v')                        out [1, H, T, D]; probs may pass the `where` that zeroes
                                                      fully masked rows (none are, with a causal mask)

where k' and v' are k, v [1, Hkv, T, D] repeated to H heads the way repeat_kv does (expand_dims at axis 2,
broadcast to [1, Hkv, H / Hkv, T, D], reshape), or k, v themselves (Hkv = H). In `prefill` and `decode`
(add_generation_functions) each core becomes

    out = attention_with_fused_qkv(layer, concat([q, k, v] as [n, heads, D], axis=1), sm_scale = 1 / c)

(`vm.builtin.attention_kv_cache_attention_with_fused_qkv`: causal attention over the cached tokens of each sequence
plus the new ones, which it appends), and every `arange(0, T)` (the positions the graph's own RoPE reads) becomes
the cache's query positions. The cache applies no RoPE of its own (RopeMode.NONE): the graph's RoPE, whatever its
scaling, runs on q and k before they reach the cache, so the keys are cached rotated, as the model computes them.
The n tokens are a ragged batch: the sequences and their lengths come from `kv_state_begin_forward`; one token each
is a batched decode step. Worked example: Llama-3.1-8B, 32 query / 8 KV heads of 128: qkv [n, 48, 128] per layer.

A core that does not fit (another mask, a repeat of another order, heads of different sizes) raises a WideError
naming its softmax node.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.utils import copy_with_new_vars
from tvm.sym.analyzer import Analyzer

from ..entry_points import DECODE, PREFILL
from ..errors import WideError
from .mask_analysis import node_name, op_name, resolve, users_of

_VIEWS = ("relax.reshape", "relax.broadcast_to")


@dataclass
class AttentionCore:
    """One attention core of the stateless graph: the binding of its output and its inputs."""

    out: relax.Var  # matmul(probs, v') [1, H, T, D] (after its reshape back to 4-D)
    q: relax.Expr  # [1, H, T, D] (before an upcast to fp32 that only attention computes in: _narrowed)
    k: relax.Expr  # [1, Hkv, T, D]
    v: relax.Expr  # [1, Hkv, T, D]
    sm_scale: float
    node: str  # the softmax's node, for errors


@dataclass
class CacheShape:
    """What the paged KV cache of a module holds per layer."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str


def _dims(expr) -> list | None:
    shape = expr.ty.shape if isinstance(expr.ty, relax.TensorType) else None
    return list(shape.values) if shape is not None else None


def _unrepeat(expr, var2val, heads: int):
    """k or v [1, Hkv, T, D] from its repeat_kv to `heads` heads (expand_dims at axis 2, then broadcast_to), through
    reshapes and broadcasts that keep the shape, or the tensor itself where Hkv = heads; None if another form."""
    while True:
        value = resolve(expr, var2val)
        if op_name(value) == "relax.broadcast_to":
            src = resolve(value.args[0], var2val)
            if op_name(src) == "relax.expand_dims" and [int(a) for a in src.attrs.axis] == [2]:
                base, repeated = src.args[0], True
                break
        if op_name(value) not in _VIEWS:
            base, repeated = expr, False
            break
        expr = value.args[0]
    dims = _dims(base)
    if dims is None or len(dims) != 4 or not isinstance(dims[1], tvm.tirx.IntImm):
        return None
    kv_heads = int(dims[1])
    return base if (heads % kv_heads == 0 if repeated else kv_heads == heads) else None


def _constant(expr, var2val) -> float | None:
    value = resolve(expr, var2val)
    if isinstance(value, tvm.ir.Constant) and value.value.numpy().size == 1:
        return float(value.value.numpy().reshape(()))
    return None


def _reads_params(expr, var2val, params) -> bool:
    """Whether `expr` depends on a function parameter (tensor data, not shapes)."""
    todo, seen = [expr], set()
    while todo:
        e = todo.pop()
        if isinstance(e, relax.Var):
            if e in params:
                return True
            if e in seen or e not in var2val:
                continue
            seen.add(e)
            e = var2val[e]
        if isinstance(e, relax.Call):
            todo += [a for a in e.args if isinstance(a, (relax.Var, relax.Call, relax.Tuple))]
        elif isinstance(e, relax.Tuple):
            todo += list(e.fields)
    return False


def find_attention_cores(func: relax.Function) -> list[AttentionCore]:
    """Every attention core of `func`, in binding order (the cache's layer ids)."""
    var2val = relax.analysis.get_var2val(func)
    params = set(func.params)
    users = users_of(var2val)
    order = {v: i for i, v in enumerate(var2val)}
    cores = []
    for var, value in var2val.items():
        if op_name(value) != "relax.nn.softmax":
            continue
        node = node_name(var, value)
        cores.append(_core(var, value, var2val, users, params, node))
    return sorted(cores, key=lambda c: order[c.out])


def _fail(node: str, why: str):
    raise WideError(f"attention at {node} does not map onto the paged KV cache: {why}")


def _scaled(expr, var2val):
    """(`expr` with its views and constant factors peeled off, the product of those factors)."""
    factor = 1.0
    while True:
        value = resolve(expr, var2val)
        op = op_name(value)
        if op in _VIEWS:
            expr = value.args[0]
            continue
        if op in ("relax.multiply", "relax.divide"):
            c = _constant(value.args[1], var2val)
            if c:
                factor, expr = (factor * c if op == "relax.multiply" else factor / c), value.args[0]
                continue
            c = _constant(value.args[0], var2val) if op == "relax.multiply" else None
            if c:
                factor, expr = factor * c, value.args[1]
                continue
        return expr, factor


def _probs_to_values(var, var2val, users, depth: int = 8):
    """The matmul that multiplies the probabilities `var` with v, through views and the `where` that zeroes fully
    masked rows (torch's decomposed SDPA), or None."""
    frontier = [var]
    for _ in range(depth):
        nxt = []
        for cur in frontier:
            for u in users.get(cur, []):
                value = var2val[u]
                if op_name(value) == "relax.matmul" and value.args[0].same_as(cur):
                    return u
                if op_name(value) in (*_VIEWS, "relax.where"):
                    nxt.append(u)
        frontier = nxt
    return None


def _core(var, softmax, var2val, users, params, node: str) -> AttentionCore:
    scores = resolve(softmax.args[0], var2val)
    if op_name(scores) != "relax.add":
        _fail(node, "it has no causal mask")
    a, b = scores.args  # scores + mask: the mask computed from the token count alone
    if _reads_params(a, var2val, params) and _reads_params(b, var2val, params):
        _fail(node, "its mask reads the model's inputs (only a causal mask fits the cache)")
    scores = a if _reads_params(a, var2val, params) else b
    inner, f_scores = _scaled(scores, var2val)
    qk = resolve(inner, var2val)
    if op_name(qk) != "relax.matmul":
        _fail(node, "its scores are not a matmul of q and k (times constants)")
    q, f_q = _scaled(qk.args[0], var2val)
    kt_expr, f_k = _scaled(qk.args[1], var2val)
    kt = resolve(kt_expr, var2val)
    if op_name(kt) != "relax.permute_dims" or [int(x) for x in kt.attrs.axes] != [0, 1, 3, 2]:
        _fail(node, "k^T is not a transpose of its last two axes")
    k_expr = kt.args[0]
    scale = f_scores * f_q * f_k
    qd = _dims(q)
    if qd is None or len(qd) != 4 or not all(isinstance(d, tvm.tirx.IntImm) for d in (qd[0], qd[1], qd[3])):
        _fail(node, "q is not [1, heads, tokens, head_dim]")
    heads = int(qd[1])
    k = _unrepeat(k_expr, var2val, heads)
    pv = _probs_to_values(var, var2val, users)
    if pv is None:
        _fail(node, "its probabilities do not reach a matmul with v")
    v = _unrepeat(var2val[pv].args[1], var2val, heads)
    out = _follow(pv, var2val, users, ("relax.reshape",))
    if k is None or v is None:
        _fail(node, "k / v are not [1, kv_heads, tokens, head_dim] repeated to the query heads (repeat_kv)")
    prove = Analyzer().can_prove_equal
    for x in (k, v, out):
        d = _dims(x)
        if d is None or len(d) != 4 or not (int(d[0]) == 1 and prove(d[2], qd[2]) and prove(d[3], qd[3])):
            _fail(node, "q, k, v and the output are not all [1, heads, tokens, head_dim]")
    if int(_dims(out)[1]) != heads or int(_dims(v)[1]) != int(_dims(k)[1]):
        _fail(node, "the output's heads are not q's, or v's not k's")
    return AttentionCore(out, *_narrowed((q, k, v), var2val), scale, node)


def _narrowed(qkv, var2val):
    """q, k, v before the upcast that a half-precision model's exported attention computes in (torch.export's SDPA
    decomposition casts fp16 q, k, v to fp32): the cache then holds them as the model does, at half the bytes, and
    its kernels accumulate in fp32 as PyTorch's fused attention does. Unchanged unless all three are such casts."""
    sources = []
    for x in qkv:
        value = resolve(x, var2val)
        if op_name(value) != "relax.astype" or not isinstance(value.args[0].ty, relax.TensorType):
            return qkv
        sources.append(value.args[0])
    narrow = {str(x.ty.dtype) for x in sources}
    if len(narrow) != 1 or narrow.pop() not in ("float16", "bfloat16") or str(qkv[0].ty.dtype) != "float32":
        return qkv
    return tuple(sources)


def _follow(var, var2val, users, ops):
    """The last binding of the single-user chain after `var` whose ops are all in `ops` (`var` itself if none)."""
    while len(users.get(var, [])) == 1 and op_name(var2val[users[var][0]]) in ops:
        var = users[var][0]
    return var


def cache_shape(cores: list[AttentionCore]) -> CacheShape:
    """The one cache shape every core shares (the cache has one head count and size)."""
    shapes = {(int(_dims(c.q)[1]), int(_dims(c.k)[1]), int(_dims(c.q)[3]), str(c.q.ty.dtype)) for c in cores}
    if len(shapes) != 1:
        raise WideError(f"attention layers of different shapes {sorted(shapes)}: the paged KV cache holds one")
    (heads, kv_heads, dim, dtype), = shapes
    return CacheShape(len(cores), heads, kv_heads, dim, dtype)


@relax.expr_functor.mutator
class _ToCache(relax.PyExprMutator):
    def __init__(self, mod, cores, cache: relax.Var, tokens, head: relax.Var | None = None,
                 positions: relax.Var | None = None):
        super().__init__(mod)
        self.cores = {c.out: (i, c) for i, c in enumerate(cores)}
        self.cache = cache
        self.tokens = tokens
        self.head, self.positions = head, positions  # the output's matmul, and the rows it keeps (None: all)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if binding.var in self.cores:
            layer, core = self.cores[binding.var]
            new = self._attention(layer, core)
        elif binding.var.same_as(self.head) and self.positions is not None:
            if op_name(value) == "relax.matmul":  # the LM head on the kept rows only
                rows = self.builder_.emit(relax.op.take(self.visit_expr(value.args[0]), self.positions, axis=1))
                new = relax.Call(value.op, [rows, *map(self.visit_expr, value.args[1:])], value.attrs)
            else:  # every row computed, the kept ones taken
                new = relax.op.take(self.builder_.emit(self.visit_expr(value)), self.positions, axis=1)
        elif op_name(value) == "relax.arange" and self._is_positions(value):
            positions = self.builder_.emit(relax.call_pure_packed(
                "vm.builtin.attention_kv_cache_get_query_positions", self.cache,
                ty_args=relax.TensorType([self.tokens], "int32")))
            new = relax.op.astype(positions, str(binding.var.ty.dtype))
        else:
            super().visit_var_binding_(binding)
            return
        bb = self.builder_
        output = not isinstance(binding.var, relax.DataflowVar) and bb.current_block_is_dataflow()
        self.set_var_remap(binding.var, (bb.emit_output if output else bb.emit)(new, name_hint=binding.var.name))

    def _is_positions(self, call) -> bool:
        start, end, step = call.args[:3]
        prove = Analyzer().can_prove_equal
        try:  # (PrimExpr bounds; a relax value there is no position range)
            return prove(start, 0) and prove(step, 1) and prove(end, self.tokens)
        except (TypeError, ValueError, tvm.TVMError):
            return False

    def _attention(self, layer: int, core: AttentionCore) -> relax.Expr:
        op, bb, n = relax.op, self.builder_, self.tokens
        d = int(_dims(core.q)[3])

        def tokens_first(x):  # [1, heads, n, D] -> [n, heads, D]
            heads = int(_dims(x)[1])
            return op.reshape(op.permute_dims(self.visit_expr(x), [0, 2, 1, 3]), relax.ShapeExpr([n, heads, d]))

        heads = int(_dims(core.q)[1])
        qkv = bb.emit(op.concat([bb.emit(tokens_first(x)) for x in (core.q, core.k, core.v)], axis=1))
        out = bb.emit(relax.call_dps_packed(
            "vm.builtin.attention_kv_cache_attention_with_fused_qkv",
            [self.cache, relax.prim_value(layer), relax.prim_value(core.sm_scale), qkv],
            out_ty=relax.TensorType([n, heads, d], str(core.q.ty.dtype))))
        out = op.permute_dims(op.reshape(out, relax.ShapeExpr([1, n, heads, d])), [0, 2, 1, 3])
        wanted = str(core.out.ty.dtype)  # (the graph's own precision after attention: see _narrowed)
        return out if wanted == str(core.q.ty.dtype) else op.astype(bb.emit(out), wanted)


def _output_head(func: relax.Function) -> relax.Var:
    """The binding whose rows the prefill keeps: the matmul that makes `func`'s logits [1, T, vocab] from per-token
    states (the LM head), through casts, so it runs on the kept rows only; else the output itself."""
    var2val = relax.analysis.get_var2val(func)
    out = func.body.body
    while isinstance(out, relax.Var) and isinstance(var2val.get(out), relax.Tuple) and len(var2val[out].fields) == 1:
        out = var2val[out].fields[0]  # (torch.export's outputs: a tuple of the one tensor)
    if isinstance(out, relax.Tuple) and len(out.fields) == 1:
        out = out.fields[0]
    if not isinstance(out, relax.Var) or out not in var2val or len(_dims(out) or []) != 3:
        raise WideError("the model's output is not one tensor of logits [1, tokens, vocab]")
    head = out
    while op_name(var2val.get(head)) == "relax.astype" and isinstance(var2val[head].args[0], relax.Var):
        head = var2val[head].args[0]
    if op_name(var2val.get(head)) == "relax.matmul" and len(_dims(var2val[head].args[0]) or []) == 3:
        return head
    return out


def _entry(func, body, params, num_input: int, name: str, attrs: dict) -> relax.Function:
    out = relax.Function(params, body, None, func.is_pure, func.attrs).with_attr("num_input", num_input)
    if out.attrs and "global_symbol" in out.attrs:
        out = out.with_attr("global_symbol", name)
    for key, value in attrs.items():
        out = out.with_attr(key, value)
    return copy_with_new_vars(out)  # (no variable defined in two functions: FuseOps requires it)


def add_generation_functions(mod: tvm.IRModule, decode_batch: int, entry: str = "main",
                             cuda_graph: bool = False) -> tuple[tvm.IRModule, CacheShape]:
    """`mod` plus PREFILL and DECODE, copies of `entry` (input_ids [1, T] first) whose attention reads and appends a
    paged KV cache, taken after the inputs; and the cache's shape. A WideError where an attention core does not fit.

        prefill(input_ids [1, n], logit_positions [m] int32, cache, weights...) -> logits [1, m, vocab]
        decode(input_ids [1, b], cache, weights...) -> logits [1, b, vocab]          b <= decode_batch

    `logit_positions` picks the rows of the ragged batch whose logits are wanted (the last token of each sequence):
    the LM head runs on those rows only. `decode` is the same computation for one new token per sequence, with the
    batch bounded at compile time, so its memory is planned statically (and, `cuda_graph`, it is captured once per
    batch size in a CUDA graph: TVM's RewriteCUDAGraph)."""
    func = mod[entry]
    cores = find_attention_cores(func)
    if not cores:
        raise WideError(f"{entry}: no attention found to map onto the paged KV cache")
    shape = cache_shape(cores)
    dims = _dims(func.params[0])
    if dims is None or len(dims) != 2:
        raise WideError(f"{entry}: the first input is not token ids [1, T]")
    tokens = dims[1]
    if not isinstance(tokens, tvm.tirx.Var):
        raise WideError(f"{entry}: the token count is fixed ({tokens}); generation needs it symbolic")
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else 1
    inputs, weights = list(func.params[:num_input]), list(func.params[num_input:])
    out = tvm.IRModule(dict(mod.functions))

    cache = relax.Var("paged_kv_cache", relax.ObjectType())
    positions = relax.Var("logit_positions", relax.TensorType([tvm.tirx.Var("m", "int64")], "int32"))
    body = _ToCache(mod, cores, cache, tokens, _output_head(func), positions).visit_expr(func.body)
    out[PREFILL] = _entry(func, body, [*inputs, positions, cache, *weights], num_input + 2, PREFILL, {})

    cache = relax.Var("paged_kv_cache", relax.ObjectType())
    body = _ToCache(mod, cores, cache, tokens).visit_expr(func.body)
    attrs = {"tir_var_upper_bound": {tokens.name: decode_batch}}
    if cuda_graph:
        attrs["relax.rewrite_cuda_graph.capture_symbolic_vars"] = [tokens.name]
    out[DECODE] = _entry(func, body, [*inputs, cache, *weights], num_input + 1, DECODE, attrs)
    return out, shape
