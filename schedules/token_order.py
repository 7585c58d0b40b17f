"""Tokens ordered by their mask pattern, so that a reduction-pruned (gemm_k) tile of consecutive tokens shares skips.

A gemm_k tile of BT tokens runs every group one of its tokens runs. In token order, under random 50 % masks, 128
tokens use all 8 of O's head groups: the kernel does the dense work. Ordered by pattern, neighbours share groups:
a tile holds a few patterns, and the groups none of them runs are skipped. The patterns go in Gray-code order
(neighbouring patterns differ in one group), which on 4096 tokens of 8 groups at 50 % random masks leaves 128-token
tiles running 75 % of the groups (token order: 100 %; plain binary order: 79 %), and 66 % under skewed masks
(docs/results/experiment_pattern_order_model.py).

One block (WARPS warps) sorts all n tokens: a stable counting sort over the 2^G patterns. Warp w takes tokens
w L .. (w + 1) L - 1 in chunks of 32, ROUND chunks' mask rows loaded at once; lanes with the same pattern find each
other with G + 1 ballots, and the first of them adds their count to the warp's counter of the pattern (a
shared-memory atomic: only counts, and a chunk's adds go after the chunk before's, so every token's place is the
same each run). A second launch, a thread a token, writes the order and the mask in it (one SM's L1 serving those
scattered 4-byte stores and the mask's 4-byte loads made the first form of this sort take 49 us for 4096 tokens on
the H200; now 6.3 / 6.6 / 8.1 / 12 us for 513 / 1024 / 2048 / 4096 tokens, then 3.3 us).
Warp 0's scan shuffles over the whole warp (0xFFFFFFFF). The crashes of the first ordered O builds in back-to-back
calls on the H200 were not this sort's: alone, 24000 sorts at 1536-9000 tokens all matched host_order, while the GEMM
after it waited on TMA mbarriers that one thread had initialised without a block barrier before the others' first
wait (schedules/wgmma_gemm.py, fixed; docs/performance.md, 2026-12-04, ninth session).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .mask_reorder import _ballot, _lanes_below, _popc

WARPS = 16  # warps of the sorting block
ROUND = 8  # 32-token chunks a warp loads at once (4096 tokens: one round)
MAX_GROUPS = 8  # patterns of at most this many groups: 2^G buckets of per-warp counts fit shared memory


def order_groups_ok(groups: int) -> bool:
    """Whether tokens of `groups` groups can be ordered by pattern (2^G buckets)."""
    return 1 <= groups <= MAX_GROUPS


def host_order(mask):
    """NumPy model of pattern_order's perm for a mask [n, G] (the same key, stable): for tests and estimates."""
    import numpy as np

    mask = np.asarray(mask) != 0
    if not order_groups_ok(mask.shape[1]):
        raise ValueError(f"tokens of {mask.shape[1]} groups cannot be ordered by mask pattern (1 .. {MAX_GROUPS} groups)")
    key = (mask * (1 << np.arange(mask.shape[1] - 1, -1, -1))).sum(1)
    shift = 1
    while shift < mask.shape[1]:  # inverse Gray code, as the kernel's
        key = key ^ (key >> shift)
        shift *= 2
    return np.argsort(key, kind="stable")


def pattern_order(groups: int):
    """Macro (mask, perm, smask, place, n): perm [n] = the tokens in Gray-code order of their mask pattern (stable),
    smask [n, G] = mask [perm, :], the mask in that order; place [n] is scratch (each token's key, then its
    place). Two launches: the sort (one block), then the scatter of perm and smask (a thread a token)."""
    G = groups
    if not order_groups_ok(G):
        raise ValueError(f"tokens of {G} groups cannot be ordered by mask pattern (1 .. {MAX_GROUPS} groups)")
    B = 1 << G  # patterns
    THREADS = 32 * WARPS
    V = 4 if G % 4 == 0 else 1  # mask entries a load (a row of 4 or 8 int32 in 16-byte loads)

    def nn(n):
        return T.Cast("int32", n)

    def chunks(n):
        """32-token chunks of a warp's segment (warp w: tokens w 32 chunks(n) on)."""
        return (nn(n) + THREADS - 1) // THREADS

    def token(tid, r, c, n):
        """Lane tid % 32's token of chunk c of round r of its warp."""
        return tid // 32 * chunks(n) * 32 + (r * ROUND + c) * 32 + tid % 32

    def live(tid, r, c, n):
        """Whether chunk c of round r is one of the warp's and this lane's token is one of the n."""
        return tirx.all(token(tid, r, c, n) < nn(n), r * ROUND + c < chunks(n))

    @T.macro
    def mask_keys(mask, mreg, key, tid, r, n):
        """key[3 c] = the Gray rank of the pattern of this lane's token of chunk c of round r (bit G - 1 - g: group
        g), B where not live. The round's mask rows load first (into mreg [ROUND G]), all in flight together: a
        chunk at a time, a warp would wait for each (the first form of this sort took 49 us for 4096 tokens on the
        H200, most of it one SM's L1 serving 4-byte loads)."""
        for c in T.unroll(ROUND):
            if r * ROUND + c < chunks(n):  # (the same for the whole block: no chunk past the segments runs)
                for q in T.unroll(G // V):
                    for v in T.vectorized(V):
                        mreg[c * G + q * V + v] = mask[T.min(token(tid, r, c, n), nn(n) - 1), q * V + v]
        for c in T.unroll(ROUND):
            key[3 * c] = 0
            for g in T.unroll(G):
                key[3 * c] = key[3 * c] | T.Select(mreg[c * G + g] != 0, 1 << (G - 1 - g), 0)
            for s in T.unroll(max(1, (G - 1).bit_length())):  # inverse Gray code: the pattern's rank in Gray order
                key[3 * c] = key[3 * c] ^ T.shift_right(key[3 * c], 1 << s)
            key[3 * c] = T.Select(live(tid, r, c, n), key[3 * c], B)

    @T.macro
    def same_keys(key, c):
        """key[3 c + 1] = the lanes whose chunk-c key equals this lane's (a bit set, from G + 1 ballots; on the H200
        __match_any_sync instead made the sort of 4096 tokens 2.5 us slower)."""
        key[3 * c + 1] = -1
        for b in T.unroll(G + 1):
            key[3 * c + 2] = T.reinterpret("int32", _ballot(T.bitwise_and(T.shift_right(key[3 * c], b), 1) != 0))
            key[3 * c + 1] = T.bitwise_and(key[3 * c + 1], T.Select(
                T.bitwise_and(T.shift_right(key[3 * c], b), 1) != 0, key[3 * c + 2], T.bitwise_not(key[3 * c + 2])))

    def atomic_add(buf, i, v):
        """buf[i] += v in shared memory, returning the old value (CUDA atomicAdd: counts, so the order of a warp's
        adds does not change the result)."""
        return T.call_extern("int32", "atomicAdd", T.address_of(buf[i]), v)

    def leader(key, c):
        """The first lane of chunk c's lanes with this lane's key."""
        return T.call_pure_extern("int32", "__ffs", key[3 * c + 1]) - 1

    @T.macro
    def sort(mask, place, n):
        """place[t] = token t's place in the order (one block)."""
        for bx in T.thread_binding(1, thread="blockIdx.x"):
            for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                # per warp and pattern: its tokens (hist), then the pattern's first place for them (starts); per
                # pattern: its tokens (tot), its first place (pstart). Separate buffers, each written once: shared
                # memory is never updated in place but by atomics
                hist = T.decl_buffer((WARPS * B,), "int32", scope="shared")
                starts = T.decl_buffer((WARPS * B,), "int32", scope="shared")
                tot = T.decl_buffer((B,), "int32", scope="shared")
                pstart = T.decl_buffer((B,), "int32", scope="shared")
                key = T.decl_buffer((3 * ROUND,), "int32", scope="local")  # a chunk: key, same-key lanes, scratch
                mreg = T.decl_buffer((ROUND * G,), "int32", scope="local")  # the round's mask rows
                sc = T.decl_buffer((3,), "int32", scope="local")  # scan scratch
                for i in T.unroll((WARPS * B + THREADS - 1) // THREADS):
                    if i * THREADS + tid < WARPS * B:
                        hist[i * THREADS + tid] = 0
                T.tvm_storage_sync("shared")
                for r in range((chunks(n) + ROUND - 1) // ROUND):  # each warp counts its segment's patterns
                    mask_keys(mask, mreg, key, tid, r, n)
                    for c in T.unroll(ROUND):
                        if r * ROUND + c < chunks(n):
                            if live(tid, r, c, n):  # (kept for the placing pass: 4-byte stores a lane, coalesced)
                                place[token(tid, r, c, n)] = key[3 * c]
                            same_keys(key, c)
                            if key[3 * c] < B:
                                if leader(key, c) == tid % 32:
                                    key[3 * c + 2] = atomic_add(hist, tid // 32 * B + key[3 * c],
                                                                _popc(key[3 * c + 1]))
                T.tvm_storage_sync("shared")
                for i in T.unroll((B + THREADS - 1) // THREADS):
                    if i * THREADS + tid < B:  # a pattern: each warp's first place among its tokens, and its total
                        sc[0] = 0
                        for w in T.unroll(WARPS):
                            starts[w * B + i * THREADS + tid] = sc[0]
                            sc[0] = sc[0] + hist[w * B + i * THREADS + tid]
                        tot[i * THREADS + tid] = sc[0]
                T.tvm_storage_sync("shared")
                if tid < 32:  # warp 0: the patterns' first places (B / 32 patterns a lane, then a warp scan)
                    sc[0] = 0
                    for j in T.unroll((B + 31) // 32):
                        if tid * ((B + 31) // 32) + j < B:
                            sc[0] = sc[0] + tot[tid * ((B + 31) // 32) + j]
                    sc[1] = sc[0]
                    for s in T.unroll(5):
                        sc[2] = T.tvm_warp_shuffle_up(T.uint32(0xFFFFFFFF), sc[1], 1 << s, 32, 32)
                        sc[1] = sc[1] + T.Select(tid >= (1 << s), sc[2], 0)
                    sc[1] = sc[1] - sc[0]  # exclusive
                    for j in T.unroll((B + 31) // 32):
                        if tid * ((B + 31) // 32) + j < B:
                            pstart[tid * ((B + 31) // 32) + j] = sc[1]
                            sc[1] = sc[1] + tot[tid * ((B + 31) // 32) + j]
                T.tvm_storage_sync("shared")
                for r in range((chunks(n) + ROUND - 1) // ROUND):  # each warp places its tokens, chunk by chunk
                    for c in T.unroll(ROUND):
                        if r * ROUND + c < chunks(n):
                            key[3 * c] = T.Select(live(tid, r, c, n), place[T.min(token(tid, r, c, n), nn(n) - 1)],
                                                  B)
                    for c in T.unroll(ROUND):
                        if r * ROUND + c < chunks(n):
                            same_keys(key, c)
                            key[3 * c + 2] = 0
                            if key[3 * c] < B:
                                if leader(key, c) == tid % 32:  # the key's place so far in this warp's share
                                    key[3 * c + 2] = atomic_add(starts, tid // 32 * B + key[3 * c],
                                                                _popc(key[3 * c + 1]))
                            key[3 * c + 2] = T.tvm_warp_shuffle(T.uint32(0xFFFFFFFF), key[3 * c + 2],
                                                                T.max(leader(key, c), 0), 32, 32)
                            if key[3 * c] < B:
                                place[token(tid, r, c, n)] = pstart[key[3 * c]] + key[3 * c + 2] + _lanes_below(
                                    T.reinterpret("uint32", key[3 * c + 1]), tid % 32)

    @T.macro
    def scatter(mask, perm, smask, place, n):
        """perm[place[t]] = t, smask[place[t], :] = mask[t, :]: a thread a token, over the GPU."""
        for bx in T.thread_binding((nn(n) + 255) // 256, thread="blockIdx.x"):
            for tx in T.thread_binding(256, thread="threadIdx.x"):
                if bx * 256 + tx < nn(n):
                    perm[place[bx * 256 + tx]] = bx * 256 + tx
                    for q in T.unroll(G // V):
                        for v in T.vectorized(V):
                            smask[place[bx * 256 + tx], q * V + v] = mask[bx * 256 + tx, q * V + v]

    @T.macro
    def run(mask, perm, smask, place, n):
        sort(mask, place, n)
        scatter(mask, perm, smask, place, n)

    return run
