"""gemm_k's schedulers: K split over blocks, and the persistent stream-K grid.

* `gemm_k_splits`: a per-tile gemm_k's K split over blocks, raised at run time while the blocks still fit one wave
  (up to MAX_KSPLIT, at least MIN_SPLIT_STEPS steps a split);
* `stream_k_body` (knob `persistent`): P blocks run the whole waves of tiles, then share the last, partial wave's K
  steps out in quarter tiles (stream-K); a partial wave of more than half the blocks is split into aligned parts
  (`stream_k_parts`) instead. Partials go to a workspace of STREAM_K_SLOTS slots a block, summed in a fixed order.

Worked example: 64 K steps, P = 132 blocks, 140 tiles -> one whole wave (132 tiles) and a rest of 8 tiles = 512 K
steps; stream_k_share(8, 132, 64) gives each block a share of whole quarter tiles (16 steps), so 32 blocks take one
quarter each instead of 8 blocks taking a whole tile while 124 idle.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..knobs import KSTEP
from ..knobs import WgmmaK
from .gemv import bit_words, used_groups
from .wgmma_epilogue import acc_col, acc_row
from .wgmma_gemm import MAX_KSPLIT, MIN_SPLIT_STEPS, SM_SHARED_BYTES, WAVE_SMS
from .wgmma_ring import Ring, ring_bytes, weight_tensor_map


def gemm_k_splits(tiles, col_blocks: int, k_steps: int, knobs: WgmmaK):
    """Blocks splitting gemm_k's K for `tiles` token tiles (an int, or the kernel's int32 PrimExpr) of a GEMM of
    `k_steps` K steps: the knob's split, raised while tiles x col_blocks x splits blocks still run in one wave, so
    that a bucket's smaller counts (129-256 tokens of the <= 512 bucket: 2 token tiles) still fill the GPU; raised
    up to MAX_KSPLIT, and only as far as every split keeps MIN_SPLIT_STEPS steps (O's 64 steps: 4 splits; more made
    its 33-64 tokens slower on the H200). The knob is the split at the bucket's larger counts."""
    top = max(knobs.ksplit, min(MAX_KSPLIT, k_steps // MIN_SPLIT_STEPS))
    per_sm = max(1, SM_SHARED_BYTES // (ring_bytes(knobs, 64 * knobs.rows) + 2048))
    fill = WAVE_SMS * per_sm // (tiles * col_blocks)
    if isinstance(fill, int):
        return max(knobs.ksplit, min(top, fill))
    return T.max(knobs.ksplit, T.min(top, fill))


SUM_THREADS = 256  # threads of a block of the stream-K sum, 4 output columns each
STREAM_K_OFFSETS = 4  # a stream-K share is a whole number of quarter tiles: its blocks start at 4 K offsets at most


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else T.max(a, b)


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else T.min(a, b)


def stream_k_share(rest, blocks: int, k_steps: int):
    """K steps of each block's share of the `rest` K steps past the whole waves (ints or PrimExprs): rest / blocks
    rounded up to a whole 1 / STREAM_K_OFFSETS of a tile's k_steps while that is at most half a tile, else a whole
    tile. Quarters keep the blocks of tiles that read the same weights at a few K offsets (L2 then serves each weight
    tile to all of them; H200: shares at any step put down g128 at 4096 tokens 41 % behind the per-tile grid); a tail
    of more than half a wave gains little and runs whole."""
    q = k_steps // STREAM_K_OFFSETS if k_steps % STREAM_K_OFFSETS == 0 else k_steps
    share = ((_max(rest, 1) + blocks - 1) // blocks + q - 1) // q * q
    return T.Select(share * 2 <= k_steps, share, T.int64(k_steps)) if not isinstance(share, int) else (
        share if share * 2 <= k_steps else k_steps)


def stream_k_start(rest, b, share):
    """First K step (of the rest) of block b's share: rest where the shares ran out (an empty one)."""
    return _min(b * share, rest)


def stream_k_owner(x, share):
    """The block whose share holds K step x of the rest."""
    return x // share


STREAM_K_SLOTS = 2  # partial slots a block of the persistent grid has (ws [P x STREAM_K_SLOTS, tokens, NB])
STREAM_K_PARTS = 3  # most aligned parts a tile of a rest of more than half a wave is split into
# fewest K steps of an aligned part: on the H200 (A/B, 2026-12-03) parts of 56 steps (down at 641-768 tokens, 4 parts)
# gained nothing for down g128 and lost 7 % for down g32, and O's parts of 16-21 steps lost 10-38 %, where parts of 74
# steps (down g128 / g32 at 513-640 tokens, 3 parts) gained 15 / 10 %
STREAM_K_PART_STEPS = 64


def stream_k_parts(rest_tiles, blocks: int, k_steps: int):
    """Aligned parts each tile of a rest of more than half a wave is split into (an int, or for the kernel's PrimExpr
    a Select over the runs of R that split; 1: run whole): the s <= STREAM_K_PARTS with parts of at least
    STREAM_K_PART_STEPS K steps and s x rest at most STREAM_K_SLOTS slots a block whose segments (a tile's steps in s
    equal runs) take the fewest waves of a segment's time, ceil(s R / P) / s; ties to the smaller s. Down at 513-640
    tokens (R = 80 tiles of 224 steps): 3 parts in 2 waves of a third of a tile. A rest of at most half a wave is
    shared out in quarter tiles instead (stream_k_share), and 1 there."""
    if not isinstance(rest_tiles, int):
        expr = T.int32(1)
        for r in range(blocks):  # the runs of R with the same parts, as a chain of range tests
            parts = stream_k_parts(r, blocks, k_steps)
            if parts > 1 and (r == 0 or stream_k_parts(r - 1, blocks, k_steps) != parts):
                end = r
                while end + 1 < blocks and stream_k_parts(end + 1, blocks, k_steps) == parts:
                    end += 1
                expr = T.Select(tirx.all(r <= rest_tiles, rest_tiles <= end), T.int32(parts), expr)
        return expr
    best, value = 1, 1
    for parts in range(2, min(STREAM_K_PARTS, k_steps // STREAM_K_PART_STEPS) + 1):
        waves = (parts * rest_tiles + blocks - 1) // blocks
        fits = 2 * rest_tiles > blocks and parts * rest_tiles <= STREAM_K_SLOTS * blocks
        if fits and waves * best < value * parts:
            best, value = parts, waves
    return best


def stream_k_segment(j, rest_tiles, parts, k_steps: int) -> tuple:
    """(rest tile, first K step, end K step) of aligned segment j: part j // R of tile j % R (token tile fastest,
    so the tiles of a column block run a part's K steps together and L2 serves its weights to all of them)."""
    p = j // rest_tiles
    return j % rest_tiles, k_steps * p // parts, k_steps * (p + 1) // parts


def stream_k_body(knobs: WgmmaK, G: int, gs: int, N: int, KS: int, ring: Ring, run, staged_store, steps, tma: bool,
                   ahead: bool, PRE: int, BITS: int, tmap):
    """The wgmma gemm_k on a persistent grid of P = `knobs.persistent` blocks (data-parallel waves, then stream-K):
    of the W tiles (token tiles x column blocks, token tile fastest, KS K steps each with every group listed), block b
    runs the whole tiles b, b + P, ... of the W // P full waves, one after another (the tiles in flight together are
    neighbours, as on the per-tile grid), then its share of the rest's K steps (stream_k_share), tile by tile; a tile
    listing fewer groups maps a share onto its listed steps in proportion, as a split does. A tile the block ran all of
    leaves through the ring, else its fp32 partial goes to ws [P, 2, tokens, NB] (slot 0: the block's first tile of the
    rest, begun by a block before it; slot 1: its last, finished by blocks after it), and a second launch sums each
    shared tile's partials in block order (deterministic). A tail of at most half a wave then runs on every SM: down at
    1152 tokens (144 tiles: a wave and 12) takes 1 + 1 / 4 tiles' time instead of 2 (H200: 229 against 328 us).
    A rest of R > P / 2 tiles that quarter shares would leave whole (shares at any K offset make the token tiles of a
    column block read its weights at different offsets, and DRAM serves them: +8 % at 513 tokens, the first session
    of 2026-12-03) is instead split into s = stream_k_parts(R, P, KS) aligned parts a tile: segment j = part j // R of
    tile j % R runs on block j % P after its whole waves, into ws slot j, and the sum adds a tile's parts in order.
    Token tile fastest, the segments in flight together are the same part of neighbouring tiles, which read the same
    weights (down at 513 tokens: 80 tiles, 3 parts in 2 waves of a third of a tile)."""
    P, BT, NB, S = knobs.persistent, knobs.tokens, 64 * knobs.rows, knobs.stages
    THREADS, WARPS = ring.threads, ring.threads // 32
    CB = N // NB  # column blocks
    UNITS = BT * NB // 4  # 4-column units of a tile in the sum
    if UNITS % SUM_THREADS:
        raise ValueError(f"tile knobs {knobs}: a {BT} x {NB} tile is not a whole number of stream-K sum blocks")

    def nn(n):
        return T.Cast("int32", n)

    def tiles(n):
        return (nn(n) + BT - 1) // BT

    def waves(n):
        """Whole tiles every block runs first."""
        return tiles(n) * CB // P

    def rest(n):
        """K steps of the tiles past the whole waves (int64)."""
        return T.Cast("int64", tiles(n) * CB - waves(n) * P) * KS

    def share(n):
        return stream_k_share(rest(n), P, KS)

    def rest_tiles(n):
        return tiles(n) * CB - waves(n) * P

    def parts(n):
        """Aligned parts of each rest tile (1: whole tiles, or quarter shares for a rest of at most half a wave)."""
        return stream_k_parts(rest_tiles(n), P, KS)

    # whether this GEMM's tiles can be split in aligned parts at all; if not, the kernel is the one before they existed
    # (the same TIR: records timed on it stay valid, tools/restamp_records.py)
    ALIGNED = min(STREAM_K_PARTS, KS // STREAM_K_PART_STEPS) >= 2

    def or_aligned(pts, aligned_value, value):
        """`value`, or `aligned_value` where pts (a register holding the aligned parts) says the rest is split."""
        return T.Select(pts > 1, aligned_value, value) if ALIGNED else value

    def held(buf, i):
        """buf[i] where it holds the aligned parts (ALIGNED), else nothing (the kernel has no such register)."""
        return buf[i] if ALIGNED else None

    def last_part(f):
        """The last aligned part of a shared tile (the sum's f[3] holds the parts; 0: no such register)."""
        return f[3] - 1 if ALIGNED else 0

    def segment(b, k, pt, i, n):
        """Field i (rest tile, first step, end step) of block b's segment k past the waves when split in aligned
        parts: segment b + (k - waves) P (stream_k_segment)."""
        return stream_k_segment(b + (k - waves(n)) * P, T.max(rest_tiles(n), 1), pt[0], KS)[i] if ALIGNED else 0

    def segments(b, pts, rng, n):
        """Segments block b runs: its whole waves' tiles, then those of its share (rng[0] .. rng[1]) or, split in
        aligned parts, segments b, b + P, ... of the parts x tiles."""
        if not ALIGNED:
            return waves(n) + (rng[1] + KS - 1) // KS - rng[0] // KS
        return waves(n) + T.Select(pts > 1, T.max(pts * rest_tiles(n) - b + P - 1, 0) // P,
                                   (rng[1] + KS - 1) // KS - rng[0] // KS)

    def start(b, n):
        return T.Cast("int32", stream_k_start(rest(n), T.Cast("int64", b), share(n)))

    def owner(x, n):
        return T.Cast("int32", stream_k_owner(T.Cast("int64", x), share(n)))

    def slot(b, r, n):
        """ws slot of block b's partial of the rest's tile r: 0 when b began inside it (its first tile), else 1."""
        return T.Select(start(b, n) > r * KS, 0, 1)

    def partial_slot(b, k, lo, pt, n):
        """ws slot (of P x STREAM_K_SLOTS) of block b's partial of its segment k: the aligned segment's number, or
        2 b + (0: the share began inside the tile, 1: it ends inside it)."""
        return or_aligned(held(pt, 0), b + (k - waves(n)) * P, b * 2 + T.Select(lo > 0, 0, 1))

    @T.macro
    def main_pass(a, w, mask, out, ws, n):
        for b in T.thread_binding(P, thread="blockIdx.x"):
            xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
            sused = T.decl_buffer((BITS + bit_words(BT) * (G + 1),), "int32", scope="shared")
            if tma:
                tbar = T.decl_buffer((S,), "uint64", scope="shared")
            else:
                tbar = sused  # (not read)
            for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                acc = T.decl_buffer((NB // 2,), "float32", scope="local")
                base = T.decl_buffer((1,), "int32", scope="local")
                desc = T.decl_buffer((2,), "uint64", scope="local")
                nst = T.decl_buffer((1,), "int32", scope="local")
                first = T.decl_buffer((1,), "int32", scope="local")
                if ALIGNED:
                    pt = T.decl_buffer((1,), "int32", scope="local")  # the rest tiles' aligned parts
                else:
                    pt = ()  # (no register: a tuple binds no TIR)
                # the share's first / end step of the rest, then the segment's tile, its steps [lo, hi), and the
                # tile's token tile and column block (registers: no division by the token tiles in a step's copies)
                rng = T.decl_buffer((7,), "int32", scope="local")
                pre = T.decl_buffer((PRE,), "int32", scope="local")  # lookahead's list entries
                rng[0] = start(b, n)
                rng[1] = start(b + 1, n)
                if ALIGNED:
                    pt[0] = parts(n)  # (split: the block runs segments b, b + P, ... of the rest's parts x tiles)
                for k in range(segments(b, held(pt, 0), rng, n)):
                    # (segment k past the waves: tile r = rng[0] // KS + k - waves of the rest; aligned parts:
                    # segment b + (k - waves) P)
                    rng[2] = T.Select(k < waves(n), b + k * P, or_aligned(
                        held(pt, 0), waves(n) * P + segment(b, k, pt, 0, n),
                        waves(n) * P + rng[0] // KS + k - waves(n)))
                    rng[3] = T.Select(k < waves(n), 0, or_aligned(held(pt, 0), segment(b, k, pt, 1, n), T.max(
                        rng[0] - (rng[0] // KS + k - waves(n)) * KS, 0)))
                    rng[4] = T.Select(k < waves(n), KS, or_aligned(held(pt, 0), segment(b, k, pt, 2, n), T.min(
                        rng[1] - (rng[0] // KS + k - waves(n)) * KS, KS)))
                    rng[5] = rng[2] % tiles(n)
                    rng[6] = rng[2] // tiles(n)
                    T.tvm_storage_sync("shared")  # the tile before's store and list reads are done
                    if tma:
                        if tid == 0:
                            for i in T.unroll(S):  # a fresh phase count for this tile's K loop
                                T.ptx["mbarrier.inval.shared::cta.b64"](tbar.ptr_to([i]))
                                T.ptx["mbarrier.init.shared::cta.b64"](tbar.ptr_to([i]), 1)
                            T.ptx["fence.mbarrier_init.release.cluster"]()
                    used_groups(mask, sused, n, tid // 32, tid % 32, G, WARPS, BT, BITS, rng[5] * BT)
                    first[0] = steps(sused) * rng[3] // KS
                    nst[0] = steps(sused) * rng[4] // KS - first[0]
                    run(xs, base, desc, acc, nst[0], tid, a, w, tbar, sused, pre if ahead else sused, first,
                        rng[5], rng[6], tid - ring.copier0, n)
                    if rng[3] == 0 and rng[4] == KS:
                        staged_store(xs, base, acc, tid, out, rng[5] * BT, rng[6] * NB, nn(n))
                    else:
                        if tid < ring.consumers:
                            for j in T.unroll(NB // 8):
                                for h in T.unroll(2):  # 8 bytes a thread
                                    if rng[5] * BT + acc_row(tid, 2 * h) < nn(n):
                                        for v in T.vectorized(2):
                                            ws[(partial_slot(b, k, rng[3], pt, n) * BT + acc_row(tid, 2 * h))
                                               * NB + acc_col(j, tid, 2 * h) + v] = acc[4 * j + 2 * h + v]

    def shared_tiles(n):
        """Tiles of the rest that several shares split (all of them when a share is under a tile or the tiles are
        split in aligned parts, else none)."""
        return T.Select(tirx.any(share(n) < KS, parts(n) > 1) if ALIGNED else share(n) < KS, rest_tiles(n), 0)

    @T.macro
    def sum_pass(ws, out, n):
        """A block per shared tile of the rest (and 4 columns a thread of it): its partials summed block by block in
        order into out (one block, doing nothing, where no tile is shared)."""
        for r in T.thread_binding(T.max(shared_tiles(n), 1), thread="blockIdx.x"):
            for by in T.thread_binding(UNITS // SUM_THREADS, thread="blockIdx.y"):
                for tx in T.thread_binding(SUM_THREADS, thread="threadIdx.x"):
                    # first / last block (aligned: part), the tile of all, (ALIGNED) the aligned parts
                    f = T.decl_buffer((4 if ALIGNED else 3,), "int32", scope="local")
                    tot = T.decl_buffer((4,), "float32", scope="local")
                    if r < shared_tiles(n):
                        if ALIGNED:
                            f[3] = parts(n)
                        f[0] = or_aligned(held(f, 3), 0, owner(r * KS, n))
                        f[1] = or_aligned(held(f, 3), last_part(f), owner(r * KS + KS - 1, n))
                        f[2] = waves(n) * P + r
                        for v in T.unroll(4):
                            tot[v] = T.float32(0)
                        for sb in range(f[0], f[1] + 1):
                            for v in T.unroll(4):
                                tot[v] = tot[v] + ws[(or_aligned(held(f, 3), sb * rest_tiles(n) + r,
                                                                 sb * 2 + slot(sb, r, n)) * BT
                                                      + (by * SUM_THREADS + tx) // (NB // 4)) * NB
                                                     + (by * SUM_THREADS + tx) % (NB // 4) * 4 + v]
                        if f[2] % tiles(n) * BT + (by * SUM_THREADS + tx) // (NB // 4) < nn(n):
                            for v in T.unroll(4):
                                out[f[2] % tiles(n) * BT + (by * SUM_THREADS + tx) // (NB // 4),
                                    f[2] // tiles(n) * NB + (by * SUM_THREADS + tx) % (NB // 4) * 4 + v] = T.Cast(
                                    "float16", tot[v])

    @T.macro
    def body(a, w, mask, used, out, n):
        if tma:
            weight_tensor_map(tmap, w, G * gs, N, NB, 2 if gs % KSTEP == 0 else 1)
        # (a constant size; host code allocates it at function entry, whichever bucket runs)
        ws = T.alloc_buffer((P * STREAM_K_SLOTS * BT * NB,), "float32", scope="global")
        main_pass(a, w, mask, out, ws, n)
        sum_pass(ws, out, n)

    return body
