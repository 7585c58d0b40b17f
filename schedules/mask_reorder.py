"""Mask reorder: per group, the count of active tokens and a stable permutation with active tokens first.

`order[g, :counts[g]]` are the active tokens of group g in ascending order, `order[g, counts[g]:]` the
inactive ones. `used[:G]` is a permutation of the groups: the groups at least one token executes first,
ascending, then the others, ascending; `used[G]` is the number of used groups. gemm_k streams only the
weights of `used[:used[G]]`; gemm_mn hands its blocks out in `used` order, so the blocks with work are
dispatched first. The block-sparse kernels walk `order` in tiles: a tile entirely past `counts[g]`
holds no active token and is skipped. Computed on device; no host sort.

CUDA: up to SERIAL_TOKENS tokens, one block whose thread g reads its group's mask column as a bit set
and places every token from popcounts (independent loads, no serial chain; one launch); more tokens,
one block per group partitions 256 tokens at a time with a block scan, then one block builds the
used-group list (the host picks per call). Both are stable and deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

SERIAL_TOKENS = 16  # up to this many tokens (decode) one thread per group partitions serially: one launch


def _popc(x):
    """Set bits of an int32 (CUDA __popc; TVM 0.27 has no CUDA lowering for tirx.popcount)."""
    return T.call_pure_extern("int32", "__popc", x)


def mask_reorder(groups: int, target_kind: str, direct_tokens: int = 0) -> tirx.PrimFunc:
    """mask [n, G] int32 (nonzero = execute) -> counts [G], order [G, n], used [G + 1] (all int32).

    `direct_tokens` (CUDA): every consumer is a tensor-core kernel whose direct variants read the mask
    themselves up to this many tokens; for such n this launches nothing and leaves the outputs unwritten."""
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

    @T.macro
    def used_permutation_serial(counts, used):
        """used[:G] = used groups then unused ones (each ascending), used[G] = their count; one thread."""
        nxt = T.decl_buffer((1,), "int32", scope="local")
        used[G] = 0
        for g in range(G):
            if counts[g] > 0:
                used[used[G]] = g
                used[G] = used[G] + 1
        nxt[0] = used[G]
        for g in range(G):
            if counts[g] == 0:
                used[nxt[0]] = g
                nxt[0] = nxt[0] + 1

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

        @T.macro
        def partition_bits(mask, counts, order, g, n, flag):
            """Group g over n <= SERIAL_TOKENS tokens: the mask column as a bit set (independent loads), then
            each token's slot from a popcount (active: active tokens before it; inactive: after all active)."""
            bits = T.decl_buffer((2,), "int32", scope="local")  # bit set, active count
            mreg = T.decl_buffer((SERIAL_TOKENS,), "int32", scope="local")
            bits[0] = 0
            for t in T.unroll(SERIAL_TOKENS):  # clamped loads in their own statements: all in flight at once
                mreg[t] = mask[T.min(t, T.Cast("int32", n) - 1), g]
            for t in T.unroll(SERIAL_TOKENS):
                bits[0] = bits[0] | T.Select(t < T.Cast("int32", n) and mreg[t] != 0, T.shift_left(1, t), 0)
            bits[1] = _popc(bits[0])
            for t in T.unroll(SERIAL_TOKENS):
                if t < T.Cast("int32", n):
                    if T.bitwise_and(T.shift_right(bits[0], t), 1) != 0:
                        order[g, _popc(T.bitwise_and(bits[0], T.shift_left(1, t) - 1))] = t
                    else:
                        order[g, bits[1] + t - _popc(T.bitwise_and(bits[0], T.shift_left(1, t) - 1))] = t
            counts[g] = bits[1]
            flag[0] = T.Select(bits[1] > 0, 1, 0)

        PT = 256  # threads of one group's block in the parallel partition
        LOG_PT = 8

        @T.macro
        def single_block(mask, counts, order, used, n, partition_too):
            """One block: thread g partitions group g (few tokens) when `partition_too`, then the used-group
            permutation by a block scan over counts > 0."""
            for bx in T.thread_binding(1, thread="blockIdx.x"):
                scan = T.decl_buffer((threads,), "int32", scope="shared")
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    reg = T.decl_buffer((2,), "int32", scope="local")
                    reg[0] = 0
                    if tx < G:
                        if partition_too:
                            partition_bits(mask, counts, order, tx, n, reg)
                        else:
                            reg[0] = T.Select(counts[tx] > 0, 1, 0)
                    scan[tx] = reg[0]
                    T.tvm_storage_sync("shared")
                    block_scan(scan, reg, tx, log_t)  # of the used flags
                    if tx < G:
                        if reg[0] != 0:  # used: after the used groups before it
                            used[scan[tx] - 1] = tx
                        else:  # unused: after all used groups, then the unused ones before it
                            used[scan[threads - 1] + tx - scan[tx]] = tx
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
            if direct_tokens > 0 and n <= direct_tokens:  # decided on the host: the direct kernels need no reorder
                T.evaluate(0)
            elif n <= SERIAL_TOKENS:  # few tokens, one launch
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
        used_permutation_serial(counts, used)

    return reorder_cpu
