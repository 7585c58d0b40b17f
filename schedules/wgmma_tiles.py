"""gemm_mn's tile schedulers: which block runs which (group, token tile, column block), and when.

* the per-tile grid (in wgmma_mn.py): a block per existing tile; tiles past a group's active count do nothing;
* `persistent_mn_body` (knob `persistent`): that many blocks walk the existing tiles in `tile_numbering`'s order,
  one ring through all of a block's tiles;
* `tail_pass` (knob `tail`): past SORT_TOKENS, the tiles past the whole waves of P resident blocks are split in K
  over helper blocks when they would fill at most half a wave; `sum_tail` adds the shares in order.

Worked example of the split tail: P = 132 blocks and T = 266 tiles -> 2 whole waves and a rest of R = 2 tiles;
tail_shares(266, 132, most=8, steps=64) = min(8, 64, 132 // 2) = 8 shares a rest tile, each 8 of its 64 K steps
(tail_share_steps(s, 8, 64) = (8 s, 8)).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..knobs import KSTEP
from ..knobs import WgmmaMN
from .warp_ops import block_scan
from .wgmma_epilogue import UNIT_THREADS, acc_col, acc_row, silu_mul
from .wgmma_gemm import SM_SHARED_BYTES, WAVE_SMS
from .wgmma_ring import Ring, encode_descriptors, ring_bytes, ring_layout


TAIL_HEADER = 2  # ints before a split tail's per-tile entries: its tiles (0: none split), their shares


def tail_shares(tiles, blocks: int, most: int, steps: int):
    """Shares a tile of the rest is split into (ints or PrimExprs): past the tiles // blocks whole waves, a rest of
    0 < R <= blocks / 2 tiles splits each into min(most, steps, blocks // R) shares (at least a K step each, at most a
    wave of blocks for all); otherwise 1 (nothing split: the rest fills most of a wave, or there is none)."""
    rest = tiles - tiles // blocks * blocks
    if isinstance(tiles, int):
        return min(most, steps, blocks // rest) if 0 < rest and 2 * rest <= blocks else 1
    return T.Select(tirx.all(rest > 0, rest * 2 <= blocks), T.min(min(most, steps), blocks // T.max(rest, 1)), 1)


def tail_share_steps(share, shares, steps: int) -> tuple:
    """(first K step, K steps) of share `share` of `shares`: the tile's steps in near-equal runs, in order."""
    return steps * share // shares, steps * (share + 1) // shares - steps * share // shares


def tail_blocks(knobs: WgmmaMN, nb: int) -> int:
    """Blocks of the per-tile gemm_mn resident at once (a wave): the H200's SMs x blocks an SM by the ring."""
    return WAVE_SMS * max(1, SM_SHARED_BYTES // (ring_bytes(knobs, nb) + 2048))


def tail_pass(G: int, gs: int, K: int, knobs: WgmmaMN, NB: int, BN: int, ring: Ring, run, copy_rows,
               staged_store, chan0):
    """The per-tile gemm_mn past SORT_TOKENS (reading the reorder's order) with its last wave split in K (knob
    tail). With P blocks resident at once, the T existing tiles (numbered in launch order, _tile_numbering's) run
    as T // P whole waves and a rest of R = T % P tiles, which alone would hold the GPU for a whole tile's time with
    most SMs idle (on the H200, Q at 4096 tokens: 123 us at 264 tiles, 157 us at 266; docs/performance.md). When
    0 < R <= P / 2 each rest tile is split into S = tail_shares(...) shares of its K steps: its own block runs the
    first, blocks past the grid's tiles (helper rows of blockIdx.y) the others, each storing fp32 partials into
    ws [R x S, BT, NB] (slot r S + s); a second launch (sum_tail) sums them in share order (deterministic),
    applies SwiGLU and writes the rows. hdr (TAIL_HEADER ints, then per rest tile its group, token tile and block
    group) tells it what. A tile block finds T and its number with warp_tiles (no barrier before its K loop); a
    helper that has a share decodes its tile from a block scan (tile_prefix). Where nothing is split the pass
    costs 2-4 % against the unsplit one on the H200, not for its run-time K step count (a second K loop with a
    constant count for whole tiles left Q as it was and, with more registers, cost gate/up g32 20 %) nor for the
    tile count in front of it (counting before the tile check: the same); the split saves 18-29 % on Q at 513-768
    / 2048 tokens and 16 % past a 264-tile cliff at 4096 (docs/performance.md)."""
    BT, NST, TAIL = knobs.tokens, K // KSTEP, knobs.tail
    SKIP = bool(knobs.mma_skip)
    THREADS, CA = ring.threads, (BT * 8 + ring.copiers - 1) // ring.copiers
    BPG = gs // BN
    P = tail_blocks(knobs, NB)
    tile_prefix, decode = _tile_numbering(G, BT, BPG, THREADS)

    def nn(n):
        return T.Cast("int32", n)

    def tiles_x(n):
        """Token tiles of the grid (blockIdx.x): the most a group can have."""
        return (nn(n) + BT - 1) // BT

    @T.macro
    def warp_tiles(counts, wt, lane, g, n):
        """wt[0] = all tiles, wt[1] = the tiles of the groups before g: each warp on its own (lanes stride the
        groups, then shuffles), no shared memory and no barrier in front of the block's K loop (a block scan there,
        tile_prefix, cost gate/up at 4096 tokens ~4 % on the H200)."""
        wt[0] = 0
        wt[1] = 0
        for c in T.unroll((G + 31) // 32):
            wt[2] = T.Select(c * 32 + lane < G, _group_tiles(counts[T.min(c * 32 + lane, G - 1)], n, BT, BPG), 0)
            wt[0] = wt[0] + wt[2]
            wt[1] = wt[1] + T.Select(c * 32 + lane < g, wt[2], 0)
        for o in T.unroll(5):
            wt[0] = wt[0] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), wt[0], 1 << o, 32, 32)
            wt[1] = wt[1] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), wt[1], 1 << o, 32, 32)

    def helper_rows(n):
        """Rows of blockIdx.y past the tiles' (G x BPG), enough blocks for P shares."""
        return (P + tiles_x(n) - 1) // tiles_x(n)

    @T.macro
    def main_pass(x, wg, wu, counts, order, out, ws, hdr, n):
        for bt in T.thread_binding(tiles_x(n), thread="blockIdx.x"):
            for bg in T.thread_binding(G * BPG + helper_rows(n), thread="blockIdx.y"):
                xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
                pre = T.decl_buffer((G + 1,), "int32", scope="shared")
                scan = T.decl_buffer((THREADS,), "int32", scope="shared")
                for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                    # group, its active tokens, first K step (, whether this warpgroup has a row below the count)
                    gi = T.decl_buffer((3 + SKIP,), "int32", scope="local")
                    reg = T.decl_buffer((3,), "int32", scope="local")  # tile_prefix's scratch
                    wt = T.decl_buffer((3,), "int32", scope="local")  # warp_tiles': all tiles, those before g
                    loc = T.decl_buffer((4,), "int32", scope="local")  # decode's: group, token tile, block group
                    # shares a rest tile (1: none split), partial slot (-1: the whole tile, stored as fp16), token
                    # tile, block group, K steps to run (0: nothing), the first tile of the rest
                    sp = T.decl_buffer((6,), "int32", scope="local")
                    gi[0] = T.min(bg, G * BPG - 1) // BPG
                    gi[1] = T.Select(bg < G * BPG, T.min(counts[gi[0]], nn(n)), 0)
                    gi[2] = 0
                    sp[4] = 0
                    if bt * BT < gi[1] or bg >= G * BPG or bt + bg == 0:  # (block-uniform: tile_prefix's barriers)
                        warp_tiles(counts, wt, tid % 32, T.Select(bg < G * BPG, gi[0], 0), n)
                        sp[5] = wt[0] // P * P
                        sp[0] = tail_shares(wt[0], P, TAIL, NST)
                        if bt + bg == 0 and tid == 0:
                            hdr[0] = T.Select(sp[0] > 1, wt[0] - sp[5], 0)
                            hdr[1] = sp[0]
                        if bg < G * BPG:
                            if bt * BT < gi[1]:  # this block's tile, number pre[g] + column block x tiles + bt
                                sp[1] = wt[1] + bg % BPG * ((gi[1] + BT - 1) // BT) + bt - sp[5]  # in the rest
                                sp[2] = bt
                                sp[3] = bg
                                if sp[0] > 1 and sp[1] >= 0:  # a rest tile: its first share
                                    sp[1] = sp[1] * sp[0]
                                    sp[4] = tail_share_steps(0, sp[0], NST)[1]
                                    if tid == 0:
                                        hdr[TAIL_HEADER + sp[1] // sp[0] * 3] = gi[0]
                                        hdr[TAIL_HEADER + sp[1] // sp[0] * 3 + 1] = bt
                                        hdr[TAIL_HEADER + sp[1] // sp[0] * 3 + 2] = bg
                                else:
                                    sp[1] = -1
                                    sp[4] = NST
                        else:
                            loc[3] = (bg - G * BPG) * tiles_x(n) + bt  # helper h: share h % (S - 1) + 1 of rest
                            if sp[0] > 1 and loc[3] < (wt[0] - sp[5]) * (sp[0] - 1):  # tile h / (S - 1)
                                tile_prefix(counts, pre, scan, reg, tid, n)
                                sp[1] = loc[3] // (sp[0] - 1) * sp[0] + loc[3] % (sp[0] - 1) + 1
                                decode(sp[5] + sp[1] // sp[0], pre, counts, gi, loc, n)
                                sp[2] = loc[1]
                                sp[3] = loc[2]
                                gi[2] = tail_share_steps(sp[1] % sp[0], sp[0], NST)[0]
                                sp[4] = tail_share_steps(sp[1] % sp[0], sp[0], NST)[1]
                    if sp[4] > 0:
                        acc = T.decl_buffer((NB // 2,), "float32", scope="local")
                        base = T.decl_buffer((1,), "int32", scope="local")
                        desc = T.decl_buffer((2,), "uint64", scope="local")
                        trow = T.decl_buffer((CA,), "int32", scope="local")
                        tsz = T.decl_buffer((CA,), "uint32", scope="local")
                        if tid >= ring.copier0:
                            copy_rows(trow, tsz, order, gi, sp[2], tid - ring.copier0)
                        if SKIP:  # (wgmma_mn_body's warpgroup_rows)
                            gi[3] = T.Select(sp[2] * BT + tid // 128 * 64 < gi[1], 1, 0)
                        run(xs, base, desc, acc, sp[4], tid, x, wg, wu, trow, tsz, gi, sp[3], tid - ring.copier0)
                        if sp[1] < 0:
                            staged_store(xs, base, acc, tid, out, sp[2] * BT, chan0(gi, sp[3]), gi[1], order, gi,
                                         sp[2])
                        elif tid < ring.consumers:  # a share's fp32 partial, 8 bytes a store
                            for j in T.unroll(NB // 8):
                                for h in T.unroll(2):
                                    if sp[2] * BT + acc_row(tid, 2 * h) < gi[1]:
                                        for v in T.vectorized(2):
                                            ws[(sp[1] * BT + acc_row(tid, 2 * h)) * NB + acc_col(j, tid, 2 * h)
                                               + v] = acc[4 * j + 2 * h + v]

    return main_pass




def sum_tail(ws, hdr, counts, order, out, n, G: int, gs: int, BT: int, NB: int, BN: int, swiglu: bool, P: int):
    """Second launch of tail_pass: a block row per possible rest tile (P / 2), UNIT_THREADS threads of 4 output
    channels each over the tile; where hdr says the tile was split, its shares' partials summed in order (SwiGLU
    of gate and up), written to the tile's tokens' rows. Nothing where no tile was split."""
    V, NW, Q = 4, 2 if swiglu else 1, 4  # channels a unit, gate / up, units a thread
    UNITS = BT * BN // V

    def unit(by, q, tx):
        return (by * Q + q) * UNIT_THREADS + tx

    @T.macro
    def run(ws, hdr, counts, order, out, n):
        for r in T.thread_binding(P // 2, thread="blockIdx.x"):
            for by in T.thread_binding((UNITS + Q * UNIT_THREADS - 1) // (Q * UNIT_THREADS), thread="blockIdx.y"):
                for tx in T.thread_binding(UNIT_THREADS, thread="threadIdx.x"):
                    f = T.decl_buffer((6,), "int32", scope="local")  # split tiles, shares, group, tile, block, rows
                    tot = T.decl_buffer((NW * V,), "float32", scope="local")
                    f[0] = hdr[0]
                    if r < f[0]:
                        f[1] = hdr[1]
                        f[2] = hdr[TAIL_HEADER + r * 3]
                        f[3] = hdr[TAIL_HEADER + r * 3 + 1]
                        f[4] = hdr[TAIL_HEADER + r * 3 + 2]
                        f[5] = T.min(counts[f[2]], T.Cast("int32", n)) - f[3] * BT  # the tile's active rows
                        for q in T.unroll(Q):
                            if unit(by, q, tx) < UNITS and unit(by, q, tx) // (BN // V) < f[5]:
                                for h in T.unroll(NW):
                                    for v in T.vectorized(V):
                                        tot[h * V + v] = T.float32(0)
                                for s in range(f[1]):
                                    for h in T.unroll(NW):
                                        for v in T.vectorized(V):  # 16-byte loads
                                            tot[h * V + v] = tot[h * V + v] + ws[
                                                ((r * f[1] + s) * BT + unit(by, q, tx) // (BN // V)) * NB + h * BN
                                                + unit(by, q, tx) % (BN // V) * V + v]
                                for v in T.unroll(V):
                                    out[order[f[2], f[3] * BT + unit(by, q, tx) // (BN // V)],
                                        f[2] * gs + f[4] % (gs // BN) * BN + unit(by, q, tx) % (BN // V) * V + v] = \
                                        T.Cast("float16", silu_mul(tot[v], tot[V + v]) if swiglu else tot[v])

    return run(ws, hdr, counts, order, out, n)

def _group_tiles(count, n, BT: int, BPG: int):
    """gemm_mn's existing tiles of a group with `count` active tokens (of n): its token tiles x column blocks."""
    return (T.min(count, T.Cast("int32", n)) + BT - 1) // BT * BPG


def _tile_numbering(G: int, BT: int, BPG: int, THREADS: int):
    """(tile_prefix, decode): gemm_mn's existing tiles numbered group by group (per group, ceil(count / BT) token
    tiles x its BPG column blocks, token tile fastest), the order in which the per-tile grid launches them; the
    persistent grid walks them in it, and the per-tile grid's split tail finds its last wave's tiles by it."""
    LOG_T = (THREADS - 1).bit_length()  # scan steps over the block's threads
    LOG_G = G.bit_length()  # binary-search steps over G + 1 prefix entries

    def nn(n):
        return T.Cast("int32", n)

    @T.macro
    def tile_prefix(counts, pre, scan, reg, tid, n):
        """pre[g] = tiles of the groups before g (pre[G]: all), by block scans THREADS groups at a time."""
        scr = T.decl_buffer((2,), "int32", scope="local")  # block_scan's scratch (its [1])
        reg[1] = 0  # tiles of earlier chunks
        for c in range((G + THREADS - 1) // THREADS):
            reg[0] = _group_tiles(counts[T.min(c * THREADS + tid, G - 1)], n, BT, BPG)
            scan[tid] = T.Select(c * THREADS + tid < G, reg[0], 0)
            T.tvm_storage_sync("shared")
            block_scan(scan, scr, tid, LOG_T)
            reg[0] = scan[tid]
            if c * THREADS + tid < G:
                pre[c * THREADS + tid + 1] = reg[1] + reg[0]
            reg[0] = scan[THREADS - 1]
            reg[1] = reg[1] + reg[0]
            T.tvm_storage_sync("shared")
        if tid == 0:
            pre[0] = 0
        T.tvm_storage_sync("shared")

    @T.macro
    def decode(tile, pre, counts, gi, loc, n):
        """Tile number `tile` -> gi (group, its active tokens), loc[1] its token tile, loc[2] its block-group index
        (the per-tile grid's blockIdx.y); loc[0]: the group index found by a binary search of pre."""
        loc[0] = 0
        loc[3] = G
        for _ in T.unroll(LOG_G):  # the last i with pre[i] <= tile (then pre[i + 1] > tile)
            loc[1] = pre[(loc[0] + loc[3] + 1) // 2]  # shared loads in statements of their own, not in conditions
            if loc[1] <= tile:
                loc[0] = (loc[0] + loc[3] + 1) // 2
            else:
                loc[3] = (loc[0] + loc[3] + 1) // 2 - 1
        loc[1] = pre[loc[0]]
        gi[0] = loc[0]
        gi[1] = T.min(counts[gi[0]], nn(n))
        loc[3] = (gi[1] + BT - 1) // BT  # the group's token tiles
        loc[2] = loc[0] * BPG + (tile - loc[1]) // loc[3]
        loc[1] = (tile - loc[1]) % loc[3]

    return tile_prefix, decode


def persistent_mn_body(G: int, gs: int, K: int, knobs: WgmmaMN, NB: int, BN: int, stages, copy_rows, store):
    """wgmma_mn_body on a persistent grid of knobs.persistent blocks (producer warps required). The tiles that exist
    (per group, ceil(count / BT) token tiles x the group's column blocks) are numbered in the order the
    per-tile grid would run them; block b takes tiles b, b + P, ... and one ring runs through all of them, so the
    producers load the next tile's first steps while the warpgroups store this one, and no block is spent on a
    tile past a group's count. The slots that skip their group are then zeroed by the whole grid, a row a thread."""
    init, produce, consume = stages
    BT, P = knobs.tokens, knobs.persistent
    ring = ring_layout(knobs, NB)
    THREADS = ring.threads
    BPG = gs // BN
    NSTEPS = K // KSTEP
    CA = BT * 8 // ring.copiers
    tile_prefix, decode = _tile_numbering(G, BT, BPG, THREADS)

    def nn(n):
        return T.Cast("int32", n)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        for bx in T.thread_binding(P, thread="blockIdx.x"):
            xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
            pre = T.decl_buffer((G + 1,), "int32", scope="shared")
            scan = T.decl_buffer((THREADS,), "int32", scope="shared")
            for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                reg = T.decl_buffer((3,), "int32", scope="local")  # scan scratch, tiles so far, this block's tiles
                gi = T.decl_buffer((2,), "int32", scope="local")  # group, its active tokens
                loc = T.decl_buffer((4,), "int32", scope="local")  # group, token tile, block group, scratch
                base = T.decl_buffer((1,), "int32", scope="local")
                tile_prefix(counts, pre, scan, reg, tid, n)
                reg[2] = (pre[G] - bx + P - 1) // P  # loop bounds from registers, not shared memory
                init(xs, base, tid)
                if tid >= ring.copier0:
                    trow = T.decl_buffer((CA,), "int32", scope="local")
                    tsz = T.decl_buffer((CA,), "uint32", scope="local")
                    for k in range(reg[2]):  # this block's tiles
                        decode(bx + k * P, pre, counts, gi, loc, n)
                        copy_rows(trow, tsz, order, gi, loc[1], tid - ring.copier0)
                        produce(xs, base, NSTEPS, k * NSTEPS, x, wg, wu, trow, tsz, gi, loc[2], tid - ring.copier0)
                    T.ptx["cp.async.wait_group"](0)  # no copy outlives the kernel
                else:
                    acc = T.decl_buffer((NB // 2,), "float32", scope="local")
                    desc = T.decl_buffer((2,), "uint64", scope="local")
                    encode_descriptors(xs, base, desc, tid, ring.a_bytes)
                    for k in range(reg[2]):
                        decode(bx + k * P, pre, counts, gi, loc, n)
                        consume(xs, base, desc, acc, NSTEPS, k * NSTEPS, tid)
                        store(out, acc, order, gi, loc[1], loc[2], tid)
                # the sorted slots past each group's count: zeros, one (group, slot) row of gs channels a thread
                for r in range((G * nn(n) + P * THREADS - 1) // (P * THREADS)):
                    if (r * P + bx) * THREADS + tid < G * nn(n):
                        if ((r * P + bx) * THREADS + tid) % nn(n) >= T.min(
                                counts[((r * P + bx) * THREADS + tid) // nn(n)], nn(n)):
                            for u in range(gs // 8):
                                for v in T.vectorized(8):
                                    out[order[((r * P + bx) * THREADS + tid) // nn(n),
                                              ((r * P + bx) * THREADS + tid) % nn(n)],
                                        ((r * P + bx) * THREADS + tid) // nn(n) * gs + u * 8 + v] = T.float16(0)

    return body
