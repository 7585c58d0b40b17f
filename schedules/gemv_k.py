"""The direct tensor-core gemm_k (down, O projection) for few tokens.

A block owns 16 (x `rows`) output rows and streams only the K-slices of the groups some token runs: it builds that
list (and each listed group's token bit set) in shared memory from the mask rows of its tokens (`used_groups`); a
token that skips a group contributes zeros. The building blocks are schedules/gemv.py's.

Worked example: down at groups of 128 (K = 112 x 128), one token running 56 groups: each block streams 56 of the
112 K-slices of its 16 rows, 56 x 128 x 16 x 2 bytes = 229 KB instead of 459 KB.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..knobs import GemvKnobs
from .gemv import (CHUNK, ROWS, bit_words, k_plan, k_split, mma_pair, ring_at, ring_read, share_partials, sum_k_splits,
                   sum_over_warps, token_tile, used_groups)


def gemv_k_body(groups: int, group_size: int, n_dim: int, max_tokens: int, knobs: GemvKnobs = GemvKnobs(),
                token_tiles: bool = False):
    """Macro (a, w, mask, used, out, n), fp16, W [N, K = G * gs] in the "tc" layout [N / 16, 16 K]: for
    n <= max_tokens (8 to 64), or, with `token_tiles`, any n in grid rows of `max_tokens` tokens. Each block
    builds the list of groups its tokens run from the mask (decode needs no reorder launch)."""
    G, gs, N = groups, group_size, n_dim
    MT = max_tokens
    NT = MT // 8
    LPG = gs // CHUNK  # chunks per group slice
    NWD = bit_words(MT)
    direct = not token_tiles
    plan = k_plan(groups, n_dim, max_tokens, knobs, direct)
    W, U, RT, S, KB = plan.warps, plan.unroll, plan.rows, plan.stages, plan.ksplit  # KB: blocks splitting used K
    RB = plan.row_warps  # a block's row-tile groups
    KS = W // RB  # warps splitting K per row-tile group
    NACC = RT * NT * 4
    VEC = RT * 2  # 16-byte weight vectors per lane and chunk
    BITS = G + 1 + W  # where the decode token bit sets start in the shared list buffer

    def chunk(s, u, wy):
        """This block's u-th K chunk of warp wy in step s, counted from the block's first used chunk."""
        return (s * U + u) * KS + wy // RB

    def used_chunk(s, u, wy, nch):
        """Index into the used chunks (nch = [this block's count, its first]); past the count, the last one."""
        return (nch[1] if KB > 1 else 0) + T.min(chunk(s, u, wy), nch[0] - 1)

    def tile(bx, wy, rt):
        """Weight row tile rt of this warp's row-tile group."""
        return (bx * RB + wy % RB) * RT + rt

    def kchunk(g, s, u, wy, nch):
        """K chunk of this lane's u-th load in group g; chunks past the used ones repeat the last (zeroed)."""
        return g * LPG + used_chunk(s, u, wy, nch) % LPG

    def kcol(g, s, u, wy, lane, nch):
        return kchunk(g, s, u, wy, nch) * CHUNK + lane % 4 * 8

    def ytiles(n):
        return (T.Cast("int32", n) + MT - 1) // MT if token_tiles else 1

    def tok(by, j, lane, n):
        return T.min(by * MT + j * 8 + lane // 4, T.Cast("int32", n) - 1)

    def nsteps(nch):
        """Steps of U chunks per warp that cover this block's nch[0] used K chunks."""
        return (nch[0] + U * KS - 1) // (U * KS)

    @T.macro
    def keeps(keep, mask, sused, g, s, u, wy, by, j, lane, n, nch):
        """keep[u, j]: this lane's token column j counts for the u-th chunk (decode: the shared token bit
        sets; token tiles: the mask, loaded unconditionally and then tested)."""
        if direct:
            keep[u * NT + j] = T.bitwise_and(T.shift_right(
                sused[BITS + j // 4 * (G + 1) + used_chunk(s, u, wy, nch) // LPG], j % 4 * 8 + lane // 4), 1)
        else:
            keep[u * NT + j] = mask[tok(by, j, lane, n), g]
        keep[u * NT + j] = T.Select(chunk(s, u, wy) < nch[0] and by * MT + j * 8 + lane // 4 < T.Cast("int32", n)
                                    and keep[u * NT + j] != 0, 1, 0)

    def ring_chunk(sused, s, u, wy, nch):
        """Tile-layout K chunk of step s's u-th load (through the used-group list)."""
        return sused[used_chunk(s, u, wy, nch) // LPG] * LPG + used_chunk(s, u, wy, nch) % LPG

    @T.macro
    def issue(ring, w, sused, nch, bx, step, wy, lane):
        """cp.async step `step`'s weight vectors of the RT row tiles into its ring slot (like ring_issue,
        with the K chunk taken through the used-group list)."""
        for u in T.unroll(U):
            for rt in T.unroll(RT):
                for h in T.unroll(2):
                    T.ptx["cp.async.cg.shared.global"](
                        ring.ptr_to([ring_at(wy, step % S, u, rt * 2 + h, lane, S, U, VEC)]),
                        w.ptr_to([tile(bx, wy, rt), ((ring_chunk(sused, step, u, wy, nch) * 2 + h) * 32 + lane) * 8]),
                        16)
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def load_ax(xreg, keep, greg, a, mask, sused, by, s, wy, lane, n, nch):
        """Activations and token masks of step s (the weights come separately)."""
        for u in T.unroll(U):
            greg[u] = sused[used_chunk(s, u, wy, nch) // LPG]
            for j in T.unroll(NT):
                for v in T.vectorized(8):
                    xreg[(u * NT + j) * 8 + v] = a[tok(by, j, lane, n), kcol(greg[u], s, u, wy, lane, nch) + v]
                keeps(keep, mask, sused, greg[u], s, u, wy, by, j, lane, n, nch)

    @T.macro
    def multiply(wreg, xreg, af, bf, acc, keep, zero):
        for u in T.unroll(U):
            for rt in T.unroll(RT):
                for j in T.unroll(NT):
                    mma_pair(wreg, xreg, af, bf, acc, (u * RT + rt) * 16, (u * NT + j) * 8, (rt * NT + j) * 4,
                              keep[u * NT + j], zero)

    @T.macro
    def main_pass(a, w, mask, used, out, ws, n):
        """The gated GEMM; with KB > 1 each K-split block writes its fp32 partial to `ws` instead of `out`."""
        for bx in T.thread_binding(N // (ROWS * RT * RB), thread="blockIdx.x"):
            for byk in T.thread_binding(ytiles(n) * KB, thread="blockIdx.y"):  # token tile, K split (one of them 1)
                red = T.decl_buffer((W * NACC * 32,), "float32", scope="shared")
                # the used-group list, read every chunk (+ scratch for building it, + decode token bit sets)
                sused = T.decl_buffer((BITS + NWD * (G + 1),), "int32", scope="shared")
                ring = T.decl_buffer((max(1, W * S * U * VEC * 256),), "float16", scope="shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        # the groups this block's tokens run (token tiles: tile byk's; decode: all n <= MT)
                        used_groups(mask, sused, n, wy, lane, G, W, MT, BITS, byk // KB * MT)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        acc = T.decl_buffer((NACC,), "float32", scope="local")
                        wreg = T.decl_buffer((U * RT * 16,), "float16", scope="local")
                        xreg = T.decl_buffer((U * NT * 8,), "float16", scope="local")
                        af = T.decl_buffer((8,), "float16", scope="local")
                        bf = T.decl_buffer((4,), "float16", scope="local")
                        greg = T.decl_buffer((U,), "int32", scope="local")
                        keep = T.decl_buffer((U * NT,), "int32", scope="local")
                        zero = T.decl_buffer((1,), "float16", scope="local")
                        zero[0] = T.float16(0)
                        nch = T.decl_buffer((2,), "int32", scope="local")  # this block's used chunks, first
                        nch[1] = (sused[G] * LPG + KB - 1) // KB * k_split(byk, KB)
                        nch[0] = T.max(T.min((sused[G] * LPG + KB - 1) // KB, sused[G] * LPG - nch[1]), 0)
                        for i in T.unroll(NACC):
                            acc[i] = T.float32(0)
                        if S > 0:  # weights through an S-deep cp.async ring, per warp (decode only)
                            if nch[0] > 0:
                                for st in T.unroll(S - 1):
                                    if st < nsteps(nch):
                                        issue(ring, w, sused, nch, bx, st, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                for s in range(nsteps(nch)):
                                    if s + S - 1 < nsteps(nch):
                                        issue(ring, w, sused, nch, bx, s + S - 1, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                    T.ptx["cp.async.wait_group"](S - 1)  # step s landed
                                    ring_read(wreg, ring, wy, s, lane, S, U, VEC)
                                    load_ax(xreg, keep, greg, a, mask, sused, token_tile(byk, KB), s, wy, lane, n, nch)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        else:
                            if nch[0] > 0:
                                for s in range(nsteps(nch)):
                                    for u in T.unroll(U):
                                        for rt in T.unroll(RT):
                                            for h in T.unroll(2):
                                                for v in T.vectorized(8):
                                                    wreg[((u * RT + rt) * 2 + h) * 8 + v] = w[tile(bx, wy, rt), (
                                                        (kchunk(sused[used_chunk(s, u, wy, nch) // LPG], s, u, wy, nch)
                                                         * 2 + h) * 32 + lane) * 8 + v]
                                    load_ax(xreg, keep, greg, a, mask, sused, token_tile(byk, KB), s, wy, lane, n,
                                            nch)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        # the compiler may place `red` over the (now dead) list: every warp must be done reading it
                        T.tvm_storage_sync("shared")
                        share_partials(red, acc, NACC, wy, lane)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        tot = T.decl_buffer((1,), "float32", scope="local")
                        if wy < RB:
                            for rt in T.unroll(RT):
                                for j in T.unroll(NT):
                                    for e in T.unroll(4):
                                        if token_tile(byk, KB) * MT + j * 8 + lane % 4 * 2 + e % 2 < T.Cast("int32", n):
                                            sum_over_warps(red, tot, 0, (rt * NT + j) * 4 + e, wy, RB, KS, NACC, lane)
                                            if KB == 1:
                                                out[token_tile(byk, KB) * MT + j * 8 + lane % 4 * 2 + e % 2,
                                                    tile(bx, wy, rt) * ROWS + lane // 4 + 8 * (e // 2)] = \
                                                    T.Cast("float16", tot[0])
                                            else:  # direct kernels: token tile 0
                                                ws[(k_split(byk, KB) * MT + j * 8 + lane % 4 * 2 + e % 2) * N
                                                   + tile(bx, wy, rt) * ROWS + lane // 4 + 8 * (e // 2)] = tot[0]

    @T.macro
    def body(a, w, mask, used, out, n):
        main_pass(a, w, mask, used, out, out, n)

    @T.macro
    def body_split(a, w, mask, used, out, n):
        ws = T.alloc_buffer((KB * MT * N,), "float32", scope="global")  # [KB, MT, N] partials
        main_pass(a, w, mask, used, out, ws, n)
        sum_k_splits(ws, out, mask, n, KB, MT, N, 1, False, 0)

    return body_split if KB > 1 else body
