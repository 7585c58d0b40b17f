"""Tokens ordered by their mask pattern, so that a reduction-pruned (gemm_k) tile of consecutive tokens shares skips.

A gemm_k tile of BT tokens runs every group one of its tokens runs. In token order, under random 50 % masks, 128
tokens use all 8 of O's head groups: the kernel does the dense work. Ordered by pattern, neighbours share groups:
a tile holds a few patterns, and the groups none of them runs are skipped. The patterns go in Gray-code order
(neighbouring patterns differ in one group), which on 4096 tokens of 8 groups at 50 % random masks leaves 128-token
tiles running 75 % of the groups (token order: 100 %; plain binary order: 79 %), and 66 % under skewed masks
(a model script, `git show e91c961:docs/results/experiment_pattern_order_model.py`).

A stable counting sort over the 2^G patterns in two launches of a block per THREADS tokens, a thread a token:

1. `count`: each block counts its tokens' patterns (lanes with the same pattern find each other with G + 1 ballots;
   the first of them adds their number to the block's counter, a shared-memory atomic: counts only, so the result
   is the same each run) and writes its row of hist [blocks, 2^G].
2. `place`: each block sums hist's columns (all blocks: the pattern's total; the blocks before it: its tokens'
   offset inside the pattern), scans the totals over the patterns (each pattern's first place), adds each warp's
   share before its own, and every thread writes its token's place in the order into perm and its mask row there
   into smask.

Worked example, G = 2 groups, 6 tokens with mask rows 10, 00, 11, 10, 01, 00 (patterns in Gray-code rank order 00,
01, 11, 10): the counts are 2, 1, 1, 2, so the patterns start at places 0, 2, 3, 4, and perm = [1, 5, 4, 2, 0, 3]
(the 00 tokens 1 and 5, then 01's token 4, 11's token 2, 10's tokens 0 and 3, each pattern's tokens in order).

A token's place is (its pattern's first place) + (tokens of the pattern in earlier blocks) + (in earlier warps of its
block) + (in lower lanes of its warp): stable, and no atomics decide it. The first form of this sort ran in one
block (all tokens through one SM: 12.5 us of O's 193 at 4096 tokens on an H100, docs/performance.md, thirteenth
session), then a launch scattering the order.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..knobs import MAX_GROUPS, order_groups_ok
from .warp_ops import ballot, block_scan, lanes_below, popc

THREADS = 256  # threads of a sorting block, a token each
WARPS = THREADS // 32
HIST_UNROLL = 8  # hist rows a thread loads at once when it sums a column (loads in flight, not one after another)
assert 1 << MAX_GROUPS <= THREADS


def sort_blocks(n):
    """Blocks of each sorting launch for n tokens (int or PrimExpr)."""
    return (n + THREADS - 1) // THREADS


def hist_size(groups: int, n):
    """Elements of pattern_order's int32 scratch `hist` for n tokens: a row of 2^G counts a block."""
    return sort_blocks(n) * (1 << groups)


def pattern_order(groups: int):
    """Macro (mask, perm, smask, hist, n): perm [n] = the tokens in Gray-code order of their mask pattern (stable),
    smask [n, G] = mask [perm, :], the mask in that order; hist [hist_size(G, n)] is scratch (each block's pattern
    counts). Two launches of sort_blocks(n) blocks: count, then place."""
    G = groups
    if not order_groups_ok(G):
        raise ValueError(f"tokens of {G} groups cannot be ordered by mask pattern (1 .. {MAX_GROUPS} groups)")
    B = 1 << G  # patterns
    V = 4 if G % 4 == 0 else 1  # mask entries a load (a row of 4 or 8 int32 in 16-byte loads)

    def nn(n):
        return T.Cast("int32", n)

    @T.macro
    def token_key(mask, mreg, key, t, n):
        """mreg [G] = token t's mask row; key[0] = the Gray rank of its pattern (bit G - 1 - g: group g), B past the
        tokens; key[1] = the lanes of this warp with the same key (a bit set, from G + 1 ballots: every lane of the
        warp takes part, also those past the tokens)."""
        for q in T.unroll(G // V):
            for v in T.vectorized(V):
                mreg[q * V + v] = mask[T.min(t, nn(n) - 1), q * V + v]
        key[0] = 0
        for g in T.unroll(G):
            key[0] = key[0] | T.Select(mreg[g] != 0, 1 << (G - 1 - g), 0)
        for s in T.unroll(max(1, (G - 1).bit_length())):  # inverse Gray code: the pattern's rank in Gray order
            key[0] = key[0] ^ T.shift_right(key[0], 1 << s)
        key[0] = T.Select(t < nn(n), key[0], B)
        key[1] = -1
        for b in T.unroll(G + 1):
            key[2] = T.reinterpret("int32", ballot(T.bitwise_and(T.shift_right(key[0], b), 1) != 0))
            key[1] = T.bitwise_and(key[1], T.Select(T.bitwise_and(T.shift_right(key[0], b), 1) != 0, key[2],
                                                    T.bitwise_not(key[2])))

    def leads(key, lane):
        """Whether this lane is the first of its warp with its key."""
        return T.call_pure_extern("int32", "__ffs", key[1]) - 1 == lane

    @T.macro
    def count(mask, hist, n):
        """hist[b B + p] = block b's tokens of pattern p."""
        for bx in T.thread_binding(sort_blocks(nn(n)), thread="blockIdx.x"):
            for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                cnt = T.decl_buffer((B,), "int32", scope="shared")
                key = T.decl_buffer((3,), "int32", scope="local")
                mreg = T.decl_buffer((G,), "int32", scope="local")
                if tid < B:
                    cnt[tid] = 0
                token_key(mask, mreg, key, bx * THREADS + tid, n)
                T.tvm_storage_sync("shared")
                if key[0] < B:
                    if leads(key, tid % 32):
                        T.evaluate(T.call_extern("int32", "atomicAdd", T.address_of(cnt[key[0]]), popc(key[1])))
                T.tvm_storage_sync("shared")
                if tid < B:
                    hist[bx * B + tid] = cnt[tid]

    @T.macro
    def place(mask, perm, smask, hist, n):
        """perm[place] = t and smask[place, :] = mask[t, :] for each token t, place its place in the order."""
        for bx in T.thread_binding(sort_blocks(nn(n)), thread="blockIdx.x"):
            for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                # scan: the patterns' totals, then their inclusive scan; wcnt / wstart [w B + p]: warp w's tokens of
                # pattern p, and the place of the first of them. Each written once between barriers
                scan = T.decl_buffer((THREADS,), "int32", scope="shared")
                wcnt = T.decl_buffer((WARPS * B,), "int32", scope="shared")
                wstart = T.decl_buffer((WARPS * B,), "int32", scope="shared")
                key = T.decl_buffer((3,), "int32", scope="local")
                mreg = T.decl_buffer((G,), "int32", scope="local")
                col = T.decl_buffer((HIST_UNROLL,), "int32", scope="local")
                # sums: [0] all blocks' tokens of pattern tid, [1] block_scan's scratch, [2] the earlier blocks'
                sums = T.decl_buffer((3,), "int32", scope="local")
                for i in T.unroll(WARPS * B // THREADS if WARPS * B >= THREADS else 1):
                    if i * THREADS + tid < WARPS * B:
                        wcnt[i * THREADS + tid] = 0
                sums[0] = 0
                sums[2] = 0
                if tid < B:
                    for r in range((sort_blocks(nn(n)) + HIST_UNROLL - 1) // HIST_UNROLL):
                        for u in T.unroll(HIST_UNROLL):
                            col[u] = T.Select(r * HIST_UNROLL + u < sort_blocks(nn(n)),
                                              hist[T.min(r * HIST_UNROLL + u, sort_blocks(nn(n)) - 1) * B + tid], 0)
                        for u in T.unroll(HIST_UNROLL):
                            sums[0] = sums[0] + col[u]
                            sums[2] = sums[2] + T.Select(r * HIST_UNROLL + u < bx, col[u], 0)
                scan[tid] = sums[0]
                token_key(mask, mreg, key, bx * THREADS + tid, n)
                T.tvm_storage_sync("shared")
                if key[0] < B:
                    if leads(key, tid % 32):
                        wcnt[tid // 32 * B + key[0]] = popc(key[1])
                block_scan(scan, sums, tid, (THREADS - 1).bit_length())  # (its barriers also publish wcnt)
                # pattern tid: its first place, past the earlier blocks' tokens. A barrier before wstart's writes: TVM
                # may lay wstart over the dead scan, and would otherwise insert one itself, which it cannot do inside
                # the conditions around an ordered gemm_k
                sums[1] = scan[tid] - sums[0] + sums[2]
                T.tvm_storage_sync("shared")
                if tid < B:  # then warp by warp
                    for w in T.unroll(WARPS):
                        wstart[w * B + tid] = sums[1]
                        sums[1] = sums[1] + wcnt[w * B + tid]
                T.tvm_storage_sync("shared")
                if key[0] < B:
                    key[2] = wstart[tid // 32 * B + key[0]] + lanes_below(T.reinterpret("uint32", key[1]), tid % 32)
                    perm[key[2]] = bx * THREADS + tid
                    for q in T.unroll(G // V):
                        for v in T.vectorized(V):
                            smask[key[2], q * V + v] = mreg[q * V + v]

    @T.macro
    def run(mask, perm, smask, hist, n):
        count(mask, hist, n)
        place(mask, perm, smask, hist, n)

    return run
