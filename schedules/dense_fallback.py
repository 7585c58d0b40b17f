"""Dense fallback of a gated GEMM: at the token counts where the vendor BLAS on the masked operand beats the gated
kernel, the same PrimFunc calls the BLAS instead (never slower than dense).

At 50 % per-token sparsity every group is used by some token from about 16 tokens on, and the gated kernels then do
dense work at their own (lower) dense efficiency; `wide_tvm/fallback.py` decides, per kernel and token count, which
path runs, and this module builds the one PrimFunc that holds both:

    if n in ranges:   NAME_blas: BLAS (cuBLASLt on CUDA, OpenBLAS on the CPU, called from the host code:
                      call_cpacked of the extern linked into the library, wide_tvm/blas/), then one elementwise
                      kernel where needed
    else:             the gated kernel, a PrimFunc of its own in the library, called by its symbol (built as
                      always, so its tuning records, schedules/code_version.py, still describe it)

Contract: the gated kernel's parameters, then the weights in the model's dense layout ("nk" [N, K] or "kn" [K, N],
the arrays the model stores, which the kernels may read repacked), then `out`:

| kind | parameters | fallback |
| --- | --- | --- |
| gemm_mn_swiglu | x, wg, wu, mask, counts, order, used, wg_d, wu_d, out | out = x @ wg_d; u = x @ wu_d; out = mask ? silu(out) * u : 0 |
| gemm_mn | x, w, w, mask, counts, order, used, w_d, w_d, out | out = x @ w_d (`masked_output`: then out = mask ? out : 0) |
| gemm_k | a, w, mask, counts, order, used, w_d, out | out = a @ w_d (`masked_input` False: a masked into a temporary first) |

`masked_output=False` is for a query projection whose skipped head groups the attention's output gating discards
(passes/query_projection.py proves it), `masked_input=True` for a gemm_k whose input a gemm_mn of the same mask
wrote (zeros where a group is skipped) or the attention's transpose masked (passes/head_mask.py): neither then needs
the elementwise pass. On CUDA that pass moves 16 bytes of each operand a thread (8 halves, one group) where the
group size allows, else one element. Temporaries and cuBLASLt's workspace
come from TVM's workspace pool in the host code, as the split kernels' partials do.

Worked example: gemm_k of the down projection (112 groups of 128, N = 4096, fp16), ranges ((16, 1024),),
masked_input=True: a call with n = 64 runs one cuBLASLt GEMM [64, 14336] x [4096, 14336]^T into out; n = 1 or
n = 2048 calls the gated kernel.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..blas import FUNCTIONS, WORKSPACE_BYTES

THREADS = 256  # threads per block of the elementwise kernels
VECTOR_BYTES = 16  # what one thread of the CUDA elementwise kernel loads of each operand (one 128-bit access)
_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
OPAQUE = 8  # relax's op_pattern kOpaque: the fusion passes leave the function alone (its body calls functions)


def in_ranges(n, ranges) -> tirx.PrimExpr:
    """The condition `n` lies in one of `ranges` ((lo, hi) pairs, hi None for no upper end)."""
    cond = None
    for lo, hi in ranges:
        term = n >= lo if hi is None else tirx.all(n >= lo, n <= hi)
        cond = term if cond is None else tirx.any(cond, term)
    if cond is None:
        raise ValueError("a dense fallback needs at least one token range")
    return cond


BLAS_HELPER = "wide_fallback_blas"  # the module's one PrimFunc that calls the extern (see blas_helper)


def blas_helper(dtype: str, target_kind: str) -> tirx.PrimFunc:
    """PrimFunc (a [m, k], b [p, q], trans_b, out [m, r], ws [bytes]): out = a @ op(b) through the target's BLAS
    extern, the only call of the extern in a module's host code. (TVM's host code generator declares the callee of
    each direct call anew, so a second call site of the same extern in one module would link to a renamed, missing
    symbol; the fallbacks call this function instead, which the module defines.) One dtype per module."""
    symbol = "__tvm_ffi_" + FUNCTIONS[target_kind]  # (TVM FFI's exported name of the extern)
    cuda = target_kind == "cuda"

    @T.prim_func(private=True)
    def func(a_h: T.handle, b_h: T.handle, trans_b: T.int64, out_h: T.handle, ws_h: T.handle):
        m, k, p, q, r, w = T.int64(), T.int64(), T.int64(), T.int64(), T.int64(), T.int64()
        a = T.match_buffer(a_h, (m, k), dtype)
        b = T.match_buffer(b_h, (p, q), dtype)
        out = T.match_buffer(out_h, (m, r), dtype)
        ws = T.match_buffer(ws_h, (w,), "uint8")
        if cuda:
            T.evaluate(T.call_cpacked(symbol, a, b, trans_b, 0, out, ws))  # algo 0: the heuristic's first pick
        else:
            T.evaluate(T.call_cpacked(symbol, a, b, trans_b, out))

    return func.with_attr("op_pattern", OPAQUE)


def _matmul(trans_b: int):
    """Macro (a, b, out, ws): out = a @ op(b) through the module's BLAS helper."""

    @T.macro
    def run(a, b, out, ws):
        T.evaluate(T.call_cpacked(BLAS_HELPER, a, b, trans_b, out, ws))

    return run


def _masked(groups: int, group_size: int, width: int, dtype: str, target_kind: str, swiglu: bool):
    """Macro (src, up, mask, dst, n): dst[t, c] = mask[t, c // gs] ? f(src[t, c]) : 0 over [n, width], with
    f = silu(src) * up (`swiglu`) or the identity; dst may be src."""
    gs = group_size

    def value(src, up, t, c):  # (a plain function: the parser calls it on the loop's values)
        if not swiglu:
            return src[t, c]
        s = tirx.Cast("float32", src[t, c])
        return tirx.Cast(dtype, s * tirx.sigmoid(s) * tirx.Cast("float32", up[t, c]))

    vec = VECTOR_BYTES // _BYTES[dtype]
    if target_kind == "cuda" and gs % vec == 0:
        per_row = width // vec

        def row(bx, tx):  # (plain functions: the parser inlines their values, so no index lands in a register
            return (bx * THREADS + tx) // per_row  # array and the vector accesses stay 16-byte loads and stores)

        def col(bx, tx):
            return (bx * THREADS + tx) % per_row * vec

        @T.macro
        def run(src, up, mask, dst, n):
            # `vec` elements a thread (16 bytes: one vector load of each operand, one store), all in one group
            for bx in T.thread_binding((n * per_row + THREADS - 1) // THREADS, thread="blockIdx.x"):
                for tx in T.thread_binding(THREADS, thread="threadIdx.x"):
                    if bx * THREADS + tx < n * per_row:
                        a = T.decl_buffer((1, vec), dtype, scope="local")
                        u = T.decl_buffer((1, vec), dtype, scope="local")
                        o = T.decl_buffer((vec,), dtype, scope="local")
                        for i in T.vectorized(vec):
                            a[0, i] = src[row(bx, tx), col(bx, tx) + i]
                        if swiglu:
                            for i in T.vectorized(vec):
                                u[0, i] = up[row(bx, tx), col(bx, tx) + i]
                        if mask[row(bx, tx), col(bx, tx) // gs] != 0:
                            for i in T.unroll(vec):
                                o[i] = value(a, u, 0, i)
                        else:
                            for i in T.unroll(vec):
                                o[i] = T.Cast(dtype, 0)
                        for i in T.vectorized(vec):
                            dst[row(bx, tx), col(bx, tx) + i] = o[i]
    elif target_kind == "cuda":
        @T.macro
        def run(src, up, mask, dst, n):
            # one element a thread: a warp reads 64 contiguous bytes of each operand (fp16)
            for bx in T.thread_binding((n * width + THREADS - 1) // THREADS, thread="blockIdx.x"):
                for tx in T.thread_binding(THREADS, thread="threadIdx.x"):
                    if bx * THREADS + tx < n * width:
                        t = (bx * THREADS + tx) // width
                        c = (bx * THREADS + tx) % width
                        if mask[t, c // gs] != 0:
                            dst[t, c] = value(src, up, t, c)
                        else:
                            dst[t, c] = T.Cast(dtype, 0)
    else:
        @T.macro
        def run(src, up, mask, dst, n):
            for t in T.parallel(n):
                for c in range(width):
                    dst[t, c] = T.Select(mask[t, c // gs] != 0, value(src, up, t, c), T.Cast(dtype, 0))

    return run


def _workspace(target_kind: str):
    """Shape of the BLAS workspace buffer (cuBLASLt's; the CPU extern takes none, so a one-byte stand-in)."""
    return (WORKSPACE_BYTES,) if target_kind == "cuda" else (1,)


def _mn_func(gated: str, dense: str | None, groups: int, group_size: int, k_dim: int, dtype: str, sparse_shape,
             dense_layout: str, target_kind: str, ranges, swiglu: bool, masked_output: bool) -> tirx.PrimFunc:
    G, gs, K = groups, group_size, k_dim
    N = G * gs
    dshape = (N, K) if dense_layout == "nk" else (K, N)
    matmul = _matmul(int(dense_layout == "nk"))
    epilogue = _masked(G, gs, N, dtype, target_kind, swiglu)
    wss = _workspace(target_kind)
    dispatch = dense is not None

    @T.prim_func(private=True)
    def func(x_h: T.handle, wg_h: T.handle, wu_h: T.handle, mask_h: T.handle, counts_h: T.handle,
             order_h: T.handle, used_h: T.handle, wgd_h: T.handle, wud_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, K), dtype)
        wg = T.match_buffer(wg_h, sparse_shape, dtype)
        wu = T.match_buffer(wu_h, sparse_shape, dtype)
        mask = T.match_buffer(mask_h, (n, G), "int32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        used = T.match_buffer(used_h, (G + 1,), "int32")
        wgd = T.match_buffer(wgd_h, dshape, dtype)
        wud = T.match_buffer(wud_h, dshape, dtype)
        out = T.match_buffer(out_h, (n, N), dtype)
        if dispatch:
            if in_ranges(n, ranges):
                T.evaluate(T.call_cpacked(dense, x, wg, wu, mask, counts, order, used, wgd, wud, out))
            else:
                T.evaluate(T.call_cpacked(gated, x, wg, wu, mask, counts, order, used, out))
        else:
            ws = T.alloc_buffer(wss, "uint8", scope="global")
            matmul(x, wgd, out, ws)
            if swiglu:
                up = T.alloc_buffer((n, N), dtype, scope="global")
                matmul(x, wud, up, ws)
                epilogue(out, up, mask, out, n)
            elif masked_output:
                epilogue(out, out, mask, out, n)

    return func


def _k_func(gated: str, dense: str | None, groups: int, group_size: int, n_dim: int, dtype: str, sparse_shape,
            dense_layout: str, target_kind: str, ranges, masked_input: bool) -> tirx.PrimFunc:
    G, gs, N = groups, group_size, n_dim
    K = G * gs
    dshape = (N, K) if dense_layout == "nk" else (K, N)
    matmul = _matmul(int(dense_layout == "nk"))
    mask_input = _masked(G, gs, K, dtype, target_kind, False)
    wss = _workspace(target_kind)
    dispatch = dense is not None

    @T.prim_func(private=True)
    def func(a_h: T.handle, w_h: T.handle, mask_h: T.handle, counts_h: T.handle, order_h: T.handle,
             used_h: T.handle, wd_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        a = T.match_buffer(a_h, (n, K), dtype)
        w = T.match_buffer(w_h, sparse_shape, dtype)
        mask = T.match_buffer(mask_h, (n, G), "int32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        used = T.match_buffer(used_h, (G + 1,), "int32")
        wd = T.match_buffer(wd_h, dshape, dtype)
        out = T.match_buffer(out_h, (n, N), dtype)
        if dispatch:
            if in_ranges(n, ranges):
                T.evaluate(T.call_cpacked(dense, a, w, mask, counts, order, used, wd, out))
            else:
                T.evaluate(T.call_cpacked(gated, a, w, mask, counts, order, used, out))
        else:
            ws = T.alloc_buffer(wss, "uint8", scope="global")
            if masked_input:
                matmul(a, wd, out, ws)
            else:
                am = T.alloc_buffer((n, K), dtype, scope="global")
                mask_input(a, a, mask, am, n)
                matmul(am, wd, out, ws)

    return func


def with_dense_fallback(name: str, gated: str, kind: str, groups: int, group_size: int, dim: int, dtype: str,
                        sparse_layout_shape, dense_layout: str, target_kind: str, ranges, masked_input: bool = False,
                        masked_output: bool = True) -> dict[str, tirx.PrimFunc]:
    """{name: the dispatch, name + "_blas": the dense path}: the dispatch runs the dense path for token counts in
    `ranges` and otherwise calls the gated kernel whose global symbol is `gated` (gemm_mn / gemm_k as
    schedules.gemm_mn / gemm_k build it, in the same module; `kind` a kernel-knob kind, `dim` its K (gemm_mn) or N
    (gemm_k), `sparse_layout_shape` the shape of the weights it reads). Both take the dense weights (`dense_layout`
    "nk" or "kn") before `out` (the module's table). The dense path is a function of its own so that its
    temporaries, which TVM allocates at the top of the function that declares them, cost nothing on the gated path."""
    if dense_layout not in ("nk", "kn"):
        raise ValueError(f"the dense fallback reads weights as 'nk' or 'kn', not {dense_layout!r}")
    shape = tuple(int(d) for d in sparse_layout_shape)
    funcs = {}
    for func_name, dense in ((name, name + "_blas"), (name + "_blas", None)):
        if kind == "gemm_k":
            func = _k_func(gated, dense, groups, group_size, dim, dtype, shape, dense_layout, target_kind,
                           tuple(ranges), masked_input)
        else:
            func = _mn_func(gated, dense, groups, group_size, dim, dtype, shape, dense_layout, target_kind,
                            tuple(ranges), kind == "gemm_mn_swiglu", masked_output)
        funcs[func_name] = func.with_attr("op_pattern", OPAQUE)
    return funcs
