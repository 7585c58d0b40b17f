"""The CPU (llvm) kernels of gemm_mn and gemm_k, one token bucket's tile each (schedules/tiles.py: cpu_kernels).

Kept apart from the CUDA kernels in gemm_mn.py / gemm_k.py: a tuning record is stamped with the hash of the modules
its space's kernels come from (code_version.SPACE_SOURCES), so an edit here stales the CPU records only.

* gemm_mn over [N, K] weights: a register tile of BM tokens x BN weight rows (x2 with SwiGLU), V-wide partial sums
  over K, K in chunks whose weight rows stay in L1 while every token tile passes over them.
* gemm_k over panels of 16 columns [N / 16, K, 16] ("kp", as wide-compile stores them) or [K, N]: a task owns BN
  output columns for every token and visits the used groups; each group's gs x BN block (read in place from its
  panels, or copied out of [K, N] into a contiguous buffer) serves its active tokens BM at a time through a BM x BN
  register tile.
* the other layouts (gemm_mn over [K, N], gemm_k over [N, K]: weights a model computes rather than stores) keep
  plainer loops.
* fp16 / bf16 weights are widened to fp32 for the FMAs; where a group has more active tokens than one register tile,
  the block (gemm_k's panel run, gemm_mn's K chunk) is widened once into an fp32 buffer that every tile reads.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..weight_layout import PANEL
from .tiles import TileConfig, tile_dims
from .weights import weight_loader

L1_CHUNK_BYTES = 16 * 1024  # CPU gemm_mn: the K chunk's weight rows a task keeps in L1 (a third of a 48 KB L1d)


def _k_chunk(k_dim: int, lanes: int, rows: int) -> int:
    """K per chunk of the CPU register-tile kernel: the largest multiple of `lanes` dividing k_dim whose `rows`
    fp32 weight rows fit L1_CHUNK_BYTES (k_dim itself when none smaller does)."""
    cap = max(lanes, L1_CHUNK_BYTES // (4 * rows))
    fits = [kc for kc in range(lanes, min(k_dim, cap) + 1, lanes) if k_dim % kc == 0]
    return max(fits) if fits else k_dim


def mn_body(G: int, gs: int, K: int, swiglu: bool, dtype: str, w_layout: str, tile: TileConfig):
    """gemm_mn's CPU kernel for one token bucket's tile: macro (x, wg, wu, counts, order, out, n)."""
    load_w = weight_loader(w_layout)
    BM, BN = tile_dims(tile, gs, "the group size")
    n_col_tiles = gs // BN

    def n_tiles(n):
        return (n + BM - 1) // BM

    V = 16 if K % 16 == 0 else (8 if K % 8 == 0 else 1)  # K lanes of the row-dot partial sums (nk layout)

    def grp(task, n):
        return task // n_col_tiles // n_tiles(n)

    def row(task, n, r):
        """Sorted slot of row r of this task's token tile."""
        return task // n_col_tiles % n_tiles(n) * BM + r

    def col(task, n, c):
        return grp(task, n) * gs + task % n_col_tiles * BN + c

    H = 2 if swiglu else 1
    KC = _k_chunk(K, V, H * BN)
    chunks = K // KC

    # fp16 / bf16 weights: a chunk serving more than one token tile is converted to fp32 once (into `wbuf`) instead
    # of once per tile
    stage = dtype != "float32"

    def w_at(w, wbuf, h, c0, c, kc, k0, v, from_buf):
        """Weight row c0 + c of gate (h 0) or up (h 1), column kc * KC + k0 * V + v, as the register tile reads it:
        from the converted chunk, or in place."""
        if from_buf:
            return wbuf[h, c, k0 * V + v]
        return T.Cast("float32", w[c0 + c, kc * KC + k0 * V + v])

    @T.macro
    def token_tiles(x, wg, wu, order, out, acc, part, tok, tot, wbuf, g, c0, cnt, kc, from_buf):
        # the group's active tokens BM at a time through the register tile, over chunk kc
        for i0 in range((cnt + BM - 1) // BM):
            for r in T.unroll(BM):
                tok[r] = T.Cast("int64", order[g, T.min(i0 * BM + r, cnt - 1)])
            for h in T.unroll(H):
                for c in T.unroll(BN):
                    for r in T.unroll(BM):
                        for v in T.vectorized(V):
                            acc[h, c, r, v] = T.if_then_else(
                                kc == 0, T.float32(0), part[T.min(i0 * BM + r, cnt - 1), h, c, v])
            for k0 in range(KC // V):
                for c in T.unroll(BN):
                    for r in T.unroll(BM):
                        for v in T.vectorized(V):
                            acc[0, c, r, v] = acc[0, c, r, v] + T.Cast(
                                "float32", x[tok[r], kc * KC + k0 * V + v]) * w_at(
                                wg, wbuf, 0, c0, c, kc, k0, v, from_buf)
                        if swiglu:
                            for v in T.vectorized(V):
                                acc[1, c, r, v] = acc[1, c, r, v] + T.Cast(
                                    "float32", x[tok[r], kc * KC + k0 * V + v]) * w_at(
                                    wu, wbuf, 1, c0, c, kc, k0, v, from_buf)
            if kc + 1 < chunks:
                for r in T.unroll(BM):
                    if i0 * BM + r < cnt:
                        for h in T.unroll(H):
                            for c in T.unroll(BN):
                                for v in T.vectorized(V):
                                    part[i0 * BM + r, h, c, v] = acc[h, c, r, v]
            else:
                for r in T.unroll(BM):
                    if i0 * BM + r < cnt:
                        for c in T.unroll(BN):
                            for h in T.unroll(H):
                                tot[h] = T.float32(0)
                                for v in range(V):
                                    tot[h] = tot[h] + acc[h, c, r, v]
                            out[tok[r], c0 + c] = T.Cast(
                                dtype, (tot[0] * T.sigmoid(tot[0]) * tot[1]) if swiglu else tot[0])

    @T.macro
    def cpu_nk(x, wg, wu, counts, order, out, n):
        # one task: BN weight rows (output columns) of one group; its active tokens in tiles of BM. A tile's
        # BM x BN (x2 with SwiGLU) V-wide partial sums over K stay in registers, so each K step's vector of a
        # weight row is loaded once for BM tokens and each token's once for BN rows (a register tile, as
        # in a GEMM micro-kernel); the tile's last slots repeat its last active token, so the K loop has no
        # test, and their sums are not stored. K runs in chunks of KC whose BN weight rows stay in L1 while
        # every token tile passes over them (partial sums kept per sorted slot in `part` between chunks).
        # Partial sums reduced in a fixed order: deterministic.
        for task in T.parallel(G * n_col_tiles):
            acc = T.decl_buffer((H, BN, BM, V), "float32", scope="local")
            part = T.decl_buffer((n if chunks > 1 else 1, H, BN, V), "float32")
            tok = T.decl_buffer((BM,), "int64", scope="local")
            tot = T.decl_buffer((2,), "float32", scope="local")
            g = task // n_col_tiles
            c0 = g * gs + task % n_col_tiles * BN
            cnt = T.Cast("int64", counts[g])
            if stage:
                wbuf = T.decl_buffer((H, BN, KC), "float32", scope="local")
                for kc in range(chunks):
                    if cnt > BM:
                        for c in T.unroll(BN):
                            for k in T.vectorized(KC):
                                wbuf[0, c, k] = T.Cast("float32", wg[c0 + c, kc * KC + k])
                            if swiglu:
                                for k in T.vectorized(KC):
                                    wbuf[1, c, k] = T.Cast("float32", wu[c0 + c, kc * KC + k])
                        token_tiles(x, wg, wu, order, out, acc, part, tok, tot, wbuf, g, c0, cnt, kc, True)
                    else:
                        token_tiles(x, wg, wu, order, out, acc, part, tok, tot, wbuf, g, c0, cnt, kc, False)
            else:  # fp32 rows are read in place (`part` stands in for the conversion buffer, never read)
                for kc in range(chunks):
                    token_tiles(x, wg, wu, order, out, acc, part, tok, tot, part, g, c0, cnt, kc, False)
            for i in range(cnt, n):  # the group's skipped tokens: zeros
                for c in range(BN):
                    out[order[g, i], c0 + c] = T.Cast(dtype, 0)

    @T.macro
    def cpu_kn(x, wg, wu, counts, order, out, n):
        # one task: BM sorted tokens of one group x BN output columns, accumulated in a BM x BN register tile
        for task in T.parallel(G * n_tiles(n) * n_col_tiles):
            acc = T.decl_buffer((2, BM, BN), "float32", scope="local")
            for h, r in T.grid(2, BM):
                for c in T.vectorized(BN):
                    acc[h, r, c] = T.float32(0)
            if row(task, n, 0) < T.Cast("int64", counts[grp(task, n)]):
                for k in range(K):
                    for r in range(BM):
                        if row(task, n, r) < T.Cast("int64", counts[grp(task, n)]):
                            for c in T.vectorized(BN):
                                acc[0, r, c] = acc[0, r, c] + T.Cast("float32", x[order[grp(task, n), row(
                                    task, n, r)], k]) * T.Cast("float32", load_w(wg, k, col(task, n, c)))
                            if swiglu:
                                for c in T.vectorized(BN):
                                    acc[1, r, c] = acc[1, r, c] + T.Cast("float32", x[order[grp(task, n), row(
                                        task, n, r)], k]) * T.Cast("float32", load_w(wu, k, col(task, n, c)))
            for r in range(BM):
                if row(task, n, r) < n:
                    for c in T.vectorized(BN):
                        out[order[grp(task, n), row(task, n, r)], col(task, n, c)] = T.Select(
                            row(task, n, r) < T.Cast("int64", counts[grp(task, n)]),
                            T.Cast(dtype, (acc[0, r, c] * T.sigmoid(acc[0, r, c]) * acc[1, r, c]) if swiglu
                                   else acc[0, r, c]), T.Cast(dtype, 0))

    return cpu_nk if w_layout == "nk" else cpu_kn


def k_body(G: int, gs: int, N: int, dtype: str, w_layout: str, tile: TileConfig, tile_active):
    """gemm_k's CPU kernel for one token bucket's tile: macro (a, w, mask, counts, order, used, out, n).
    tile_active(BM): gemm_k's macro telling whether any token of a BM-token tile runs a group (the [N, K] path)."""
    load_w = weight_loader(w_layout)
    BM, BN = tile_dims(tile, N, "the output width")
    tile_any = tile_active(BM)

    V = 16 if gs % 16 == 0 else (8 if gs % 8 == 0 else 1)  # K lanes of the row-dot partial sums (nk layout)

    def tok(tile, r):
        return tile // (N // BN) * BM + r

    def ncol(tile, c):
        return tile % (N // BN) * BN + c

    @T.macro
    def cpu_nk(a, w, mask, counts, order, used, out, n):
        # one task: BM tokens x BN weight rows; each row streams only the K-slices of the used groups
        for tile in T.parallel((n + BM - 1) // BM * (N // BN)):
            acc = T.decl_buffer((BM, V), "float32", scope="local")
            flag = T.decl_buffer((1,), "int32", scope="local")
            tot = T.decl_buffer((1,), "float32", scope="local")
            for c in range(BN):
                for r in range(BM):
                    for v in T.vectorized(V):
                        acc[r, v] = T.float32(0)
                for j in range(used[G]):
                    tile_any(mask, tok(tile, 0), used[j], n, flag)
                    if flag[0] != 0:
                        for k0 in range(gs // V):
                            for r in range(BM):
                                if tok(tile, r) < n:
                                    if mask[tok(tile, r), used[j]] != 0:
                                        for v in T.vectorized(V):
                                            acc[r, v] = acc[r, v] + T.Cast(
                                                "float32", a[tok(tile, r), used[j] * gs + k0 * V + v]) * \
                                                T.Cast("float32", w[ncol(tile, c), used[j] * gs + k0 * V + v])
                for r in range(BM):
                    if tok(tile, r) < n:
                        tot[0] = T.float32(0)
                        for v in range(V):
                            tot[0] = tot[0] + acc[r, v]
                        out[tok(tile, r), ncol(tile, c)] = T.Cast(dtype, tot[0])

    panels = w_layout == "kp"
    if panels and BN % PANEL:
        raise ValueError(f"tile width {BN} is not a multiple of the {PANEL}-column weight panels ('kp' layout)")
    P = PANEL if panels else BN  # columns a vector of the register tile spans: a panel's, or the whole task's
    NP = BN // P

    # fp16 / bf16 panels: a group's block serving more than one token tile is converted to fp32 once (into `blk`)
    # instead of once per tile (a conversion per weight vector made the 64-token kernel compute-bound)
    stage = panels and dtype != "float32"

    def w_at(w, blk, g, k, task, cp, cv, from_blk):
        """Weight (row g * gs + k, column cp * P + cv of the task's BN) as the register tile reads it: straight from
        its panel ("kp"), or from the group's block in `blk` (copied out of [K, N], or converted panels)."""
        if from_blk:
            return blk[k, cp * P + cv]
        return T.Cast("float32", w[task * NP + cp, g * gs + k, cv])

    @T.macro
    def token_tiles(a, w, order, acc, blk, tile, tok, g, cnt, task, from_blk):
        # the group's active tokens BM at a time through the BM x BN register tile
        for i0 in range((cnt + BM - 1) // BM):
            for r in T.unroll(BM):
                tok[r] = T.Cast("int64", order[g, T.min(i0 * BM + r, cnt - 1)])
                for c in T.vectorized(BN):
                    tile[r, c] = acc[tok[r], c]
            for k in range(gs):
                for r in T.unroll(BM):
                    for cp in T.unroll(NP):
                        for cv in T.vectorized(P):
                            tile[r, cp * P + cv] = tile[r, cp * P + cv] + T.Cast(
                                "float32", a[tok[r], g * gs + k]) * w_at(w, blk, g, k, task, cp, cv, from_blk)
            for r in T.unroll(BM):
                if i0 * BM + r < cnt:
                    for c in T.vectorized(BN):
                        acc[tok[r], c] = tile[r, c]

    @T.macro
    def cpu_kn(a, w, mask, counts, order, used, out, n):
        # one task: BN output columns for every token. Groups are visited in `used` order; while one group's
        # gs x BN weight block stays in cache, only its active tokens (the reorder's order[g, :count])
        # accumulate into their fp32 rows, so skipped (token, group) pairs cost nothing: the work is the
        # active pairs, not the tiles that hold one. The active tokens go BM at a time through a BM x BN
        # register tile (each K row of the block loaded once for BM tokens; the tile's last slots repeat its
        # last token and are not stored back). "kp" weights: the block is BN / 16 contiguous panel runs, read in
        # place. [K, N] weights: its rows lie N floats apart (Llama's 4096: a power-of-two stride that maps them
        # all onto a few L1 sets, each row on a page of its own), so the block is first copied into a contiguous
        # buffer, the next group's prefetched meanwhile. Fixed group and token order: deterministic.
        for task in T.parallel(N // BN):
            acc = T.decl_buffer((n, BN), "float32")
            blk = T.decl_buffer((gs if stage or not panels else 1, BN), "float32", scope="local")
            tile = T.decl_buffer((BM, BN), "float32", scope="local")
            tok = T.decl_buffer((BM,), "int64", scope="local")
            for t in range(n):
                for c in T.vectorized(BN):
                    acc[t, c] = T.float32(0)
            for j in range(used[G]):
                g = used[j]
                cnt = T.Cast("int64", counts[g])
                if not panels:
                    if j + 1 < used[G]:  # the next group's gs x BN block: its rows are N apart, beyond the
                        for k in range(gs):  # hardware prefetchers, so fetch it while this group computes
                            for c0 in range((BN + 15) // 16):
                                T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(
                                    w[used[j + 1] * gs + k, task * BN + c0 * 16]), 0, 2, 1))
                    for k in range(gs):
                        for c in T.vectorized(BN):
                            blk[k, c] = T.Cast("float32", load_w(w, g * gs + k, task * BN + c))
                if stage:
                    if cnt > BM:
                        for k in range(gs):
                            for cp in T.unroll(NP):
                                for cv in T.vectorized(P):
                                    blk[k, cp * P + cv] = T.Cast("float32", w[task * NP + cp, g * gs + k, cv])
                        token_tiles(a, w, order, acc, blk, tile, tok, g, cnt, task, True)
                    else:
                        token_tiles(a, w, order, acc, blk, tile, tok, g, cnt, task, False)
                else:
                    token_tiles(a, w, order, acc, blk, tile, tok, g, cnt, task, not panels)
            for t in range(n):
                for c in T.vectorized(BN):
                    out[t, task * BN + c] = T.Cast(dtype, acc[t, c])

    return cpu_nk if w_layout == "nk" else cpu_kn
