"""The gated kernels' knobs and the rules on them, as plain data (pure Python: importable without TVM, so the GPU
host's runtime-only checkout, the tuner and the benchmark share them with the kernels).

Three kernel families take knobs per token bucket (schedules/dispatch.py picks the bucket per call):

* the direct tensor-core kernels for few tokens (`GemvKnobs`, one per DECODE_BUCKETS bucket, up to `direct_bound`);
* the many-token kernels past them (`TileKnobs`, one per TILE_BUCKETS bucket and the rest): `kernel` "gemv" (the
  direct kernels' layout over sorted 64-token tiles), "smem" (the mma.sync tile GEMM, schedules/tile_gemm.py) or
  "wgmma" (the Hopper GEMMs, schedules/wgmma_*.py), checked by `check_tile_knobs` and, for a shape,
  `check_wgmma_shape`;
* the CPU register tiles (schedules/tiles.py: TileConfig).

Tuning logs hold them as lists (`tile_knob` / `decode_knobs` read them). Worked example:

    >>> tile_knob(["wgmma", 128, 4, 4, 1, 4]).name()      # 128 tokens, wgmma N 256, 4 stages, 4 producer warps
    'wg128n256s4p4'
    >>> down = tile_knobs([["wgmma", 128, 2, 6], ["wgmma", 128, 4, 4, 2], ["wgmma", 128, 4, 4]])
    >>> direct_bound("gemm_k", down, 128)             # direct kernels up to 16 tokens, then the wgmma GEMM
    16
"""

from __future__ import annotations

from dataclasses import dataclass

from .weight_layout import TC_ROWS


MAX_TOKENS = 64  # token counts up to this use the direct (decode) kernels


@dataclass(frozen=True)
class GemvKnobs:
    warps: int = 4  # warps per block, splitting K
    unroll: int = 4  # K chunks each warp loads before multiplying
    rows: int = 1  # 16-row tiles per warp (gemv_k): each activation fragment load feeds this many tiles
    stages: int = 0  # decode: 0 = weights loaded straight into registers; S >= 2 = an S-deep cp.async ring
    # decode: row tiles per block, each taken by warps / row_warps warps that split K; the row tiles' warps
    # load the same activation chunks at the same time, so all but the first are served from L1
    row_warps: int = 1
    # decode gemm_k: blocks splitting the used K chunks, each summing a share into an fp32 workspace that a
    # second launch adds up in a fixed order; a block then reads only its share of the activations
    ksplit: int = 1

    def name(self) -> str:
        return (f"w{self.warps}u{self.unroll}" + (f"r{self.rows}" if self.rows > 1 else "")
                + (f"s{self.stages}" if self.stages else "") + (f"b{self.row_warps}" if self.row_warps > 1 else "")
                + (f"k{self.ksplit}" if self.ksplit > 1 else ""))


DECODE_BUCKETS = (1, 8, 16, 32, MAX_TOKENS)  # one direct kernel per bucket, each with its own knobs
# Token counts up to which each kernel kind runs its direct kernels; past it, sorted token tiles. gemm_mn stops at
# 32: at 33-64 tokens its tiles, which gather only a group's active tokens, measured faster on the H200 (gate/up
# 117.8 vs 131.3 us, docs/performance.md); gemm_k's direct kernels win up to 64 (down 128.1 vs 173.5 us).
DIRECT_TOKENS = {"gemm_mn": 32, "gemm_k": MAX_TOKENS}
# ... except that gemm_k hands 33-64 tokens to its many-token kernel when that is the Hopper wgmma GEMM: down g128 at
# 33-64 tokens 52-54 us against 74-88 us direct, O 25-27 against 38-43 us (docs/performance.md); the mma.sync tile
# GEMM (groups of 32, pre-Hopper targets) loses to the direct kernels there (down g32: 277 against 111-127 us).
WGMMA_DIRECT_TOKENS = 32
# ... and both hand 17-32 tokens to a Hopper wgmma pick whose tiles cover a group's tokens narrowly: gemm_mn's
# swapped tiles (the token tile is wgmma's N) and gemm_k's for groups of a K step (64) or more. On the H200, 50 %
# random masks, 17-32 tokens: gate/up g128 71-75 -> 66-67 us, Q 21-22 -> 18-19 us, down 46-52 -> 43-45 us, O 21-24 ->
# 18-21 us; down g32 (two groups a K step) lost (41-44 -> 45-50 us), and at 9-16 tokens the direct kernels won for every
# kernel (docs/performance.md). No knob task is timed at 17-32 tokens, so records restamp across this bound
# (tools/restamp_records.py --set knobs.TILE_TAKEOVER=32 rebuilds today's kernels with the bound before it).
TILE_TAKEOVER = 16


def direct_bound(kind: str, tile_knobs: tuple, group_size: int) -> int:
    """Token counts up to which a tensor-core kernel of `kind` ("gemm_k" or a gemm_mn kind) runs its direct kernels,
    given its many-token knobs per tile bucket (schedules/tile_gemm.py: tile_knobs) and group size. Past it gemm_mn's
    many-token kernels read the mask reorder's sorted order unless they sort their tokens themselves
    (knobs.reorder_free_bound); no gemm_k kernel reads the reorder at any count (passes/lower_gated.py:
    _reorder_bound)."""
    first = tile_knobs[0]
    if kind == "gemm_k":
        if first.kernel != "wgmma":
            return DIRECT_TOKENS["gemm_k"]
        return min(WGMMA_DIRECT_TOKENS, TILE_TAKEOVER) if group_size >= 64 else WGMMA_DIRECT_TOKENS
    swapped = first.kernel == "wgmma" and first.swap
    return min(DIRECT_TOKENS["gemm_mn"], TILE_TAKEOVER) if swapped else DIRECT_TOKENS["gemm_mn"]


DecodeKnobs = tuple  # knobs per DECODE_BUCKETS entry
DEFAULT_DECODE: DecodeKnobs = (GemvKnobs(),) * len(DECODE_BUCKETS)


def decode_knobs(entries: list) -> DecodeKnobs:
    """Knobs per decode bucket from a tuning log's [[warps, unroll(, rows(, stages))], ...]. A log written
    before the 1-token bucket existed ([<= 8, <= 16]) gives its <= 8 knobs to 1 token as well; buckets a log
    predates (32, 64 tokens), and those given as None, keep the defaults."""
    knobs = tuple(GemvKnobs() if e is None else GemvKnobs(*e) for e in entries)
    for k in knobs:
        counts = (k.warps, k.unroll, k.rows, k.row_warps, k.ksplit)
        if not all(isinstance(v, int) and v >= 1 for v in counts) or k.stages not in (0, *range(2, 9)):
            raise ValueError(f"decode knobs {k}: counts must be integers >= 1, stages 0 or 2-8")
    if len(knobs) == 2:
        knobs = (knobs[0],) + knobs
    return knobs + DEFAULT_DECODE[len(knobs):]


def bucket_tokens(bucket: int) -> int:
    """Token columns (mma N, a multiple of 8) of the direct kernel for a bucket."""
    return max(8, bucket)


@dataclass(frozen=True)
class TileKnobs:
    tokens: int = 128  # tokens per block tile (a multiple of 64)
    rows: int = 1  # 16-channel row tiles per warp: each activation fragment read from shared memory feeds this many
    stages: int = 3  # cp.async ring depth of the activation tiles (>= 2)
    prefetch: int = 1  # weight chunks loaded into registers ahead of their mma (>= 1)
    # "smem": this module's shared-memory tile GEMM; "gemv": the direct kernels' layout over sorted 64-token tiles
    # (schedules/gemv.py: warps split K, no shared-memory staging), faster for a few hundred tokens or fewer;
    # "wgmma": the Hopper warpgroup GEMMs of schedules/wgmma_*.py (sm_90a; rows: the wgmma N in 64s; no prefetch)
    kernel: str = "smem"
    ksplit: int = 1  # wgmma gemm_k: blocks splitting the listed K steps, their fp32 partials summed in a fixed order
    # wgmma: warps of a producer that alone issues the ring's copies and hands stages over through mbarriers
    # (warp specialisation); 0: every thread copies, and one block-wide barrier per K step
    producer: int = 0
    # wgmma gemm_mn with producer warps: blocks of a persistent grid that walk the existing tiles (0: a block per
    # tile, including the tiles past a group's count, which only write zeros); wgmma gemm_k (every thread copying):
    # blocks of a persistent grid that run the whole waves of tiles, then share the rest's K steps out (stream-K)
    persistent: int = 0
    # wgmma gemm_mn: swap the operands (1): the weight rows are wgmma's M (64 a warpgroup, `rows` warpgroups) and
    # the block's `tokens` its N, any multiple of 8, so a group's few active tokens are not padded to 64
    swap: int = 0
    # wgmma gemm_mn: the weights' cp.async asks L2 to prefetch this many bytes around each 16-byte copy (0, or one of
    # L2_PREFETCH: PTX's .L2::64B/128B/256B), so a memory-bound tile's DRAM requests are fewer and larger
    l2: int = 0
    # wgmma gemm_mn on the per-tile grid, past SORT_TOKENS: when the tiles past the last whole wave of blocks fill
    # at most half a wave, each of them is split in K over up to this many blocks (extra blocks past the grid's
    # tiles), their fp32 partials summed by a second launch; 0: those tiles run whole, a wave of their own
    tail: int = 0
    # wgmma gemm_k on the per-tile grid, groups of up to 8: the tiles are of tokens ordered by mask pattern
    # (schedules/token_order.py, two launches in front), so a tile's tokens share the groups they skip (1); 0: in order
    order: int = 0
    # wgmma gemm_mn on the per-tile grid, unswapped: a warpgroup whose 64 rows are all past the group's active count
    # (a group's last tile) runs its K loop without wgmmas (1); the copies, barriers and wgmma groups stay as they
    # are. 0: every warpgroup multiplies every step. (gemm_k has no such knob: a K step's group is run by some rows
    # of a tile and not others, so its skip would sit inside the K loop, where ptxas serialises every wgmma.)
    mma_skip: int = 0

    def name(self) -> str:
        if self.kernel == "gemv":
            return "gemv64"
        if self.kernel == "wgmma":
            return (f"wg{self.tokens}n{64 * self.rows}s{self.stages}" + (f"k{self.ksplit}" if self.ksplit > 1 else "")
                    + (f"p{self.producer}" if self.producer else "") + (f"x{self.persistent}" if self.persistent else "")
                    + ("t" if self.swap else "") + (f"l{self.l2}" if self.l2 else "")
                    + (f"w{self.tail}" if self.tail else "") + ("o" if self.order else "")
                    + ("m" if self.mma_skip else ""))
        return f"t{self.tokens}r{self.rows}s{self.stages}p{self.prefetch}"


GEMV_TILES = TileKnobs(kernel="gemv")
# token tiles of the wgmma GEMMs: a warpgroup per 64 (3 would not split the weight copies evenly; 4 would need
# 4 x 128 threads x 128 accumulator registers, the whole register file)
WGMMA_TOKENS = (64, 128)
WGMMA_PRODUCERS = (0, 1, 2, 4)  # producer warps: they must split a 64-row tile's 16-byte copies evenly
SWAP_TOKENS = range(8, 257, 8)  # token tiles of the swapped wgmma gemm_mn: wgmma N
TAIL_SHARES = (2, 4, 8, 16)  # most blocks a last-wave gemm_mn tile's K is split over (knob tail)
L2_PREFETCH = (64, 128, 256)  # L2 prefetch sizes a cp.async may ask for (bytes)
# Token counts past the direct kernels are split into buckets (<= 128, <= 512, more), each with its kernel and knobs
TILE_BUCKETS = (128, 512)
DEFAULT_TILES = (GEMV_TILES, TileKnobs(), TileKnobs())


def tile_knob(entry) -> TileKnobs:
    """One bucket's knobs from a log or sweep entry: [tokens, rows, stages, prefetch], ["gemv"], or
    ["wgmma", tokens, rows, stages(, ksplit(, producer warps(, persistent blocks(, swap(, L2 prefetch bytes(, tail
    shares(, pattern order(, MMA skip))))))))]."""
    entry = list(entry)
    if entry == ["gemv"]:
        return GEMV_TILES
    if entry and entry[0] == "wgmma":
        if len(entry) not in range(4, 13):
            raise ValueError(f"wgmma tile knobs {entry}: expected ['wgmma', tokens, rows (N / 64), stages(, ksplit"
                             "(, producer warps(, persistent blocks(, swap(, L2 prefetch bytes(, tail shares(, pattern "
                             "order(, MMA skip))))))))]")
        knobs = TileKnobs(tokens=entry[1], rows=entry[2], stages=entry[3], kernel="wgmma",
                          ksplit=entry[4] if len(entry) > 4 else 1, producer=entry[5] if len(entry) > 5 else 0,
                          persistent=entry[6] if len(entry) > 6 else 0, swap=entry[7] if len(entry) > 7 else 0,
                          l2=entry[8] if len(entry) > 8 else 0, tail=entry[9] if len(entry) > 9 else 0,
                          order=entry[10] if len(entry) > 10 else 0, mma_skip=entry[11] if len(entry) > 11 else 0)
    else:
        knobs = TileKnobs(*entry)
    check_tile_knobs(knobs)
    return knobs


def tile_knobs(entry, wgmma: bool = True) -> tuple:
    """Knobs per TILE_BUCKETS bucket (and the last, unbounded one) from a tuning log's list of tile_knob entries
    (the defaults when absent, and for buckets given as None). Without `wgmma` (a target other than sm_90a) a
    wgmma pick becomes the mma.sync tile GEMM's default."""
    knobs = (tuple(DEFAULT_TILES[min(i, len(DEFAULT_TILES) - 1)] if e is None else tile_knob(e)
                   for i, e in enumerate(entry)) if entry else DEFAULT_TILES)
    return knobs if wgmma else tuple(TileKnobs() if k.kernel == "wgmma" else k for k in knobs)


def check_tile_knobs(knobs: TileKnobs) -> None:
    """ValueError unless `knobs` describe a tile GEMM this module (or the wgmma GEMMs, schedules/wgmma_gemm.py) can build."""
    if knobs.kernel == "wgmma" and knobs.l2 and knobs.l2 not in L2_PREFETCH:
        raise ValueError(f"wgmma tile knobs {knobs}: an L2 prefetch is one of {L2_PREFETCH} bytes (or 0, none)")
    if knobs.kernel == "wgmma" and knobs.tail and (knobs.tail not in TAIL_SHARES or knobs.swap or knobs.ksplit != 1
                                                   or knobs.persistent):
        raise ValueError(f"wgmma tile knobs {knobs}: a split tail wave ({knobs.tail} shares a tile) is one of "
                         f"{TAIL_SHARES} shares, on the per-tile grid of an unswapped gemm_mn that does not split K")
    if knobs.kernel == "wgmma" and knobs.order and (knobs.order != 1 or knobs.swap or knobs.producer
                                                    or knobs.persistent or knobs.tail):
        raise ValueError(f"wgmma tile knobs {knobs}: tokens ordered by mask pattern (order 1) only on the per-tile "
                         "grid of a gemm_k without producer warps")
    if knobs.kernel == "wgmma" and knobs.mma_skip and (knobs.mma_skip != 1 or knobs.swap or knobs.persistent):
        raise ValueError(f"wgmma tile knobs {knobs}: a warpgroup skips its wgmmas (MMA skip 1) only on the per-tile "
                         "grid of an unswapped GEMM (a swapped tile's warpgroups are weight rows)")
    if knobs.kernel == "wgmma" and knobs.swap:
        # (4 warpgroups: TVM's shared-memory sync planner refuses the kernel, "cannot insert syncs inside condition")
        if (knobs.tokens not in SWAP_TOKENS or knobs.stages < 3 or not 1 <= knobs.rows <= 2 or knobs.ksplit < 1
                or knobs.producer or knobs.persistent or knobs.swap != 1):
            raise ValueError(f"swapped wgmma tile knobs {knobs}: tokens a multiple of 8 up to 256 (wgmma N), rows "
                             "1..2 (warpgroups of 64 weight rows), stages >= 3, ksplit >= 1, no producer warps, no "
                             "persistent grid")
        return
    if knobs.kernel == "wgmma":
        if (knobs.tokens not in WGMMA_TOKENS or knobs.stages < 3 or not 1 <= knobs.rows <= 4 or knobs.ksplit < 1
                or knobs.producer not in WGMMA_PRODUCERS or knobs.persistent < 0
                or (knobs.persistent == 1)):
            raise ValueError(f"wgmma tile knobs {knobs}: tokens must be one of {WGMMA_TOKENS} (a warpgroup per "
                             "64 tokens), rows 1..4 (wgmma N = 64 rows), stages >= 3, ksplit >= 1, producer "
                             f"warps one of {WGMMA_PRODUCERS}, and a persistent grid of 0 or at least 2 blocks")
        return
    if (knobs.ksplit != 1 or knobs.producer or knobs.persistent or knobs.swap or knobs.l2 or knobs.tail or knobs.order
            or knobs.mma_skip):
        raise ValueError(f"tile knobs {knobs}: only the wgmma GEMMs split K over blocks, have producer warps, "
                         "a persistent grid, swapped operands, an L2 prefetch size, a split tail wave, a pattern "
                         "order or warpgroups that skip their wgmmas")
    if knobs.kernel != "smem" or knobs.tokens % 64 or knobs.rows < 1 or knobs.stages < 2 or knobs.prefetch < 1:
        raise ValueError(f"tile knobs {knobs}: tokens must be a multiple of 64, rows >= 1, stages >= 2, "
                         "prefetch >= 1, kernel 'smem' (or 'gemv', which has no tile GEMM)")


KSTEP = 64  # K per ring stage: one 128-byte swizzle span of fp16
# 2 warpgroups x N 256 (rows x 64), a 4-deep ring: 192 KB of shared memory, one block per SM
WGMMA_TILES = TileKnobs(tokens=128, rows=4, stages=4, kernel="wgmma")
# Up to this many tokens a per-tile gemm_mn block sorts its group's tokens itself (a ballot over the group's mask
# column), so no mask reorder launches in front of it; past it each block would read n mask entries
SORT_TOKENS = TILE_BUCKETS[-1]


def sorts_tokens(knobs: TileKnobs) -> bool:
    """Whether a gemm_mn body with these knobs sorts its group's tokens itself up to SORT_TOKENS tokens: the
    per-tile wgmma grid (a persistent grid needs every group's count before it starts, from the reorder)."""
    return knobs.kernel == "wgmma" and not knobs.persistent


def reorder_free_bound(tile_knobs: tuple) -> int:
    """Token counts up to which gemm_mn's many-token kernels (tile_knobs: one per TILE_BUCKETS bucket, then the
    rest) read no mask reorder: the top of the last of the leading buckets within SORT_TOKENS whose kernel sorts
    its tokens itself; 0 when the first bucket's kernel reads the reorder."""
    bound = 0
    for top, knobs in zip(TILE_BUCKETS, tile_knobs):
        if top > SORT_TOKENS or not sorts_tokens(knobs):
            break
        bound = top
    return bound


def wgmma_n(group_size: int, swiglu: bool, knobs: TileKnobs) -> tuple[int, int]:
    """(wgmma N, output channels per block) of gemm_mn: min(group, N / 2) channels of gate and up each (or
    min(group, N) of one projection), N = 64 x rows."""
    nw = 2 if swiglu else 1
    bn = min(group_size, 64 * knobs.rows // nw)
    return nw * bn, bn


def check_wgmma_shape(group_size: int, k_dim: int, knobs: TileKnobs, swiglu: bool | None = None,
                      groups: int | None = None) -> None:
    """ValueError unless a wgmma tile GEMM can take this shape and these knobs; swiglu None: gemm_k (K = the
    groups, `k_dim` its N; with `groups`, also whether its tokens can be ordered by mask pattern, knob order)."""
    if knobs.kernel != "wgmma":
        raise ValueError(f"tile knobs {knobs} are not the wgmma GEMM's")
    check_tile_knobs(knobs)
    if swiglu is None:
        if knobs.swap:
            raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_mn swaps its operands")
        if knobs.l2:
            raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_mn's weight copies take an L2 prefetch size")
        if knobs.tail:
            raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_mn splits its tail wave (gemm_k: the "
                             "persistent grid's stream-K)")
        if knobs.mma_skip:
            # (a step's group is run by some rows of a gemm_k tile and not others: skipping a warpgroup's wgmmas per
            # step needs a branch inside the K loop, which makes ptxas serialise every wgmma, C7520)
            raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_mn skips a warpgroup's wgmmas")
        if knobs.persistent and (knobs.producer or knobs.ksplit > 1):
            raise ValueError(f"tile knobs {knobs}: the wgmma gemm_k's persistent grid (stream-K) has every thread "
                             "copy and splits K by itself")
        if (group_size % KSTEP and group_size != KSTEP // 2) or k_dim % (64 * knobs.rows):
            raise ValueError(f"the wgmma gemm_k needs a group size that is {KSTEP // 2} or a multiple of {KSTEP} and "
                             f"N a multiple of {64 * knobs.rows}; got group size {group_size}, N={k_dim}")
        # tokens ordered by mask pattern need the list entries a step ahead (every thread copying; 64-token tiles of
        # groups of 32 have no lookahead) and 2^G patterns in shared memory
        ahead = not knobs.producer and (group_size % KSTEP == 0 or knobs.tokens == 128)
        if knobs.order and not (ahead and (groups is None or order_groups_ok(groups))):
            raise ValueError(f"tile knobs {knobs}: the wgmma gemm_k orders tokens by mask pattern for at most "
                             f"{MAX_GROUPS} groups, with lookahead; got {groups} groups of {group_size}")
        return
    if knobs.order:
        raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_k orders its tokens by mask pattern")
    if knobs.ksplit > 1 and knobs.persistent:
        raise ValueError(f"tile knobs {knobs}: a persistent grid does not split K over blocks")
    if knobs.persistent and not knobs.producer:
        raise ValueError(f"tile knobs {knobs}: the wgmma gemm_mn's persistent grid needs producer warps")
    nb, bn = wgmma_n(group_size, swiglu, knobs)
    if k_dim % KSTEP or bn % TC_ROWS or group_size % bn or nb % 64:
        raise ValueError(f"the wgmma gemm_mn needs K a multiple of {KSTEP} and a group size that {64 * knobs.rows}"
                         f"-channel tiles divide; got K={k_dim}, group size {group_size}")


MAX_GROUPS = 8  # patterns of at most this many groups: a thread per pattern (2^G <= THREADS), per-warp counts in shared


def order_groups_ok(groups: int) -> bool:
    """Whether tokens of `groups` groups can be ordered by pattern (2^G buckets)."""
    return 1 <= groups <= MAX_GROUPS


# The CUDA gemm_k kernels (every layout, every token count) read the mask themselves: a block lists the groups its
# tokens run. So a reorder that only gemm_k consumes (a gated projection) never runs: its bound is every count an
# int32 token index reaches.
UNREAD = 2**31 - 1
