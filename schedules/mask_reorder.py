"""Mask reorder: per group, the count of active tokens and a stable permutation with active tokens first.

`order[g, :counts[g]]` are the active tokens of group g in ascending order, `order[g, counts[g]:]` the
inactive ones. `used[:used[G]]` lists the groups at least one token executes, ascending (the decode
GEMV of gemm_k streams only their weights). The block-sparse kernels walk `order` in tiles: a tile
entirely past `counts[g]` holds no active token and is skipped. Computed on device; no host sort.

CUDA: up to SERIAL_TOKENS tokens, one block whose thread g partitions group g serially (one launch);
more tokens, one block per group partitions 256 tokens at a time with a block scan, then one block
builds the used-group list (the host picks per call). Both are stable and deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

SERIAL_TOKENS = 16  # up to this many tokens (decode) one thread per group partitions serially: one launch


def mask_reorder(groups: int, target_kind: str) -> tirx.PrimFunc:
    """mask [n, G] int32 (nonzero = execute) -> counts [G], order [G, n], used [G + 1] (all int32)."""
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
        if G > 1024:
            raise ValueError(f"mask_reorder on CUDA supports at most 1024 groups, got {G}")
        threads = 1 << max(5, (G - 1).bit_length())
        log_t = threads.bit_length() - 1

        @T.macro
        def block_scan(scan, reg, tx, steps):
            """Inclusive Hillis-Steele scan of scan[0 .. 2**steps) by as many threads; reg[1] is scratch."""
            for s in T.unroll(steps):
                reg[1] = T.Select(tx >= (1 << s), scan[T.max(tx - (1 << s), 0)], 0)
                T.tvm_storage_sync("shared")
                scan[tx] = scan[tx] + reg[1]
                T.tvm_storage_sync("shared")

        PT = 256  # threads of one group's block in the parallel partition
        LOG_PT = 8

        @T.macro
        def single_block(mask, counts, order, used, n, partition_too):
            """One block: thread g partitions group g (serial over tokens, for few tokens) when
            `partition_too`, then the used-group list by a block scan over counts > 0."""
            for bx in T.thread_binding(1, thread="blockIdx.x"):
                scan = T.decl_buffer((threads,), "int32", scope="shared")
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    reg = T.decl_buffer((2,), "int32", scope="local")
                    reg[0] = 0
                    if tx < G:
                        if partition_too:
                            partition(mask, counts, order, tx, n)
                        reg[0] = T.Select(counts[tx] > 0, 1, 0)
                    scan[tx] = reg[0]
                    T.tvm_storage_sync("shared")
                    block_scan(scan, reg, tx, log_t)  # of the used flags
                    if reg[0] != 0:
                        used[scan[tx] - 1] = tx
                    if tx == threads - 1:
                        used[G] = scan[tx]

        @T.macro
        def parallel_partition(mask, counts, order, n):
            """Block g partitions group g: PT tokens at a time, positions from a block scan (stable)."""
            for bx in T.thread_binding(G, thread="blockIdx.x"):
                scan = T.decl_buffer((PT,), "int32", scope="shared")
                for tx in T.thread_binding(PT, thread="threadIdx.x"):
                    reg = T.decl_buffer((4,), "int32", scope="local")  # flag, partner, active before chunk, total
                    # total active count: per-thread sums, then a block scan
                    reg[0] = 0
                    for c in range((T.Cast("int32", n) + PT - 1) // PT):
                        if c * PT + tx < T.Cast("int32", n):
                            reg[0] = reg[0] + T.Select(mask[c * PT + tx, bx] != 0, 1, 0)
                    scan[tx] = reg[0]
                    T.tvm_storage_sync("shared")
                    block_scan(scan, reg, tx, LOG_PT)
                    reg[3] = scan[PT - 1]
                    reg[2] = 0
                    T.tvm_storage_sync("shared")
                    for c in range((T.Cast("int32", n) + PT - 1) // PT):
                        reg[0] = T.Select(c * PT + tx < T.Cast("int32", n), T.Select(
                            mask[T.min(c * PT + tx, T.Cast("int32", n) - 1), bx] != 0, 1, 0), 0)
                        scan[tx] = reg[0]
                        T.tvm_storage_sync("shared")
                        block_scan(scan, reg, tx, LOG_PT)
                        if c * PT + tx < T.Cast("int32", n):
                            if reg[0] != 0:  # active: after the active tokens of earlier chunks and lanes
                                order[bx, reg[2] + scan[tx] - 1] = c * PT + tx
                            else:  # inactive: after all active tokens, then the inactive ones before it
                                order[bx, reg[3] + c * PT + tx - (reg[2] + scan[tx])] = c * PT + tx
                        reg[2] = reg[2] + scan[PT - 1]
                        T.tvm_storage_sync("shared")
                    if tx == 0:
                        counts[bx] = reg[3]

        @T.prim_func(private=True)
        def reorder_cuda(mask_h: T.handle, counts_h: T.handle, order_h: T.handle, used_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            mask = T.match_buffer(mask_h, (n, G), "int32")
            counts = T.match_buffer(counts_h, (G,), "int32")
            order = T.match_buffer(order_h, (G, n), "int32")
            used = T.match_buffer(used_h, (G + 1,), "int32")
            if n <= SERIAL_TOKENS:  # decided on the host: few tokens, one launch
                single_block(mask, counts, order, used, n, True)
            else:  # many tokens: one block per group, then the used-group list
                parallel_partition(mask, counts, order, n)
                single_block(mask, counts, order, used, n, False)

        return reorder_cuda

    @T.prim_func(private=True)
    def reorder_cpu(mask_h: T.handle, counts_h: T.handle, order_h: T.handle, used_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        mask = T.match_buffer(mask_h, (n, G), "int32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        used = T.match_buffer(used_h, (G + 1,), "int32")
        for g in T.parallel(G):
            partition(mask, counts, order, g, n)
        used[G] = 0
        for g in range(G):
            if counts[g] > 0:
                used[used[G]] = g
                used[G] = used[G] + 1

    return reorder_cpu
