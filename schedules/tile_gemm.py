"""Tensor-core tile kernels for gated projections over many tokens (prefill, and past the direct kernels).

A block owns a tile of `tokens` tokens x (warp rows x `rows` x 16) output channels and walks K in 32-wide
chunks. The tile's activations stream through an S-deep cp.async ring in shared memory (each byte copied
once per block and read by all its warps); the weights stream from the "tc" layout (wide_tvm/weight_layout.py)
straight into registers, `prefetch` chunks ahead of their mma. `mma.sync.m16n8k16` takes the weights as the
16-row A operand and the tokens as the 8-column B operand (the fragment permutation of schedules/gemv.py: a
lane's 16-byte activation vector is its B fragment of two mmas), fp16 in, fp32 accumulate; every output
element is written by exactly one thread, so results are deterministic.

* `tile_mn_body` (gate/up with SwiGLU, Q): token tiles are sorted per group by the mask reorder. A tile past
  the group's active count writes its zeros and reads nothing (block-level skipping); inside a tile, rows past
  the count are zero-filled by the copy itself (src-size 0: no bytes read).
* `tile_k_body` (down, O): token tiles in natural order. A block lists the groups some token of its tile runs
  (with each listed group's token bit set) and streams only their K chunks (block-level skipping); an
  activation row of a token that skips the group is zero-filled by the copy (intra-block skipping on the
  load), so the mma loop has no per-token tests.
"""

from __future__ import annotations

from math import gcd

from tvm.script import tirx as T

from ..knobs import TILE_BUCKETS, SmemTile
from .gemv import CHUNK, ROWS, a_fragment, bit_words, token_runs, used_groups

WARPS = 8  # warps per block: WR along the channels x WT along the tokens
THREADS = 32 * WARPS


def many_token_kernels(knobs: tuple, gemv_tiles, make_tiles, make_wgmma) -> list:
    """[(bound, body), ..., (None, body)] for the token buckets past the direct kernels: gemv_tiles() builds the
    sorted 64-token gemv body, make_tiles(SmemTile) the mma.sync tile GEMM body, make_wgmma(WgmmaMN / WgmmaK) the
    wgmma one (schedules/wgmma_mn.py, wgmma_k.py); equal knobs share one body."""
    make = {"gemv": lambda _: gemv_tiles(), "smem": make_tiles, "wgmma": make_wgmma}
    if len(knobs) != len(TILE_BUCKETS) + 1:
        raise ValueError(f"tile knobs for {len(knobs)} token buckets; there are {len(TILE_BUCKETS) + 1} "
                         f"(<= {', <= '.join(map(str, TILE_BUCKETS))} tokens, more)")
    bodies = {}
    for k in knobs:
        if k not in bodies:
            bodies[k] = make[k.kernel](k)
    return [(bound, bodies[k]) for bound, k in zip(TILE_BUCKETS + (None,), knobs)]


def _warp_grid(row_tiles: int, knobs: SmemTile) -> tuple[int, int, int]:
    """(row tiles per warp, warps along the channels, warps along the tokens) for `row_tiles` 16-channel tiles
    that a block may share activations over."""
    knobs.validate()
    rt = knobs.rows if row_tiles % knobs.rows == 0 else 1
    wr = gcd(row_tiles // rt, WARPS)
    return rt, wr, WARPS // wr


@T.macro
def _mma_chunk(wbuf, w_off, breg, af, bf, acc, acc_off):
    """Two m16n8k16 mmas over one 32-wide K chunk: weights at wbuf[w_off] (row g: 0..7, row g + 8: 8..15),
    this lane's activation vector in breg[0:8] (zero where the copy zero-filled it). The operands are copied
    element by element into af / bf: the vector load types breg as one uint4, which an mma operand offset
    would then count in 16-byte units."""
    for p in T.unroll(2):
        for e in T.unroll(4):
            bf[e] = breg[4 * p + e]
        a_fragment(af, wbuf, w_off, p)
        T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", af.data, 0, bf.data, 0,
                         acc.data, acc_off, False)


def _ring_at(step, row, tid, stages: int, tokens: int):
    """Offset (halves) in the activation ring of tile row `row` of K step `step`, this thread's 16-byte column."""
    return (step % stages * tokens + row) * CHUNK + tid % 4 * 8


def _copy_row(c, tid):
    """Tile row of this thread's c-th 16-byte copy of a step (4 copies per 32-wide row)."""
    return (c * THREADS + tid) // 4


def _out_slot(bt, wy, j, e, lane, tokens: int, wr: int, tw: int):
    """Tile slot (token, or sorted position) of accumulator element e of column block j (C fragment: columns
    2q, 2q + 1) of warp wy, in token tile bt."""
    return bt * tokens + wy // wr * tw + j * 8 + lane % 4 * 2 + e % 2


def _out_channel(tile, lane, e):
    """Output channel of accumulator element e (C fragment: rows g, g + 8) in 16-row tile `tile`."""
    return tile * ROWS + lane // 4 + 8 * (e // 2)


def copies_per_thread(tokens: int) -> int:
    """16-byte activation copies each thread issues per K step (a tile row of 32 halves is 4 copies)."""
    return tokens * 4 // THREADS


def k_loop(knobs: SmemTile, nw: int, rt: int, nt: int, tw: int, issue, load_w):
    """Macro (xs, wbuf, breg, af, bf, acc, nsteps, wt, lane, *args): the K loop of a tile kernel, with its
    kernel's `issue(step, nsteps, xs, *args)` (cp.async one activation stage into the ring xs, or an empty group
    past the last) and `load_w(wbuf, step, slot, *args)` (one chunk of this warp's weights into register slot
    `slot`).

    Step s waits for its activation stage, then one barrier (every warp's copies of step s landed, and every
    warp is done with step s - 1, whose ring slot the copy of step s + S - 1 reuses), then the multiply; the
    weights of step s + P are loaded at the start of step s. The loop is unrolled P + 1 times, so that the
    register slots are constants."""
    S, P = knobs.stages, knobs.prefetch
    SLOT = nw * rt * 16  # weight halves per lane and chunk

    @T.macro
    def run(xs, wbuf, breg, af, bf, acc, nsteps, wt, lane, *args):
        for st in T.unroll(S - 1):
            issue(st, nsteps, xs, *args)
        for p in T.unroll(P):
            if p < nsteps:
                load_w(wbuf, p, p, *args)
        for s0 in range((nsteps + P) // (P + 1)):
            for b in T.unroll(P + 1):
                if s0 * (P + 1) + b < nsteps:
                    if s0 * (P + 1) + b + P < nsteps:
                        load_w(wbuf, s0 * (P + 1) + b + P, (b + P) % (P + 1), *args)
                    T.ptx["cp.async.wait_group"](S - 2)
                    T.tvm_storage_sync("shared")
                    issue(s0 * (P + 1) + b + S - 1, nsteps, xs, *args)
                    for j in T.unroll(nt):
                        for v in T.vectorized(8):
                            breg[v] = xs[_ring_at(s0 * (P + 1) + b, wt * tw + j * 8 + lane // 4, lane, S,
                                                  knobs.tokens) + v]
                        for c in T.unroll(nw):
                            for r in T.unroll(rt):
                                _mma_chunk(wbuf, b * SLOT + (c * rt + r) * 16, breg, af, bf, acc,
                                           ((c * rt + r) * nt + j) * 4)
        T.ptx["cp.async.wait_group"](0)  # no copy outlives the kernel (the last ones were empty groups)

    return run


def tile_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, knobs: SmemTile = SmemTile()):
    """Macro (x, wg, wu, mask, counts, order, used, out, n): out [n, G * gs] of x [n, K] and W in the "tc"
    layout [N / 16, 16 K] (gate and up with SwiGLU), walking each group's tokens in the reorder's order."""
    G, gs, K = groups, group_size, k_dim
    TPG = gs // ROWS  # row tiles per group
    RT, WR, WT = _warp_grid(TPG, knobs)
    BT, S = knobs.tokens, knobs.stages
    TW = BT // WT  # tokens per warp
    NT = TW // 8
    BR = WR * RT  # row tiles per block
    BPG = TPG // BR  # blocks per group
    NW = 2 if swiglu else 1
    NACC = NW * RT * NT * 4
    CH = K // CHUNK
    CPT = copies_per_thread(BT)

    def nn(n):
        return T.Cast("int32", n)

    def tile0(gi, bg):
        """First row tile of this block."""
        return gi[0] * TPG + bg % BPG * BR

    @T.macro
    def issue(step, nsteps, xs, x, wg, wu, trow, tsz, gi, bg, wr, wy, lane):
        if step < nsteps:
            for c in T.unroll(CPT):
                T.ptx["cp.async.cg.shared.global"](
                    xs.ptr_to([_ring_at(step, _copy_row(c, wy * 32 + lane), wy * 32 + lane, S, BT)]),
                    x.ptr_to([trow[c], step * CHUNK + lane % 4 * 8]), 16, tsz[c])
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def load_w(wbuf, step, slot, x, wg, wu, trow, tsz, gi, bg, wr, wy, lane):
        for r in T.unroll(RT):
            for h in T.unroll(2):
                for v in T.vectorized(8):
                    wbuf[((slot * NW * RT + r) * 2 + h) * 8 + v] = \
                        wg[tile0(gi, bg) + wr * RT + r, ((step * 2 + h) * 32 + lane) * 8 + v]
                if swiglu:
                    for v in T.vectorized(8):
                        wbuf[((slot * NW * RT + RT + r) * 2 + h) * 8 + v] = \
                            wu[tile0(gi, bg) + wr * RT + r, ((step * 2 + h) * 32 + lane) * 8 + v]

    run = k_loop(knobs, NW, RT, NT, TW, issue, load_w)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        for bt in T.thread_binding((nn(n) + BT - 1) // BT, thread="blockIdx.x"):  # a group's tiles run together
            for bg in T.thread_binding(G * BPG, thread="blockIdx.y"):
                xs = T.decl_buffer((S * BT * CHUNK,), "float16", scope="shared")
                for wy in T.thread_binding(WARPS, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        gi = T.decl_buffer((2,), "int32", scope="local")  # group, its active tokens
                        gi[0] = bg // BPG
                        gi[1] = T.min(counts[gi[0]], nn(n))
                        if bt * BT < gi[1]:
                            acc = T.decl_buffer((NACC,), "float32", scope="local")
                            wbuf = T.decl_buffer(((knobs.prefetch + 1) * NW * RT * 16,), "float16", scope="local")
                            breg = T.decl_buffer((8,), "float16", scope="local")
                            af = T.decl_buffer((8,), "float16", scope="local")
                            bf = T.decl_buffer((4,), "float16", scope="local")
                            trow = T.decl_buffer((CPT,), "int32", scope="local")  # token of each copy row
                            tsz = T.decl_buffer((CPT,), "uint32", scope="local")  # its bytes: 16, or 0 past the count
                            for c in T.unroll(CPT):
                                trow[c] = order[gi[0], T.min(bt * BT + _copy_row(c, wy * 32 + lane), gi[1] - 1)]
                                tsz[c] = T.Select(bt * BT + _copy_row(c, wy * 32 + lane) < gi[1],
                                                  T.uint32(16), T.uint32(0))
                            for a in T.unroll(NACC):
                                acc[a] = T.float32(0)
                            run(xs, wbuf, breg, af, bf, acc, CH, wy // WR, lane,
                                x, wg, wu, trow, tsz, gi, bg, wy % WR, wy, lane)
                            for r in T.unroll(RT):
                                for j in T.unroll(NT):
                                    for e in T.unroll(4):
                                        if _out_slot(bt, wy, j, e, lane, BT, WR, TW) < gi[1]:
                                            out[order[gi[0], _out_slot(bt, wy, j, e, lane, BT, WR, TW)],
                                                _out_channel(tile0(gi, bg) + wy % WR * RT + r, lane, e)] = \
                                                T.Cast("float16", (
                                                    acc[(r * NT + j) * 4 + e] * T.sigmoid(acc[(r * NT + j) * 4 + e])
                                                    * acc[((RT + r) * NT + j) * 4 + e]) if swiglu
                                                    else acc[(r * NT + j) * 4 + e])
                        # this tile's slots that skip the group (all of them past the count): zeros, 16 bytes a store
                        for i in range((T.max(T.min(nn(n), bt * BT + BT) - T.max(gi[1], bt * BT), 0) * BR * 2
                                        + THREADS - 1) // THREADS):
                            if i * THREADS + wy * 32 + lane < (T.min(nn(n), bt * BT + BT)
                                                               - T.max(gi[1], bt * BT)) * BR * 2:
                                for v in T.vectorized(8):
                                    out[order[gi[0], T.max(gi[1], bt * BT) + (i * THREADS + wy * 32 + lane) // (BR * 2)],
                                        tile0(gi, bg) * ROWS + (i * THREADS + wy * 32 + lane) % (BR * 2) * 8 + v] = \
                                        T.float16(0)

    return body


def tile_k_body(groups: int, group_size: int, n_dim: int, knobs: SmemTile = SmemTile()):
    """Macro (a, w, mask, used, out, n): out [n, N] = sum over the groups g a token runs of a[t, g's K slice] @
    W[:, g's K slice]^T, W in the "tc" layout [N / 16, 16 K] (K = G * gs)."""
    G, gs, N = groups, group_size, n_dim
    LPG = gs // CHUNK  # chunks per group slice
    RT, WR, WT = _warp_grid(N // ROWS, knobs)
    BT, S = knobs.tokens, knobs.stages
    TW = BT // WT
    NT = TW // 8
    BR = WR * RT
    NACC = RT * NT * 4
    CPT = copies_per_thread(BT)
    NWD = bit_words(BT)
    BITS = G + 1 + WARPS  # where the token bit sets start in the shared list buffer

    def nn(n):
        return T.Cast("int32", n)

    def kchunk(sused, step):
        """Tile-layout K chunk of step `step` (through the listed groups)."""
        return sused[step // LPG] * LPG + step % LPG

    @T.macro
    def issue(step, nsteps, xs, a, w, sused, bt, bx, wr, wy, lane, n):
        if step < nsteps:
            for c in T.unroll(CPT):
                T.ptx["cp.async.cg.shared.global"](
                    xs.ptr_to([_ring_at(step, _copy_row(c, wy * 32 + lane), wy * 32 + lane, S, BT)]),
                    a.ptr_to([T.min(bt * BT + _copy_row(c, wy * 32 + lane), nn(n) - 1),
                              kchunk(sused, step) * CHUNK + lane % 4 * 8]),
                    16, T.Select(token_runs(sused, BITS, G, step // LPG, _copy_row(c, wy * 32 + lane)) != 0,
                                 T.uint32(16), T.uint32(0)))
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def load_w(wbuf, step, slot, a, w, sused, bt, bx, wr, wy, lane, n):
        for r in T.unroll(RT):
            for h in T.unroll(2):
                for v in T.vectorized(8):
                    wbuf[((slot * RT + r) * 2 + h) * 8 + v] = \
                        w[bx * BR + wr * RT + r, ((kchunk(sused, step) * 2 + h) * 32 + lane) * 8 + v]

    run = k_loop(knobs, 1, RT, NT, TW, issue, load_w)

    @T.macro
    def body(a, w, mask, used, out, n):
        for bt in T.thread_binding((nn(n) + BT - 1) // BT, thread="blockIdx.x"):  # a row tile's token tiles together
            for bx in T.thread_binding(N // (ROWS * BR), thread="blockIdx.y"):
                xs = T.decl_buffer((S * BT * CHUNK,), "float16", scope="shared")
                sused = T.decl_buffer((BITS + NWD * (G + 1),), "int32", scope="shared")  # groups, scratch, bit sets
                for wy in T.thread_binding(WARPS, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        used_groups(mask, sused, n, wy, lane, G, WARPS, BT, BITS, bt * BT)
                        acc = T.decl_buffer((NACC,), "float32", scope="local")
                        wbuf = T.decl_buffer(((knobs.prefetch + 1) * RT * 16,), "float16", scope="local")
                        breg = T.decl_buffer((8,), "float16", scope="local")
                        af = T.decl_buffer((8,), "float16", scope="local")
                        bf = T.decl_buffer((4,), "float16", scope="local")
                        nst = T.decl_buffer((1,), "int32", scope="local")  # K steps (a register: loop bounds)
                        nst[0] = sused[G] * LPG
                        for i in T.unroll(NACC):
                            acc[i] = T.float32(0)
                        run(xs, wbuf, breg, af, bf, acc, nst[0], wy // WR, lane,
                            a, w, sused, bt, bx, wy % WR, wy, lane, n)
                        for r in T.unroll(RT):
                            for j in T.unroll(NT):
                                for e in T.unroll(4):
                                    if _out_slot(bt, wy, j, e, lane, BT, WR, TW) < nn(n):
                                        out[_out_slot(bt, wy, j, e, lane, BT, WR, TW),
                                            _out_channel(bx * BR + wy % WR * RT + r, lane, e)] = \
                                            T.Cast("float16", acc[(r * NT + j) * 4 + e])

    return body
