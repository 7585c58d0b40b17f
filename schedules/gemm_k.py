"""gemm_k: reduction-group pruning (down projection; O projection of gated attention).

out[t] = sum over groups g active for token t of a[t, g*gs:(g+1)*gs] @ W[g*gs:(g+1)*gs, :].
Tiles are BM consecutive tokens x BN output columns; for each group the tile first checks whether any
of its tokens executes that group and skips the group's whole K-slice (loads and FMAs) when none does.
The reduction runs over groups in a fixed order inside one thread: no atomics, deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .tiles import tile_config
from .weights import weight_loader


def gemm_k(groups: int, group_size: int, n_dim: int, dtype: str, w_layout: str,
           target_kind: str) -> tirx.PrimFunc:
    """a [n, K=G*gs], w [N, K] ("nk") or [K, N] ("kn"), mask [n, G] int32 -> out [n, N]."""
    G, gs, N = groups, group_size, n_dim
    K = G * gs
    wshape = (N, K) if w_layout == "nk" else (K, N)
    load_w = weight_loader(w_layout)
    cfg = tile_config(target_kind, N)
    BM, BN = cfg.bm, cfg.bn

    @T.macro
    def tile_active(mask, row0, g, n, flag):
        flag[0] = 0
        for r in range(BM):
            if row0 + r < n:
                flag[0] = T.max(flag[0], mask[row0 + r, g])

    if target_kind == "cuda":

        @T.prim_func(private=True)
        def gemm_k_cuda(a_h: T.handle, w_h: T.handle, mask_h: T.handle, out_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            a = T.match_buffer(a_h, (n, K), dtype)
            w = T.match_buffer(w_h, wshape, dtype)
            mask = T.match_buffer(mask_h, (n, G), "int32")
            out = T.match_buffer(out_h, (n, N), dtype)
            for bx in T.thread_binding((n + BM - 1) // BM, thread="blockIdx.x"):
                for by in T.thread_binding(N // BN, thread="blockIdx.y"):
                    for ty in T.thread_binding(BM, thread="threadIdx.y"):
                        for tx in T.thread_binding(BN, thread="threadIdx.x"):
                            acc = T.decl_buffer((1,), "float32", scope="local")
                            flag = T.decl_buffer((1,), "int32", scope="local")
                            acc[0] = T.float32(0)
                            for g in range(G):
                                tile_active(mask, bx * BM, g, n, flag)
                                if flag[0] != 0:
                                    if bx * BM + ty < n:
                                        if mask[bx * BM + ty, g] != 0:
                                            for k in range(gs):
                                                acc[0] = acc[0] + T.Cast("float32", a[bx * BM + ty, g * gs + k]) * \
                                                    T.Cast("float32", load_w(w, g * gs + k, by * BN + tx))
                            if bx * BM + ty < n:
                                out[bx * BM + ty, by * BN + tx] = T.Cast(dtype, acc[0])

        return gemm_k_cuda

    @T.prim_func(private=True)
    def gemm_k_cpu(a_h: T.handle, w_h: T.handle, mask_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        a = T.match_buffer(a_h, (n, K), dtype)
        w = T.match_buffer(w_h, wshape, dtype)
        mask = T.match_buffer(mask_h, (n, G), "int32")
        out = T.match_buffer(out_h, (n, N), dtype)
        for tile in T.parallel((n + BM - 1) // BM * (N // BN)):
            acc = T.decl_buffer((BM, BN), "float32", scope="local")
            flag = T.decl_buffer((1,), "int32", scope="local")
            row0 = tile // (N // BN) * BM
            col0 = tile % (N // BN) * BN
            for r, c in T.grid(BM, BN):
                acc[r, c] = T.float32(0)
            for g in range(G):
                tile_active(mask, row0, g, n, flag)
                if flag[0] != 0:
                    for r in range(BM):
                        if row0 + r < n:
                            if mask[row0 + r, g] != 0:
                                for k in range(gs):
                                    for c in range(BN):
                                        acc[r, c] = acc[r, c] + T.Cast("float32", a[row0 + r, g * gs + k]) * \
                                            T.Cast("float32", load_w(w, g * gs + k, col0 + c))
            for r in range(BM):
                if row0 + r < n:
                    for c in range(BN):
                        out[row0 + r, col0 + c] = T.Cast(dtype, acc[r, c])

    return gemm_k_cpu
