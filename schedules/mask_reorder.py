"""Mask reorder: per group, the count of active tokens and a stable permutation with active tokens first.

`order[g, :counts[g]]` are the active tokens of group g in ascending order, `order[g, counts[g]:]` the
inactive ones. `used[:G]` is a permutation of the groups: the groups at least one token executes first,
ascending, then the others, ascending; `used[G]` is the number of used groups. The CPU gemm_k streams
only the weights of `used[:used[G]]`. The block-sparse kernels walk `order` in tiles: a tile entirely
past `counts[g]` holds no active token and is skipped. Computed on device; no host sort.

Worked example, 4 tokens, G = 3, mask rows [1 0 1], [0 0 1], [1 0 0], [0 0 1] (token t's row: the groups it runs):
counts = [2, 0, 3]; order = [[0, 2, 1, 3], [0, 1, 2, 3], [0, 1, 3, 2]] (group 0's active tokens 0 and 2 first, then
the inactive 1 and 3, each part ascending); used = [0, 2, 1, 2] (groups 0 and 2 are used, then group 1; 2 used).

CUDA: up to SERIAL_TOKENS tokens, one block whose thread g reads its group's mask column as a bit set
and places every token from popcounts (independent loads, no serial chain; one launch), then builds
the used-group list; more tokens, one launch with a block per group: 16 independent loads a thread,
a warp ballot per 32 consecutive tokens, one block scan of the warp counts per 4096 tokens, and
coalesced writes of the warp's slots. The many-token CUDA kernels take the groups in natural order,
so this path leaves `used` unwritten (the host picks the path per call). Both are stable and
deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .warp_ops import ballot, block_scan, lanes_below, popc

SERIAL_TOKENS = 16  # up to this many tokens (decode) one thread per group partitions serially: one launch


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
            bits[1] = popc(bits[0])
            for t in T.unroll(SERIAL_TOKENS):
                if t < T.Cast("int32", n):
                    if T.bitwise_and(T.shift_right(bits[0], t), 1) != 0:
                        order[g, popc(T.bitwise_and(bits[0], T.shift_left(1, t) - 1))] = t
                    else:
                        order[g, bits[1] + t - popc(T.bitwise_and(bits[0], T.shift_left(1, t) - 1))] = t
            counts[g] = bits[1]
            flag[0] = T.Select(bits[1] > 0, 1, 0)

        @T.macro
        def single_block(mask, counts, order, used, n):
            """One block: thread g partitions group g (few tokens), then the used-group permutation by a block
            scan over counts > 0."""
            for bx in T.thread_binding(1, thread="blockIdx.x"):
                scan = T.decl_buffer((threads,), "int32", scope="shared")
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    reg = T.decl_buffer((2,), "int32", scope="local")
                    reg[0] = 0
                    if tx < G:
                        partition_bits(mask, counts, order, tx, n, reg)
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

        PT = 256  # threads of one group's block in the parallel partition
        LOG_PT = 8
        PW = PT // 32  # its warps
        PE = 16  # tokens per thread in one round: a round covers PT x PE tokens with one block scan

        def _tok(r, j, tx):
            """Token j of thread tx in round r: j-major, so a warp's lanes hold 32 consecutive tokens."""
            return r * PT * PE + j * PT + tx

        @T.macro
        def round_bits(mask, bal, g, r, tx, n):
            """bal[j] = the warp's ballot of which of its 32 tokens of row j (round r) run group g: PE independent
            clamped loads first, all in flight at once."""
            for j in T.unroll(PE):
                bal[j] = T.Cast("uint32", mask[T.min(_tok(r, j, tx), T.Cast("int32", n) - 1), g])
            for j in T.unroll(PE):
                bal[j] = ballot(_tok(r, j, tx) < T.Cast("int32", n) and bal[j] != T.uint32(0))

        @T.macro
        def parallel_partition(mask, counts, order, n):
            """Block g partitions group g in rounds of PT x PE tokens: per row of PT tokens each warp ballots its
            32, one block scan of the PE x PW warp counts (token order) places every token (stable), and each
            warp's lanes write consecutive slots (coalesced). Up to PT x PE tokens the round's scan also gives
            the active total the inactive tokens' slots need; past it a counting pass comes first."""
            for bx in T.thread_binding(G, thread="blockIdx.x"):
                scan = T.decl_buffer((PT,), "int32", scope="shared")  # warp counts, row-major (token order)
                for tx in T.thread_binding(PT, thread="threadIdx.x"):
                    bal = T.decl_buffer((PE,), "uint32", scope="local")
                    reg = T.decl_buffer((4,), "int32", scope="local")  # -, total, active before round, before lane
                    scr = T.decl_buffer((2,), "int32", scope="local")  # block_scan's scratch (its [1])
                    rounds = (T.Cast("int32", n) + PT * PE - 1) // (PT * PE)
                    reg[1] = 0
                    if rounds > 1:  # the total active count first (one round: its scan gives it)
                        reg[0] = 0
                        for r in range(rounds):
                            round_bits(mask, bal, bx, r, tx, n)
                            for j in T.unroll(PE):
                                reg[0] = reg[0] + popc(T.reinterpret("int32", bal[j]))
                        scan[tx] = T.Select(tx % 32 == 0, reg[0], 0)  # a warp's lanes agree: its first counts
                        T.tvm_storage_sync("shared")
                        block_scan(scan, scr, tx, LOG_PT)
                        reg[1] = scan[PT - 1]
                        T.tvm_storage_sync("shared")
                    reg[2] = 0
                    for r in range(rounds):
                        round_bits(mask, bal, bx, r, tx, n)
                        scan[tx] = 0
                        T.tvm_storage_sync("shared")
                        if tx % 32 == 0:
                            for j in T.unroll(PE):
                                scan[j * PW + tx // 32] = popc(T.reinterpret("int32", bal[j]))
                        T.tvm_storage_sync("shared")
                        block_scan(scan, scr, tx, LOG_PT)  # inclusive, over the PE x PW counts (zeros past them)
                        if rounds == 1:
                            reg[1] = scan[PT - 1]
                        for j in T.unroll(PE):
                            # active tokens before this lane's: earlier rows and warps, then lower lanes
                            reg[3] = reg[2] + scan[j * PW + tx // 32] - popc(T.reinterpret("int32", bal[j])) + \
                                lanes_below(bal[j], tx % 32)
                            if _tok(r, j, tx) < T.Cast("int32", n):
                                if T.bitwise_and(T.shift_right(bal[j], T.Cast("uint32", tx % 32)), T.uint32(1)) != \
                                        T.uint32(0):
                                    order[bx, reg[3]] = _tok(r, j, tx)
                                else:  # after all active tokens, then the inactive ones before it
                                    order[bx, reg[1] + _tok(r, j, tx) - reg[3]] = _tok(r, j, tx)
                        reg[2] = reg[2] + scan[PT - 1]
                        T.tvm_storage_sync("shared")
                    if tx == 0:
                        counts[bx] = reg[1]

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
                single_block(mask, counts, order, used, n)
            else:  # many tokens: one block per group, one launch (the many-token kernels do not read `used`)
                parallel_partition(mask, counts, order, n)

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
