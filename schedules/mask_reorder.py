"""Mask reorder: per group, the count of active tokens and a stable permutation with active tokens first.

`order[g, :counts[g]]` are the active tokens of group g in ascending order, `order[g, counts[g]:]` the
inactive ones. The block-sparse kernels walk `order` in tiles: a tile entirely past `counts[g]` holds
no active token and is skipped. Computed on device; no host sort.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T


def mask_reorder(groups: int, target_kind: str) -> tirx.PrimFunc:
    """mask [n, G] int32 (nonzero = execute) -> counts [G] int32, order [G, n] int32."""
    G = groups

    @T.macro
    def partition(mask, counts, order, g, n):
        """Stable partition of tokens 0..n-1 for group g: active first, then inactive."""
        cnt = T.decl_buffer((2,), "int32", scope="local")
        cnt[0] = 0
        for t in range(n):
            if mask[t, g] != 0:
                order[g, cnt[0]] = T.Cast("int32", t)
                cnt[0] = cnt[0] + 1
        counts[g] = cnt[0]
        cnt[1] = cnt[0]
        for t in range(n):
            if mask[t, g] == 0:
                order[g, cnt[1]] = T.Cast("int32", t)
                cnt[1] = cnt[1] + 1

    if target_kind == "cuda":
        threads = min(G, 128)
        blocks = (G + threads - 1) // threads

        @T.prim_func(private=True)
        def reorder_cuda(mask_h: T.handle, counts_h: T.handle, order_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            mask = T.match_buffer(mask_h, (n, G), "int32")
            counts = T.match_buffer(counts_h, (G,), "int32")
            order = T.match_buffer(order_h, (G, n), "int32")
            for bx in T.thread_binding(blocks, thread="blockIdx.x"):
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    if bx * threads + tx < G:
                        partition(mask, counts, order, bx * threads + tx, n)

        return reorder_cuda

    @T.prim_func(private=True)
    def reorder_cpu(mask_h: T.handle, counts_h: T.handle, order_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        mask = T.match_buffer(mask_h, (n, G), "int32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        for g in T.parallel(G):
            partition(mask, counts, order, g, n)

    return reorder_cpu
