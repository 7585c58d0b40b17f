"""The gated kernels' knobs and the rules on them, as plain data (pure Python: importable without TVM, so the GPU
host's runtime-only checkout, the tuner and the benchmark share them with the kernels).

One small frozen dataclass per kernel family, each with `validate(kernel)` (a KernelSpec, or None for the rules that
hold for every shape), a stable `name()` and `to_json()` (field names):

* `GemvKnobs`: the direct tensor-core kernels for few tokens, one per DECODE_BUCKETS bucket, up to `direct_bound`;
* many-token kernels past them, one per TILE_BUCKETS bucket and the rest (`TileKnobs`, any of): `GemvTile` (the
  direct kernels' layout over sorted 64-token tiles), `SmemTile` (the mma.sync tile GEMM, schedules/tile_gemm.py),
  `WgmmaMN` / `WgmmaK` (the Hopper GEMMs, schedules/wgmma_mn.py / wgmma_k.py);
* `TileConfig`: the CPU register tiles (and the plain CUDA kernels' tiles), one per CPU bucket.

Tuning logs hold them by field name; `tile_knob` / `decode_knobs` also read the positional lists of older logs.
Worked example:

    >>> tile_knob(["wgmma", 128, 4, 4, 1, 4], "gemm_mn_swiglu")   # 128 tokens, N 256, 4 stages, 4 producer warps
    WgmmaMN(tokens=128, rows=4, stages=4, ksplit=1, producer=4, persistent=0, swap=0, l2=0, tail=0, mma_skip=0)
    >>> _.name()
    'wg128n256s4p4'
    >>> down = tile_knobs([["wgmma", 128, 2, 6], ["wgmma", 128, 4, 4, 2], ["wgmma", 128, 4, 4]], True, "gemm_k")
    >>> direct_bound("gemm_k", down, 128)             # direct kernels up to 16 tokens, then the wgmma GEMM
    16
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import ClassVar, Union

from .weight_layout import TC_ROWS


@dataclass(frozen=True)
class TileConfig:
    """A CPU kernel's register tile (schedules/cpu_gemm.py), one per CPU token bucket; also the plain CUDA kernels'
    tile (schedules/tiles.py: tile_config). bm: sorted tokens per tile (the unit of block-level skipping); bn: output
    columns of a task (gemm_mn over [N, K] weights: weight rows of the register tile)."""

    bm: int
    bn: int

    def name(self) -> str:
        return f"m{self.bm}n{self.bn}"

    def validate(self, kernel=None) -> None:
        """ValueError unless bm and bn are >= 1 and bn divides what a kernel's tiles split (its group size for a
        gemm_mn, N for a gemm_k)."""
        if not (isinstance(self.bm, int) and isinstance(self.bn, int) and self.bm >= 1 and self.bn >= 1):
            raise ValueError(f"tile {self}: bm and bn must be integers >= 1")
        if kernel is not None:
            width, what = (kernel.dim, "N") if kernel.kind == "gemm_k" else (kernel.group_size, "group size")
            if width % self.bn:
                raise ValueError(f"tile width {self.bn} does not divide {what} {width}")

    def to_json(self) -> dict:
        return asdict(self)


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

    def validate(self, kernel=None) -> None:
        """ValueError unless the direct kernels take these knobs (gemv.mn_plan / k_plan fit them to a shape)."""
        counts = (self.warps, self.unroll, self.rows, self.row_warps, self.ksplit)
        if not all(isinstance(v, int) and v >= 1 for v in counts) or self.stages not in (0, *range(2, 9)):
            raise ValueError(f"decode knobs {self}: counts must be integers >= 1, stages 0 or 2-8")

    def to_json(self) -> dict:
        return asdict(self)


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
    """Knobs per decode bucket from a tuning log's entries: GemvKnobs fields by name ({"warps": 16, ...}), or the
    positional lists of older logs ([warps, unroll(, rows(, stages(, row_warps(, ksplit)))))]). A log written before
    the 1-token bucket existed ([<= 8, <= 16]) gives its <= 8 knobs to 1 token as well; buckets a log predates (32,
    64 tokens), and those given as None, keep the defaults."""
    knobs = tuple(GemvKnobs() if e is None else GemvKnobs(**e) if isinstance(e, dict) else GemvKnobs(*e)
                  for e in entries)
    for k in knobs:
        k.validate()
    if len(knobs) == 2:
        knobs = (knobs[0],) + knobs
    return knobs + DEFAULT_DECODE[len(knobs):]


def bucket_tokens(bucket: int) -> int:
    """Token columns (mma N, a multiple of 8) of the direct kernel for a bucket."""
    return max(8, bucket)


@dataclass(frozen=True)
class GemvTile:
    """Many-token kernel "gemv": the direct kernels' layout over sorted 64-token tiles (schedules/gemv.py: warps split
    K, no shared-memory staging), faster than a tile GEMM for a few hundred tokens or fewer. No knobs of its own."""

    kernel: ClassVar[str] = "gemv"

    def name(self) -> str:
        return "gemv64"

    def validate(self, kernel=None) -> None:
        """Every kernel kind has it."""

    def to_json(self) -> dict:
        return {"kernel": self.kernel}


@dataclass(frozen=True)
class SmemTile:
    """Many-token kernel "smem": the mma.sync tile GEMM of schedules/tile_gemm.py (any CUDA target)."""

    tokens: int = 128  # tokens per block tile (a multiple of 64)
    rows: int = 1  # 16-channel row tiles per warp: each activation fragment read from shared memory feeds this many
    stages: int = 3  # cp.async ring depth of the activation tiles (>= 2)
    prefetch: int = 1  # weight chunks loaded into registers ahead of their mma (>= 1)
    kernel: ClassVar[str] = "smem"

    def name(self) -> str:
        return f"t{self.tokens}r{self.rows}s{self.stages}p{self.prefetch}"

    def validate(self, kernel=None) -> None:
        """ValueError unless the tile GEMM can be built with these knobs (any kernel kind and shape)."""
        if self.tokens % 64 or self.rows < 1 or self.stages < 2 or self.prefetch < 1:
            raise ValueError(f"tile knobs {self}: tokens must be a multiple of 64, rows >= 1, stages >= 2, "
                             "prefetch >= 1")

    def to_json(self) -> dict:
        return {"kernel": self.kernel, **asdict(self)}


@dataclass(frozen=True)
class WgmmaMN:
    """Many-token kernel "wgmma" of a gemm_mn (gate/up, a gated query projection): the Hopper warpgroup GEMM of
    schedules/wgmma_mn.py (sm_90a). Defaults: 2 warpgroups x N 256, a 4-deep ring (192 KB of shared memory, one
    block per SM)."""

    tokens: int = 128  # tokens per block tile: a warpgroup per 64 (swapped: wgmma N, a multiple of 8 up to 256)
    rows: int = 4  # wgmma N in 64s (swapped: warpgroups of 64 weight rows)
    stages: int = 4  # ring depth (>= 3)
    ksplit: int = 1  # blocks splitting K, their fp32 partials summed by a second launch in a fixed order
    # warps of a producer that alone issues the ring's copies and hands stages over through mbarriers (warp
    # specialisation); 0: every thread copies, and one block-wide barrier per K step
    producer: int = 0
    # with producer warps: blocks of a persistent grid that walk the existing tiles (0: a block per tile, including
    # the tiles past a group's count, which only write zeros)
    persistent: int = 0
    # swap the operands (1): the weight rows are wgmma's M (64 a warpgroup, `rows` warpgroups) and the block's
    # `tokens` its N, any multiple of 8, so a group's few active tokens are not padded to 64
    swap: int = 0
    # the weights' cp.async asks L2 to prefetch this many bytes around each 16-byte copy (0, or one of L2_PREFETCH:
    # PTX's .L2::64B/128B/256B), so a memory-bound tile's DRAM requests are fewer and larger
    l2: int = 0
    # on the per-tile grid, past SORT_TOKENS: when the tiles past the last whole wave of blocks fill at most half a
    # wave, each of them is split in K over up to this many blocks (extra blocks past the grid's tiles), their fp32
    # partials summed by a second launch; 0: those tiles run whole, a wave of their own
    tail: int = 0
    # on the per-tile grid, unswapped: a warpgroup whose 64 rows are all past the group's active count (a group's
    # last tile) runs its K loop without wgmmas (1); the copies, barriers and wgmma groups stay as they are
    mma_skip: int = 0
    kernel: ClassVar[str] = "wgmma"

    def name(self) -> str:
        return (_wgmma_name(self) + ("t" if self.swap else "") + (f"l{self.l2}" if self.l2 else "")
                + (f"w{self.tail}" if self.tail else "") + ("m" if self.mma_skip else ""))

    def validate(self, kernel=None) -> None:
        """ValueError unless the wgmma gemm_mn can be built with these knobs (and, given a KernelSpec, for its
        shape)."""
        if kernel is not None and kernel.kind == "gemm_k":
            raise ValueError(f"tile knobs {self} are a gemm_mn's; {kernel.key} is a gemm_k")
        if self.l2 and self.l2 not in L2_PREFETCH:
            raise ValueError(f"wgmma tile knobs {self}: an L2 prefetch is one of {L2_PREFETCH} bytes (or 0, none)")
        if self.tail and (self.tail not in TAIL_SHARES or self.swap or self.ksplit != 1 or self.persistent):
            raise ValueError(f"wgmma tile knobs {self}: a split tail wave ({self.tail} shares a tile) is one of "
                             f"{TAIL_SHARES} shares, on the per-tile grid of an unswapped gemm_mn that does not split K")
        if self.mma_skip and (self.mma_skip != 1 or self.swap or self.persistent):
            raise ValueError(f"wgmma tile knobs {self}: a warpgroup skips its wgmmas (MMA skip 1) only on the "
                             "per-tile grid of an unswapped GEMM (a swapped tile's warpgroups are weight rows)")
        if self.swap:
            # (4 warpgroups: TVM's shared-memory sync planner refuses the kernel, "cannot insert syncs inside condition")
            if (self.tokens not in SWAP_TOKENS or self.stages < 3 or not 1 <= self.rows <= 2 or self.ksplit < 1
                    or self.producer or self.persistent or self.swap != 1):
                raise ValueError(f"swapped wgmma tile knobs {self}: tokens a multiple of 8 up to 256 (wgmma N), rows "
                                 "1..2 (warpgroups of 64 weight rows), stages >= 3, ksplit >= 1, no producer warps, "
                                 "no persistent grid")
        else:
            _check_wgmma_grid(self)
        if self.ksplit > 1 and self.persistent:
            raise ValueError(f"tile knobs {self}: a persistent grid does not split K over blocks")
        if self.persistent and not self.producer:
            raise ValueError(f"tile knobs {self}: the wgmma gemm_mn's persistent grid needs producer warps")
        if kernel is None:
            return
        nb, bn = wgmma_n(kernel.group_size, kernel.kind == "gemm_mn_swiglu", self)
        if kernel.dim % KSTEP or bn % TC_ROWS or kernel.group_size % bn or nb % 64:
            raise ValueError(f"the wgmma gemm_mn needs K a multiple of {KSTEP} and a group size that {64 * self.rows}"
                             f"-channel tiles divide; got K={kernel.dim}, group size {kernel.group_size}")

    def to_json(self) -> dict:
        return {"kernel": self.kernel, **asdict(self)}


@dataclass(frozen=True)
class WgmmaK:
    """Many-token kernel "wgmma" of a gemm_k (down, o_proj): the Hopper warpgroup GEMM of schedules/wgmma_k.py
    (sm_90a)."""

    tokens: int = 128  # tokens per block tile: a warpgroup per 64
    rows: int = 4  # wgmma N in 64s
    stages: int = 4  # ring depth (>= 3)
    ksplit: int = 1  # blocks splitting the listed K steps, their fp32 partials summed in a fixed order
    producer: int = 0  # producer warps (WgmmaMN.producer)
    # (every thread copying) blocks of a persistent grid that run the whole waves of tiles, then share the rest's K
    # steps out (stream-K); 0: a block per tile
    persistent: int = 0
    # on the per-tile grid, groups of up to MAX_GROUPS: the tiles are of tokens ordered by mask pattern
    # (schedules/token_order.py, two launches in front), so a tile's tokens share the groups they skip (1); 0: in order
    order: int = 0
    kernel: ClassVar[str] = "wgmma"
    swap: ClassVar[int] = 0  # (the ring, shared with gemm_mn, reads it: a gemm_k never swaps its operands)

    def name(self) -> str:
        return _wgmma_name(self) + ("o" if self.order else "")

    def validate(self, kernel=None) -> None:
        """ValueError unless the wgmma gemm_k can be built with these knobs (and, given a KernelSpec, for its shape
        and group count)."""
        if kernel is not None and kernel.kind != "gemm_k":
            raise ValueError(f"tile knobs {self} are a gemm_k's; {kernel.key} is a gemm_mn")
        if self.order and (self.order != 1 or self.producer or self.persistent):
            raise ValueError(f"wgmma tile knobs {self}: tokens ordered by mask pattern (order 1) only on the per-tile "
                             "grid of a gemm_k without producer warps")
        _check_wgmma_grid(self)
        if self.persistent and (self.producer or self.ksplit > 1):
            raise ValueError(f"tile knobs {self}: the wgmma gemm_k's persistent grid (stream-K) has every thread "
                             "copy and splits K by itself")
        if kernel is None:
            return
        gs, n_dim = kernel.group_size, kernel.dim
        if (gs % KSTEP and gs != KSTEP // 2) or n_dim % (64 * self.rows):
            raise ValueError(f"the wgmma gemm_k needs a group size that is {KSTEP // 2} or a multiple of {KSTEP} and "
                             f"N a multiple of {64 * self.rows}; got group size {gs}, N={n_dim}")
        # tokens ordered by mask pattern need the list entries a step ahead (every thread copying; 64-token tiles of
        # groups of 32 have no lookahead) and 2^G patterns in shared memory
        ahead = not self.producer and (gs % KSTEP == 0 or self.tokens == 128)
        if self.order and not (ahead and order_groups_ok(kernel.groups)):
            raise ValueError(f"tile knobs {self}: the wgmma gemm_k orders tokens by mask pattern for at most "
                             f"{MAX_GROUPS} groups, with lookahead; got {kernel.groups} groups of {gs}")

    def to_json(self) -> dict:
        return {"kernel": self.kernel, **asdict(self)}


TileKnobs = Union[GemvTile, SmemTile, WgmmaMN, WgmmaK]  # one token bucket's many-token kernel and its knobs
WgmmaKnobs = Union[WgmmaMN, WgmmaK]


def _wgmma_name(knobs: WgmmaKnobs) -> str:
    return (f"wg{knobs.tokens}n{64 * knobs.rows}s{knobs.stages}" + (f"k{knobs.ksplit}" if knobs.ksplit > 1 else "")
            + (f"p{knobs.producer}" if knobs.producer else "") + (f"x{knobs.persistent}" if knobs.persistent else ""))


def _check_wgmma_grid(knobs: WgmmaKnobs) -> None:
    """The rules an unswapped wgmma tile of either kind keeps."""
    if (knobs.tokens not in WGMMA_TOKENS or knobs.stages < 3 or not 1 <= knobs.rows <= 4 or knobs.ksplit < 1
            or knobs.producer not in WGMMA_PRODUCERS or knobs.persistent < 0 or knobs.persistent == 1):
        raise ValueError(f"wgmma tile knobs {knobs}: tokens must be one of {WGMMA_TOKENS} (a warpgroup per "
                         "64 tokens), rows 1..4 (wgmma N = 64 rows), stages >= 3, ksplit >= 1, producer "
                         f"warps one of {WGMMA_PRODUCERS}, and a persistent grid of 0 or at least 2 blocks")


GEMV_TILES = GemvTile()
# token tiles of the wgmma GEMMs: a warpgroup per 64 (3 would not split the weight copies evenly; 4 would need
# 4 x 128 threads x 128 accumulator registers, the whole register file)
WGMMA_TOKENS = (64, 128)
WGMMA_PRODUCERS = (0, 1, 2, 4)  # producer warps: they must split a 64-row tile's 16-byte copies evenly
SWAP_TOKENS = range(8, 257, 8)  # token tiles of the swapped wgmma gemm_mn: wgmma N
TAIL_SHARES = (2, 4, 8, 16)  # most blocks a last-wave gemm_mn tile's K is split over (knob tail)
L2_PREFETCH = (64, 128, 256)  # L2 prefetch sizes a cp.async may ask for (bytes)
# Token counts past the direct kernels are split into buckets (<= 128, <= 512, more), each with its kernel and knobs
TILE_BUCKETS = (128, 512)
DEFAULT_TILES = (GEMV_TILES, SmemTile(), SmemTile())
# The fields of a wgmma tile's positional form, in order (tuning logs and sweeps written before the knobs had names)
_WGMMA_POSITIONS = ("tokens", "rows", "stages", "ksplit", "producer", "persistent", "swap", "l2", "tail", "order",
                    "mma_skip")
_MN_ONLY = {"swap": "swaps its operands", "l2": "takes an L2 prefetch size", "mma_skip": "skips a warpgroup's wgmmas",
            "tail": "splits its tail wave (gemm_k: the persistent grid's stream-K)"}


def tile_knob(entry, kind: str) -> TileKnobs:
    """One bucket's many-token knobs for a kernel of `kind` from a log or sweep entry, checked: the named form
    ({"kernel": "smem" | "gemv" | "wgmma", field: value, ...}; to_json writes it), or the positional form of logs
    written before it: [tokens, rows, stages, prefetch], ["gemv"], or ["wgmma", tokens, rows, stages(, ksplit(,
    producer warps(, persistent blocks(, swap(, L2 prefetch bytes(, tail shares(, pattern order(, MMA skip))))))))].

        >>> tile_knob({"kernel": "wgmma", "tokens": 128, "rows": 2, "stages": 6, "ksplit": 4}, "gemm_k").name()
        'wg128n128s6k4'
        >>> tile_knob(["wgmma", 128, 2, 6, 4], "gemm_k") == WgmmaK(rows=2, stages=6, ksplit=4)
        True
    """
    wgmma = WgmmaK if kind == "gemm_k" else WgmmaMN
    if isinstance(entry, dict):
        fields = dict(entry)
        family = {"gemv": GemvTile, "smem": SmemTile, "wgmma": wgmma}.get(fields.pop("kernel", None))
        if family is None:
            raise ValueError(f"tile knobs {entry}: 'kernel' must be 'gemv', 'smem' or 'wgmma'")
        unknown = set(fields) - {f.name for f in dataclass_fields(family)}
        if unknown:
            raise ValueError(f"tile knobs {entry}: no knob {', '.join(sorted(unknown))} in a {kind}'s "
                             f"{family.__name__}")
        knobs = family(**fields)
    else:
        entry = list(entry)
        if entry == ["gemv"]:
            return GEMV_TILES
        if entry and entry[0] == "wgmma":
            if len(entry) not in range(4, 13):
                raise ValueError(f"wgmma tile knobs {entry}: expected ['wgmma', tokens, rows (N / 64), stages(, ksplit"
                                 "(, producer warps(, persistent blocks(, swap(, L2 prefetch bytes(, tail shares(, "
                                 "pattern order(, MMA skip))))))))]")
            fields = dict(zip(_WGMMA_POSITIONS, entry[1:]))
            if kind == "gemm_k":
                for name, what in _MN_ONLY.items():
                    if fields.pop(name, 0):
                        raise ValueError(f"tile knobs {entry}: only the wgmma gemm_mn {what}")
            elif fields.pop("order", 0):
                raise ValueError(f"tile knobs {entry}: only the wgmma gemm_k orders its tokens by mask pattern")
            knobs = wgmma(**fields)
        else:
            if len(entry) > 4:
                raise ValueError(f"tile knobs {entry}: expected [tokens, rows, stages, prefetch]")
            knobs = SmemTile(*entry)
    knobs.validate()
    return knobs


def tile_knobs(entry, wgmma: bool, kind: str) -> tuple:
    """Knobs per TILE_BUCKETS bucket (and the last, unbounded one) of a kernel of `kind` from a tuning log's list of
    tile_knob entries (the defaults when absent, and for buckets given as None). Without `wgmma` (a target other than
    sm_90a) a wgmma pick becomes the mma.sync tile GEMM's default."""
    knobs = (tuple(DEFAULT_TILES[min(i, len(DEFAULT_TILES) - 1)] if e is None else tile_knob(e, kind)
                   for i, e in enumerate(entry)) if entry else DEFAULT_TILES)
    return knobs if wgmma else tuple(SmemTile() if k.kernel == "wgmma" else k for k in knobs)


KSTEP = 64  # K per ring stage: one 128-byte swizzle span of fp16
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


def wgmma_n(group_size: int, swiglu: bool, knobs: WgmmaMN) -> tuple[int, int]:
    """(wgmma N, output channels per block) of gemm_mn: min(group, N / 2) channels of gate and up each (or
    min(group, N) of one projection), N = 64 x rows."""
    nw = 2 if swiglu else 1
    bn = min(group_size, 64 * knobs.rows // nw)
    return nw * bn, bn


MAX_GROUPS = 8  # patterns of at most this many groups: a thread per pattern (2^G <= THREADS), per-warp counts in shared


def order_groups_ok(groups: int) -> bool:
    """Whether tokens of `groups` groups can be ordered by pattern (2^G buckets)."""
    return 1 <= groups <= MAX_GROUPS


# The CUDA gemm_k kernels (every layout, every token count) read the mask themselves: a block lists the groups its
# tokens run. So a reorder that only gemm_k consumes (a gated projection) never runs: its bound is every count an
# int32 token index reaches.
UNREAD = 2**31 - 1
