"""gemm_mn: output-group pruning (gate/up with SwiGLU fused in the epilogue; Q projection).

out[t, g*gs:(g+1)*gs] = epilogue(x[t] @ W_g) for tokens active in group g, and 0 for the others.
Tokens are walked in the mask-reorder order of each group; a tile of BM sorted tokens that lies past
the group's active count holds no active token, so it only writes its zeros and computes nothing.
Every output element is written by exactly one thread: deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .tiles import tile_config
from .weights import weight_loader


def gemm_mn(groups: int, group_size: int, k_dim: int, dtype: str, w_layout: str, swiglu: bool,
            target_kind: str) -> tirx.PrimFunc:
    """x [n, K], w [N, K] ("nk") or [K, N] ("kn") (and w_up for SwiGLU), counts [G], order [G, n] -> out [n, N]."""
    G, gs, K = groups, group_size, k_dim
    N = G * gs
    wshape = (N, K) if w_layout == "nk" else (K, N)
    load_w = weight_loader(w_layout)
    cfg = tile_config(target_kind, gs)
    BM, BN = cfg.bm, cfg.bn
    n_col_tiles = gs // BN

    @T.macro
    def dot_store(x, wg, wu, out, t, col):
        acc = T.decl_buffer((2,), "float32", scope="local")
        acc[0] = T.float32(0)
        acc[1] = T.float32(0)
        for k in range(K):
            xv = T.Cast("float32", x[t, k])
            acc[0] = acc[0] + xv * T.Cast("float32", load_w(wg, k, col))
            if swiglu:
                acc[1] = acc[1] + xv * T.Cast("float32", load_w(wu, k, col))
        if swiglu:
            out[t, col] = T.Cast(dtype, acc[0] * T.sigmoid(acc[0]) * acc[1])
        else:
            out[t, col] = T.Cast(dtype, acc[0])

    if target_kind == "cuda":

        @T.prim_func(private=True)
        def gemm_mn_cuda(x_h: T.handle, wg_h: T.handle, wu_h: T.handle, counts_h: T.handle,
                         order_h: T.handle, out_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, K), dtype)
            wg = T.match_buffer(wg_h, wshape, dtype)
            wu = T.match_buffer(wu_h, wshape, dtype)
            counts = T.match_buffer(counts_h, (G,), "int32")
            order = T.match_buffer(order_h, (G, n), "int32")
            out = T.match_buffer(out_h, (n, N), dtype)
            for bx in T.thread_binding(G * ((n + BM - 1) // BM), thread="blockIdx.x"):
                for by in T.thread_binding(n_col_tiles, thread="blockIdx.y"):
                    for ty in T.thread_binding(BM, thread="threadIdx.y"):
                        for tx in T.thread_binding(BN, thread="threadIdx.x"):
                            g = bx // ((n + BM - 1) // BM)
                            i = bx % ((n + BM - 1) // BM) * BM + ty
                            col = g * gs + by * BN + tx
                            if i < n:
                                t = T.Cast("int64", order[g, i])
                                if i < T.Cast("int64", counts[g]):
                                    dot_store(x, wg, wu, out, t, col)
                                else:
                                    out[t, col] = T.Cast(dtype, 0)

        return gemm_mn_cuda

    @T.prim_func(private=True)
    def gemm_mn_cpu(x_h: T.handle, wg_h: T.handle, wu_h: T.handle, counts_h: T.handle,
                    order_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, K), dtype)
        wg = T.match_buffer(wg_h, wshape, dtype)
        wu = T.match_buffer(wu_h, wshape, dtype)
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        out = T.match_buffer(out_h, (n, N), dtype)
        for tile in T.parallel(G * ((n + BM - 1) // BM)):
            g = tile // ((n + BM - 1) // BM)
            i0 = tile % ((n + BM - 1) // BM) * BM
            for ii in range(BM):
                if i0 + ii < n:
                    t = T.Cast("int64", order[g, i0 + ii])
                    if i0 + ii < T.Cast("int64", counts[g]):
                        for c in range(gs):
                            dot_store(x, wg, wu, out, t, g * gs + c)
                    else:
                        for c in T.vectorized(gs):
                            out[t, g * gs + c] = T.Cast(dtype, 0)

    return gemm_mn_cpu
