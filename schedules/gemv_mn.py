"""The direct tensor-core gemm_mn (gate/up with SwiGLU, or a plain projection such as Q) for few tokens.

A block owns 16 output channels of one group; a group no token runs writes zeros and reads nothing (block-level
skipping), a token that skips the group is zeroed in the B operand (intra-block skipping). Token tiles gather only a
group's active tokens (the first `count` of the reorder's order). The building blocks (fragments, the cp.async ring,
the split-K sums, mn_plan) are schedules/gemv.py's.

Worked example: Llama-3.1-8B gate/up at groups of 128 (112 groups, K = 4096), 4 tokens: a block per 16 channels of
a group, 112 x 128 / 16 = 896 blocks; a block whose group no token runs stores zeros and reads no weight.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..knobs import GemvKnobs
from .gemv import (CHUNK, ROWS, k_split, mma_pair, mn_plan, ring_issue, ring_read, share_partials, sum_k_splits,
                   sum_over_warps, token_tile)


def gemv_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, max_tokens: int,
                 knobs: GemvKnobs = GemvKnobs(), token_tiles: bool = False):
    """Macro (x, wg, wu, mask, counts, order, used, out, n), fp16, W in the "tc" layout [N / 16, 16 K].

    Decode (n <= max_tokens, 8 or 16): the tokens themselves are the mma columns and the mask is read
    directly (a token that skips the group is zeroed in the B operand; a group no token runs reads no
    weights); the reorder outputs are not used. With `token_tiles`, any n in grid rows of `max_tokens`
    sorted tokens of the reorder (a tile past the group's count only writes its zeros)."""
    G, gs, K = groups, group_size, k_dim
    N = G * gs
    NW = 2 if swiglu else 1
    MT = max_tokens
    NT = MT // 8
    CH = K // CHUNK
    NACC = NW * NT * 4
    direct = not token_tiles
    plan = mn_plan(group_size, k_dim, swiglu, max_tokens, knobs, direct)
    W, U, S, KB = plan.warps, plan.unroll, plan.stages, plan.ksplit  # KB: blocks splitting K, CHB chunks each
    TPG = gs // ROWS  # row tiles per group
    RB = plan.row_warps  # a block's row tiles, all of one group
    KS = W // RB  # warps splitting K per row tile
    CHB = CH // KB
    steps = CHB // (U * KS)
    VEC = NW * 2  # 16-byte weight vectors per lane and chunk

    def nn(n):
        return T.Cast("int32", n)

    def cnt(counts, g, n):
        return T.min(counts[g], nn(n))

    def chunk(s, u, wy):
        """K chunk of this warp's u-th load in step s, counted from its block's first chunk (gid[3]; K is a
        multiple of KB * U * KS chunks: no bounds checks)."""
        return (s * U + u) * KS + wy // RB

    def kcol(gid, s, u, wy, lane):
        return (gid[3] + chunk(s, u, wy)) * CHUNK + lane % 4 * 8

    def wvec(gid, s, u, wy, h, lane):
        """Offset in a weight row tile of this lane's 16-byte vector h of its u-th chunk in step s."""
        return (((gid[3] + chunk(s, u, wy)) * 2 + h) * 32 + lane) * 8

    def ytiles(n):
        return (nn(n) + MT - 1) // MT if token_tiles else 1


    def col_token(by, j, lane):
        """Token (decode) or reorder slot (token tiles) of this lane's B column j."""
        return by * MT + j * 8 + lane // 4

    def out_token(by, j, e, lane):
        """Token / slot of accumulator element e of column block j (C fragment: columns 2q, 2q + 1)."""
        return by * MT + j * 8 + lane % 4 * 2 + e % 2

    def x_row(order, counts, g, by, j, lane, n):
        if direct:
            return T.min(col_token(by, j, lane), nn(n) - 1)
        return order[g, T.min(col_token(by, j, lane), cnt(counts, g, n) - 1)]  # clamped to the last active

    @T.macro
    def keeps(keep, mask, counts, g, by, lane, n):
        """keep[j]: this lane's B column j counts (decode: the mask, loaded unconditionally, then tested)."""
        for j in T.unroll(NT):
            if direct:
                keep[j] = mask[T.min(col_token(by, j, lane), nn(n) - 1), g]
                keep[j] = T.Select(col_token(by, j, lane) < nn(n) and keep[j] != 0, 1, 0)
            else:
                keep[j] = T.Select(col_token(by, j, lane) < cnt(counts, g, n), 1, 0)

    def out_row(order, g, by, j, e, lane):
        return out_token(by, j, e, lane) if direct else order[g, out_token(by, j, e, lane)]

    def gated(mask, g, by, j, e, lane, value):
        """Decode writes every token: zero where the token skips the group (token tiles write active slots)."""
        if direct:
            return T.Select(mask[out_token(by, j, e, lane), g] != 0, value, T.float16(0))
        return value

    def zfirst(counts, g, by, n):
        """Slots zfirst .. zend of a token tile are tokens that skip the group: they get zeros."""
        return T.max(cnt(counts, g, n), by * MT)

    def zend(by, n):
        return T.min(nn(n), by * MT + MT)

    @T.macro
    def group_of(gid, mask, counts, used, bx, wy, n):
        """gid = (group, this warp's row tile, whether any token runs the group)."""
        if direct:
            gid[0] = bx * RB // TPG
            gid[2] = 0
            for t in T.unroll(MT):  # unconditional clamped loads (a short-circuit && would serialise them)
                gid[2] = gid[2] | T.Select(mask[T.min(t, nn(n) - 1), bx * RB // TPG] != 0, 1, 0)
        else:
            gid[0] = bx // TPG
            gid[2] = T.Select(cnt(counts, gid[0], n) > 0, 1, 0)
        gid[1] = gid[0] * TPG + bx * RB % TPG + wy % RB

    @T.macro
    def load_x(xreg, x, order, counts, gid, by, s, wy, lane, n):
        for u in T.unroll(U):
            for j in T.unroll(NT):
                for v in T.vectorized(8):
                    xreg[(u * NT + j) * 8 + v] = x[x_row(order, counts, gid[0], by, j, lane, n),
                                                   kcol(gid, s, u, wy, lane) + v]

    @T.macro
    def multiply(wreg, xreg, af, bf, acc, keep, zero):
        for u in T.unroll(U):
            for c in T.unroll(NW):
                for j in T.unroll(NT):
                    mma_pair(wreg, xreg, af, bf, acc, (u * NW + c) * 16, (u * NT + j) * 8, (c * NT + j) * 4,
                              keep[j], zero)

    @T.macro
    def issue(ring, wg, wu, gid, step, wy, lane):
        ring_issue(ring, wg, gid[1], step, 0, U, VEC, wy, lane, S, chunk, gid[3])
        if swiglu:
            ring_issue(ring, wu, gid[1], step, 1, U, VEC, wy, lane, S, chunk, gid[3])
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def main_pass(x, wg, wu, mask, counts, order, used, out, ws, n):
        """The gated GEMM; with KB > 1 each K-split block writes its fp32 partials to `ws` instead of `out`."""
        for bx in T.thread_binding(N // (ROWS * RB), thread="blockIdx.x"):
            for byk in T.thread_binding(ytiles(n) * KB, thread="blockIdx.y"):  # token tile, K split (one of them 1)
                red = T.decl_buffer((W * NACC * 32,), "float32", scope="shared")
                ring = T.decl_buffer((max(1, W * S * U * VEC * 256),), "float16", scope="shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        gid = T.decl_buffer((4,), "int32", scope="local")  # group, row tile, has work, 1st chunk
                        group_of(gid, mask, counts, used, bx, wy, n)
                        gid[3] = k_split(byk, KB) * CHB
                        acc = T.decl_buffer((NACC,), "float32", scope="local")
                        wreg = T.decl_buffer((U * NW * 16,), "float16", scope="local")
                        xreg = T.decl_buffer((U * NT * 8,), "float16", scope="local")
                        af = T.decl_buffer((8,), "float16", scope="local")
                        bf = T.decl_buffer((4,), "float16", scope="local")
                        keep = T.decl_buffer((NT,), "int32", scope="local")
                        zero = T.decl_buffer((1,), "float16", scope="local")
                        zero[0] = T.float16(0)
                        for a in T.unroll(NACC):
                            acc[a] = T.float32(0)
                        keeps(keep, mask, counts, gid[0], token_tile(byk, KB), lane, n)
                        if S > 0:  # weights through an S-deep cp.async ring, per warp (decode only)
                            if gid[2] != 0:
                                for st in T.unroll(S - 1):
                                    if st < steps:
                                        issue(ring, wg, wu, gid, st, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                for s in range(steps):
                                    if s + S - 1 < steps:
                                        issue(ring, wg, wu, gid, s + S - 1, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                    T.ptx["cp.async.wait_group"](S - 1)  # step s landed
                                    ring_read(wreg, ring, wy, s, lane, S, U, VEC)
                                    load_x(xreg, x, order, counts, gid, token_tile(byk, KB), s, wy, lane, n)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        else:
                            if gid[2] != 0 and (direct or cnt(counts, gid[0], n) > token_tile(byk, KB) * MT):
                                for s in range(steps):
                                    for u in T.unroll(U):
                                        for h in T.unroll(2):
                                            for v in T.vectorized(8):
                                                wreg[(u * NW * 2 + h) * 8 + v] = \
                                                    wg[gid[1], wvec(gid, s, u, wy, h, lane) + v]
                                            if swiglu:
                                                for v in T.vectorized(8):
                                                    wreg[(u * NW * 2 + 2 + h) * 8 + v] = \
                                                        wu[gid[1], wvec(gid, s, u, wy, h, lane) + v]
                                    load_x(xreg, x, order, counts, gid, token_tile(byk, KB), s, wy, lane, n)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        if S > 0:  # the compiler may place `red` over the (now dead) ring
                            T.tvm_storage_sync("shared")
                        share_partials(red, acc, NACC, wy, lane)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        tot = T.decl_buffer((2,), "float32", scope="local")
                        g = T.decl_buffer((3,), "int32", scope="local")
                        group_of(g, mask, counts, used, bx, wy, n)
                        if wy < RB:
                            for j in T.unroll(NT):
                                for e in T.unroll(4):
                                    if out_token(token_tile(byk, KB), j, e, lane) < (
                                            nn(n) if direct else cnt(counts, g[0], n)):
                                        for c in T.unroll(NW):
                                            sum_over_warps(red, tot, c, (c * NT + j) * 4 + e, wy, RB, KS, NACC, lane)
                                        if KB == 1:
                                            out[out_row(order, g[0], token_tile(byk, KB), j, e, lane),
                                                g[1] * ROWS + lane // 4 + 8 * (e // 2)] = \
                                                gated(mask, g[0], token_tile(byk, KB), j, e, lane, T.Cast(
                                                    "float16",
                                                    (tot[0] * T.sigmoid(tot[0]) * tot[1]) if swiglu else tot[0]))
                                        else:  # direct kernels (token tile 0): partial sums, gated in the fix-up
                                            for c in T.unroll(NW):
                                                ws[((k_split(byk, KB) * MT + out_token(token_tile(byk, KB), j, e, lane))
                                                    * NW + c) * N + g[1] * ROWS + lane // 4 + 8 * (e // 2)] = tot[c]
                        if not direct:  # token tiles run one K split: grid row byk is the token tile
                            # this tile's tokens that skip the group: zeros (all threads share the (token, row) pairs)
                            for i in range((T.max(zend(byk, n) - zfirst(counts, g[0], byk, n), 0) * ROWS + 32 * W - 1)
                                           // (32 * W)):
                                if i * 32 * W + wy * 32 + lane < (zend(byk, n) - zfirst(counts, g[0], byk, n)) * ROWS:
                                    out[order[g[0],
                                              zfirst(counts, g[0], byk, n) + (i * 32 * W + wy * 32 + lane) // ROWS],
                                        g[1] * ROWS + (i * 32 * W + wy * 32 + lane) % ROWS] = T.float16(0)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        main_pass(x, wg, wu, mask, counts, order, used, out, out, n)

    @T.macro
    def body_split(x, wg, wu, mask, counts, order, used, out, n):
        ws = T.alloc_buffer((KB * MT * NW * N,), "float32", scope="global")  # [KB, MT, NW, N] partials
        main_pass(x, wg, wu, mask, counts, order, used, out, ws, n)
        sum_k_splits(ws, out, mask, n, KB, MT, N, NW, swiglu, gs)  # then SwiGLU and the token's gating

    return body_split if KB > 1 else body
