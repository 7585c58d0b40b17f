"""Hopper (sm_90a) warpgroup tile GEMMs for gated projections over many tokens: `wgmma.mma_async` from shared memory.

A block is one warpgroup (128 threads) per 64 tokens of its token tile and owns the tile x NB weight rows
(`rows` x 64; gate and up rows side by side for SwiGLU, so one wgmma m64nNBk16 covers both). K walks in 64-wide
steps through an S-deep cp.async ring in dynamic shared memory, both operands K-major with the 128-byte swizzle
(16-byte unit u of row r stored at unit u ^ (r % 8)), described to wgmma by matrix descriptors:

* activations, 16 bytes a copy; a row whose token skips the step's group is zero-filled by the copy itself
  (src-size 0: nothing read), so the wgmmas need no per-token test (intra-block skipping on the load);
* weights: the "tc" layout's 16-byte vectors are 8 consecutive K of one row (wide_tvm/weight_layout.py), so
  they land in the swizzled tile unchanged, and the decode kernels and these share one stored weight. In
  gemm_k, where every thread copies, one thread instead brings the step's whole weight tile by TMA (boxes of
  the "tc" layout, as two 64-byte-swizzled 32 K halves: one box for a step of one group's, one a group for a
  step of two groups of 32 K) that completes on the slot's mbarrier: two thirds of the copies a thread issued
  are gone (on the H200, down at 4096 tokens 947 -> 798 us).

Step s issues its four wgmmas asynchronously and waits only for step s - 1's (wgmma.wait_group 1), so the tensor
cores do not drain between steps. Two ways to feed the ring (knob `producer`):

* every thread copies, and the copy issued at step s refills the slot step s - 2 read, which every warpgroup has
  finished by the block-wide barrier at the top of step s;
* warp-specialised: `producer` extra warps alone issue the copies and hand each slot over through a full and an
  empty mbarrier (cp.async.mbarrier.arrive on one side, an arrive after wgmma.wait_group on the other), so the
  warpgroups never meet at a barrier and the copies run up to S - 1 steps ahead. gemm_mn can then also run on a
  persistent grid (knob `persistent`: that many blocks walk the tiles that exist, one ring through all of them).

Every output element is written by one thread, with no atomics: deterministic. gemm_k's blocks whose knobs do not
split K store their fp16 tile through the ring (staged_tile_store: 16-byte stores instead of the accumulator
fragments' 2-byte ones; on the H200 O at 512-4096 tokens 13-17 % faster, every group skipped 75 -> 26 us), and
where few token tiles split them at run time their fp32 partials 8 bytes a thread (O at 24-256 tokens 5-25 %).
gemm_mn's per-tile blocks (operands not swapped) do the same: an unsplit tile (SwiGLU applied) through the ring
into its tokens' rows, a split one's partials 8 bytes a thread, summed with 16-byte loads (H200: Q at 192-4096
tokens 3-11 %, gate/up g128 at 160-4096 2-5 %, g32 1-2 %); swapped and persistent ones still store fragments.

* `wgmma_mn_body` (gate/up with SwiGLU, Q): token tiles sorted per group (active tokens first); a tile past the
  group's active count only writes its zeros (block-level skipping). Up to SORT_TOKENS tokens a per-tile block
  sorts its group's tokens itself from the mask (one ballot a warp), so no mask reorder launches in front of it;
  past that, and on the persistent grid, the tiles follow the mask reorder's order. There the per-tile tiles
  past the count do nothing: a second launch writes every skipped (token, group)'s zeros from the mask
  (_zero_skipped; H200, 4096 tokens, 50 % sparsity: gate/up g128 2 % faster, 5-6 % at 75 %, 2.5x with every group
  skipped; Q at 513-1024 tokens 2-6 % faster, at 2048 2-5 % slower, at 4096 7-15 % faster in three device
  sessions and 3-9 % slower in two others, 2x with every group skipped: docs/performance.md).
  Knob `swap`: the operands swapped, the block's weight rows wgmma's M (a warpgroup per 64; with SwiGLU each 16
  rows are 8 channels of gate, then the same 8 of up, so a thread holds both) and its token tile wgmma's N, any
  multiple of 8: a group's active tokens are padded to 8 instead of 64, so up to a few hundred tokens the
  tensor cores do about the work that exists, not 64-128 rows of it a group (H200, gate/up g128 at 33-128
  tokens: 79-82 -> 72-74 us; tuned for <= 128 tokens only, see knob_space.KnobTask.choices).
  Knob `l2`: the weight copies' cp.async asks L2 to prefetch 64-256 bytes (`.L2::256B`): on the H200 the
  swapped gate/up g128 at 48-64 tokens 73 -> 67 us, while the unswapped kernels at 512-4096 tokens and gate/up's
  direct kernels (cp.async rings) lost 2-8 % (docs/performance.md, the fourth round of 2026-12-01), so only swapped candidates have it.
* `wgmma_k_body` (down, O): token tiles in natural order; the block lists the groups its tokens run and steps
  through their K slices only (block-level skipping); groups narrower than a step share one, side by side.
  Knob `persistent` (every thread copying): that many blocks run the whole waves of tiles, then share the last,
  partial wave's K steps out in quarter tiles (stream-K, `_stream_k_body`), so a tail wave of a few tiles does not
  leave most SMs idle; a partial wave of more than half the blocks is split into aligned parts where that takes
  fewer waves of a part than one whole tile and the parts stay long (`stream_k_parts`: down at 513-640 tokens).
  Knob `order` (per-tile grid, at most 8 groups: O's head groups): the tiles are of tokens ordered by mask pattern
  (schedules/token_order.py: two launches in front), so a tile's tokens share the groups they skip. Under random
  50 % masks a 128-token tile of 4096 tokens in token order runs all 8 of O's groups, ordered about 6; on the
  H200 the GEMM of O at 4096 tokens takes 174 instead of 238 us, 191 with the two launches (docs/performance.md,
  2026-12-04, eighth and ninth sessions).
* gemm_mn's per-tile grid, knob `mma_skip`: a warpgroup whose 64 rows are all past the group's active count (a
  group's last tile, often) runs a copy of the K loop without its wgmmas (the same copies, barriers and wgmma
  groups, empty), so the other warpgroup has the tensor cores to itself. One branch around the whole loop, and each
  branch drains its own wgmmas: a branch around the wgmmas inside the loop, or one wait after the two copies, made
  ptxas serialise every wgmma (C7520 / C7515). gemm_k cannot have it: a step's group is run by some rows of a tile
  and not others, so its skip would be per step, inside the loop. On an H100 it gains 0.7-1.9 % for gate/up g128 at
  256-512 tokens and ~0.5 % for Q, and costs gate/up g32 13 % (94-96 registers a thread instead of 72: one
  384-thread block per SM instead of two; bounded to two blocks, 80 registers, it does not), so no pick has it
  (docs/performance.md, sixteenth session).
* gemm_mn's per-tile grid past SORT_TOKENS, knob `tail` (`_tail_pass`): where the tiles past the whole waves would
  fill at most half a wave, each is split in K over up to `tail` blocks (helper blocks past the grid's tiles), their
  fp32 partials summed in a fixed order by a second launch (`_sum_tail`).
"""

from __future__ import annotations

from typing import NamedTuple

from tvm import tirx
from tvm.script import tirx as T

from .gemv import ROWS, bit_words, token_runs, used_groups
from .tile_gemm import TILE_BUCKETS, TileKnobs, check_tile_knobs
from .token_order import MAX_GROUPS, hist_size, order_groups_ok, pattern_order
from .warp_ops import ballot, block_scan, lanes_below, plus, popc

KSTEP = 64  # K per ring stage: one 128-byte swizzle span of fp16
SWIZZLE_128B, SWIZZLE_64B = 3, 2  # swizzle codes (CUtensorMapSwizzle) of the wgmma descriptors and the TMA
TMA_L2_256B = 3  # CUtensorMapL2promotion: the TMA's L2 fills in 256 bytes
SBO_16B = 1024 // 16  # descriptor stride between 8-row core-matrix groups, in 16-byte units
SBO_HALF_16B = 512 // 16  # ... of a 64-byte-swizzled tile (rows of 32 K: the TMA weight halves)
ALIGN = 1024  # bytes: a 128-byte-swizzled tile starts on an 8-row x 128-byte boundary
MBARRIER_BYTES = 8  # one mbarrier; a warp-specialised ring has two a stage (full, empty), past the stages
# 2 warpgroups x N 256 (rows x 64), a 4-deep ring: 192 KB of shared memory, one block per SM
WGMMA_TILES = TileKnobs(tokens=128, rows=4, stages=4, kernel="wgmma")
# A gemm_k split count: the SMs of an H100 / H200 (one wave of blocks per resident block an SM), the most blocks
# splitting K and the fewest K steps a raised split leaves each, and the shared memory of an SM (2 KB more a
# block: the static list buffers and the per-block reserve)
WAVE_SMS = 132
MAX_KSPLIT = 8
MIN_SPLIT_STEPS = 16
SM_SHARED_BYTES = 228 * 1024
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


def check_wgmma_shape(group_size: int, k_dim: int, knobs: TileKnobs, swiglu: bool | None = None) -> None:
    """ValueError unless a wgmma tile GEMM can take this shape and these knobs; swiglu None: gemm_k (K = the
    groups, `k_dim` its N)."""
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
        return
    if knobs.order:
        raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_k orders its tokens by mask pattern")
    if knobs.ksplit > 1 and knobs.persistent:
        raise ValueError(f"tile knobs {knobs}: a persistent grid does not split K over blocks")
    if knobs.persistent and not knobs.producer:
        raise ValueError(f"tile knobs {knobs}: the wgmma gemm_mn's persistent grid needs producer warps")
    nb, bn = wgmma_n(group_size, swiglu, knobs)
    if k_dim % KSTEP or bn % ROWS or group_size % bn or nb % 64:
        raise ValueError(f"the wgmma gemm_mn needs K a multiple of {KSTEP} and a group size that {64 * knobs.rows}"
                         f"-channel tiles divide; got K={k_dim}, group size {group_size}")


def _wgmma(acc, nb: int, a_desc, b_desc):
    """One wgmma m64n{nb}k16 (fp16 in, fp32 accumulate into acc[0 : nb / 2]), both operands from shared memory."""
    op = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{nb}k16.f32.f16.f16"]
    return op(*[acc[i] for i in range(nb // 2)], a_desc, b_desc, True, 1, 1, 0, 0)


def _swz(row, unit):
    """Byte offset of 16-byte unit `unit` of K-major row `row` in a 128-byte-swizzled tile."""
    return row * 128 + T.bitwise_xor(unit, row % 8) * 16


def _ring_ptr(xs, base, offset, c, threads, tid):
    """Where this thread's copy c lands: 16-byte unit tid % 8 of tile row (c x threads + tid) / 8 of the tile at
    byte `offset` of the ring xs (1024-aligned start base[0])."""
    return xs.ptr_to([(base[0] + offset + _swz((c * threads + tid) // 8, tid % 8)) // 2])


class Ring(NamedTuple):
    """Threads and bytes of a block: a warpgroup per 64 tokens (the consumers: wgmma and the epilogue), then the
    producer warps, if any; a ring stage holds the tokens x 64 K activation tile, then the nb x 64 K weight tile."""

    threads: int  # all of the block's
    consumers: int  # the first ones: the warpgroups
    copiers: int  # the threads that issue the ring's copies: the producer warps, or every thread without them
    a_bytes: int  # of a stage's activation tile
    stage: int  # bytes of a stage

    @property
    def copier0(self) -> int:
        """threadIdx of the first copier."""
        return self.threads - self.copiers


def ring_layout(knobs: TileKnobs, nb: int) -> Ring:
    """The block layout of a wgmma GEMM with `nb` weight rows (wgmma N; swapped: M, a warpgroup per 64)."""
    consumers = 128 * (nb // 64 if knobs.swap else knobs.tokens // 64)
    threads = consumers + 32 * knobs.producer
    return Ring(threads, consumers, 32 * knobs.producer or threads, knobs.tokens * KSTEP * 2,
                (knobs.tokens + nb) * KSTEP * 2)


def _tc_vector(row, chunk, unit):
    """Offset in a "tc" row tile of the 16-byte vector holding K 32 chunk + 8 (unit % 4) .. + 8 of weight row
    `row`: (chunk, half h, lane 4 g + unit % 4), row = 16 tile + 8 h + g."""
    return ((chunk * 2 + row % ROWS // 8) * 32 + row % 8 * 4 + unit % 4) * 8


@T.macro
def _encode_descriptors(xs, base, desc, tid, a_bytes, b_halves=False, swap=False):
    """desc[0] (wgmma's A): this warpgroup's 64 activation rows in ring slot 0; desc[1] (B): the weight tile in
    slot 0 (128-byte swizzled rows of 64 K, or with `b_halves` two 64-byte-swizzled halves of 32 K rows: the TMA
    weight tile). With `swap`, A is the warpgroup's 64 weight rows and B the slot's activation tile."""
    if swap:
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]),
                                              xs.ptr_to([(base[0] + a_bytes + tid // 128 * 64 * 128) // 2]), 1,
                                              SBO_16B, SWIZZLE_128B)
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[1]), xs.ptr_to([base[0] // 2]), 1, SBO_16B,
                                              SWIZZLE_128B)
    else:
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]),
                                              xs.ptr_to([(base[0] + tid // 128 * 64 * 128) // 2]), 1, SBO_16B,
                                              SWIZZLE_128B)
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[1]), xs.ptr_to([(base[0] + a_bytes) // 2]), 1,
                                              SBO_HALF_16B if b_halves else SBO_16B,
                                              SWIZZLE_64B if b_halves else SWIZZLE_128B)


def _wgmma_step(acc, nb: int, desc, s, S: int, stage: int, b_halves: bool = False, mma: bool = True):
    """Macro body of K step s: fence, the four k16 wgmmas of ring slot s % S, commit (not waited for). With
    `b_halves` the weight tile is two nb x 32 K halves (k16 steps 2 and 3 in the second). Without `mma` (a
    warpgroup that skips its wgmmas: knob mma_skip) only the fence and the commit (an empty wgmma group), so the
    groups that wgmma.wait_group counts are the same either way."""

    def b_off(kk):
        return kk % 2 * 32 + kk // 2 * nb * 64 if b_halves else kk * 32

    @T.macro
    def mmas():
        for kk in T.unroll(KSTEP // 16):  # descriptors advance 32 bytes per k16 inside the swizzle span
            T.evaluate(_wgmma(acc, nb, desc[0] + T.Cast("uint64", (s % S * stage + kk * 32) // 16),
                              desc[1] + T.Cast("uint64", (s % S * stage + b_off(kk)) // 16)))

    @T.macro
    def step():
        T.ptx["wgmma.fence.sync.aligned"]()
        if mma:
            mmas()
        T.ptx["wgmma.commit_group.sync.aligned"]()

    return step


def wgmma_mainloop(knobs: TileKnobs, nb: int, issue, landed=None, lookahead=None, active=None):
    """Macro (xs, base, desc, acc, nsteps, tid, *args): zero acc, then the K loop over `nsteps` steps with the
    kernel's `issue(step, slot, nsteps, xs, base, *args)` (cp.async one step's activation and weight tiles into
    ring slot `slot`, or an empty group past the last). xs: the dynamic shared ring; base: a local int32 [1] for its
    1024-aligned start; desc: a local uint64 [2] for the descriptors of this warpgroup's activation rows and of
    the weights in slot 0. With producer warps (`knobs.producer`) only they call `issue`, and only the
    warpgroups' acc holds the result. `landed(s, *args)`, if given, waits for step s's weight tile, which a TMA
    brings in two 64-byte-swizzled halves (_weight_tensor_map), on its mbarrier before step s's block barrier.
    `lookahead(step, *args)`, if given, loads what `issue` of that step reads from shared memory into registers: it
    runs at the end of the step before, so those loads land while the thread waits at the next step's barrier,
    not between that barrier and the wgmmas. `active(tid, *args)`, if given (knob mma_skip), is whether this
    thread's warpgroup multiplies at all (false where every row of its 64 is zero-filled in every step): one branch
    around the whole K loop, whose two copies differ only in the wgmmas. (A branch around a step's wgmmas inside the
    loop makes ptxas serialise every wgmma, C7520: it cannot tell that the condition is warpgroup-uniform.)"""
    if knobs.producer:
        return _specialised_mainloop(knobs, nb, issue, active)
    S = knobs.stages
    ring = ring_layout(knobs, nb)
    mma_n = knobs.tokens if knobs.swap else nb

    def k_loop(mma: bool):
        """The steps: this thread's copies, the block barrier and (with `mma`) its warpgroup's wgmmas."""

        @T.macro
        def loop(xs, base, desc, acc, nsteps, *args):
            for s in range(nsteps):
                T.ptx["cp.async.wait_group"](S - 3)  # this thread's copies of step s landed
                if landed is not None:
                    landed(s, *args)
                T.ptx["fence.proxy.async.shared::cta"]()  # ... and are visible to wgmma (the async proxy)
                T.tvm_storage_sync("shared")  # everyone's; and step s - 2's wgmmas are done everywhere
                issue(s + S - 2, (s + S - 2) % S, nsteps, xs, base, *args)
                _wgmma_step(acc, mma_n, desc, s, S, ring.stage, landed is not None, mma)()
                T.ptx["wgmma.wait_group.sync.aligned"](1)
                if lookahead is not None:  # the next issue's operands, loaded while this thread waits for step s + 1
                    lookahead(s + S - 1, *args)

        return loop

    loop_mma, loop_idle = k_loop(True), k_loop(False)

    @T.macro
    def run(xs, base, desc, acc, nsteps, tid, *args):
        base[0] = _aligned_start(xs)
        _encode_descriptors(xs, base, desc, tid, ring.a_bytes, landed is not None, bool(knobs.swap))
        for a in T.unroll(mma_n // 2):
            acc[a] = T.float32(0)
        for st in T.unroll(S - 2):
            if lookahead is not None:
                lookahead(st, *args)
            issue(st, st % S, nsteps, xs, base, *args)
        if lookahead is not None:
            lookahead(S - 2, *args)
        if active is None:
            loop_mma(xs, base, desc, acc, nsteps, *args)
            T.ptx["wgmma.wait_group.sync.aligned"](0)
        else:  # (each branch drains its own wgmmas: ptxas then keeps the multiplying one's asynchronous)
            if active(tid, *args):
                loop_mma(xs, base, desc, acc, nsteps, *args)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
            else:
                loop_idle(xs, base, desc, acc, nsteps, *args)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
        T.ptx["cp.async.wait_group"](0)  # no copy outlives the kernel (the last ones were empty groups)

    return run


def _aligned_start(xs):
    """Bytes from xs's start to its first 1024-aligned shared address."""
    return T.Cast("int32", (ALIGN - T.cuda.cvta_generic_to_shared(xs.ptr_to([0])) % ALIGN) % ALIGN)


def _specialised_mainloop(knobs: TileKnobs, nb: int, issue, active=None):
    """The K loop with producer warps (one tile): `specialised_stages` with the tile's steps numbered from 0."""
    init, produce, consume = specialised_stages(knobs, nb, issue, active)
    ring = ring_layout(knobs, nb)

    @T.macro
    def run(xs, base, desc, acc, nsteps, tid, *args):
        init(xs, base, tid)
        if tid >= ring.copier0:
            produce(xs, base, nsteps, 0, *args)
            T.ptx["cp.async.wait_group"](0)  # no copy outlives the kernel
        else:
            _encode_descriptors(xs, base, desc, tid, ring.a_bytes)
            consume(xs, base, desc, acc, nsteps, 0, tid, *args)

    return run


def specialised_stages(knobs: TileKnobs, nb: int, issue, active=None):
    """Macros (init, produce, consume) of a warp-specialised K loop. The producer warps fill ring slot i % S (i:
    the block's running step count, so a persistent block's tiles continue one ring) once the warpgroups have
    released it, and mark it full with cp.async.mbarrier.arrive (it completes when their copies land); the
    warpgroups wait for a slot's full barrier, run its wgmmas and release the slot before theirs (wgmma.wait_group
    1) on its empty barrier, and the tile's last slot when its wgmmas are done. No block-wide barrier per step, and
    the producers run up to S - 1 steps ahead (into the next tile of a persistent block while the warpgroups
    store this one). The 2 S mbarriers sit past the ring (full: 0 .. S - 1, empty: S .. 2 S - 1).

    init(xs, base, tid): the ring's aligned start (every thread), the barriers (thread 0), a block barrier;
    produce(xs, base, nsteps, i0, *args): a producer thread's copies of one tile's steps (running steps i0 ..);
    consume(xs, base, desc, acc, nsteps, i0, tid, *args): a warpgroup thread's zeroed acc through one tile's steps
    (its wgmmas only where `active(s, tid, *args)` holds, if given: wgmma_mainloop)."""
    S = knobs.stages
    ring = ring_layout(knobs, nb)

    def bar(xs, base, i):
        return xs.ptr_to([(base[0] + S * ring.stage + MBARRIER_BYTES * i) // 2])

    def consumer_steps(mma: bool):
        """A warpgroup's steps of one tile (with `mma` its wgmmas; without, it only takes and releases the slots)."""

        @T.macro
        def steps(xs, base, desc, acc, nsteps, i0, tid):
            for s in range(nsteps):
                T.cuda.mbarrier_wait(bar(xs, base, (i0 + s) % S), (i0 + s) // S % 2)  # the step's copies landed
                T.ptx["fence.proxy.async.shared::cta"]()  # ... visible to wgmma (the async proxy)
                _wgmma_step(acc, nb, desc, i0 + s, S, ring.stage, False, mma)()
                T.ptx["wgmma.wait_group.sync.aligned"](1)  # the step before's wgmmas are done: release its slot
                if s > 0 and tid % 32 == 0:
                    T.ptx["mbarrier.arrive.shared::cta.b64"](bar(xs, base, S + (i0 + s - 1) % S))

        return steps

    steps_mma, steps_idle = consumer_steps(True), consumer_steps(False)

    @T.macro
    def init(xs, base, tid):
        base[0] = _aligned_start(xs)
        if tid == 0:
            for i in T.unroll(S):
                T.ptx["mbarrier.init.shared::cta.b64"](bar(xs, base, i), ring.copiers)  # each copier's arrive
                T.ptx["mbarrier.init.shared::cta.b64"](bar(xs, base, S + i), ring.consumers // 32)  # a lane a warp
        T.tvm_storage_sync("shared")

    @T.macro
    def produce(xs, base, nsteps, i0, *args):
        for s in range(nsteps):
            if i0 + s >= S:  # the warpgroups released running step i0 + s - S's slot
                T.cuda.mbarrier_wait(bar(xs, base, S + (i0 + s) % S), ((i0 + s) // S + 1) % 2)
            issue(s, (i0 + s) % S, nsteps, xs, base, *args)
            T.ptx["cp.async.mbarrier.arrive.noinc.shared::cta.b64"](bar(xs, base, (i0 + s) % S))

    @T.macro
    def consume(xs, base, desc, acc, nsteps, i0, tid, *args):
        for a in T.unroll(nb // 2):
            acc[a] = T.float32(0)
        if active is None:
            steps_mma(xs, base, desc, acc, nsteps, i0, tid)
            T.ptx["wgmma.wait_group.sync.aligned"](0)
        else:
            if active(tid, *args):
                steps_mma(xs, base, desc, acc, nsteps, i0, tid)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
            else:
                steps_idle(xs, base, desc, acc, nsteps, i0, tid)
                T.ptx["wgmma.wait_group.sync.aligned"](0)
        if nsteps > 0 and tid % 32 == 0:  # and the tile's last slot
            T.ptx["mbarrier.arrive.shared::cta.b64"](bar(xs, base, S + (i0 + nsteps - 1) % S))

    return init, produce, consume


def _silu_mul(gate, up):
    """SwiGLU's output from fp32 gate and up: SiLU(gate) x up."""
    return gate * T.sigmoid(gate) * up


def _acc_row(tid, e):
    """Tile row of accumulator element 4 j + e (D fragment: warp w holds rows 16 w + lane / 4 (+ 8 for e >= 2))."""
    return tid // 32 * 16 + tid % 32 // 4 + e // 2 * 8


def _acc_col(j, tid, e):
    """Tile column of accumulator element 4 j + e (columns 8 j + 2 (lane % 4) + e % 2)."""
    return j * 8 + tid % 4 * 2 + e % 2


def staged_tile_store(knobs: TileKnobs, nb: int, ring: Ring, cols: int | None = None, value=None, out_row=None):
    """Macro (xs, base, acc, tid, out, row0, col0, n, *rows): the block's fp16 tile (`tokens` rows x `cols` columns,
    nb by default, of value(acc, j, e): the fp32 of accumulator column _acc_col(j, tid, e), acc[4 j + e] by
    default) into out[out_row(row0 + r, *rows) (row0 + r by default), col0 + c] for rows with row0 + r < n, through
    the ring. Stored straight from the accumulator fragments, a warp's store covers 8 rows x 8 bytes (a quarter of
    each 32-byte sector, 2 bytes a thread); staged in shared memory first (rows padded by 16 bytes, so a fragment
    store's 8 rows fall in different banks), every store is 16 bytes and a warp's cover whole rows' contiguous
    bytes. Called by every thread of the block after the K loop (its block barriers: the last wgmmas of every
    warpgroup read the ring)."""
    cols = cols or nb
    pitch = cols + 8  # halves per staged row
    units = knobs.tokens * cols // 8  # 16-byte stores of the tile
    if knobs.tokens * pitch * 2 > knobs.stages * ring.stage:
        raise ValueError(f"tile knobs {knobs}: the staged {knobs.tokens} x {cols} tile does not fit the ring")
    value = value or (lambda acc, j, e: acc[4 * j + e])
    out_row = out_row or (lambda pos, *rows: pos)

    @T.macro
    def run(xs, base, acc, tid, out, row0, col0, n, *rows):
        T.tvm_storage_sync("shared")  # every warpgroup's wgmmas are done with the ring
        if tid < ring.consumers:
            for j in T.unroll(cols // 8):
                for e in T.unroll(4):
                    # (only rows below n: unconditional reads of the accumulators after the K loop make ptxas
                    # serialise the loop's wgmmas, C7514)
                    if row0 + _acc_row(tid, e) < n:
                        xs[base[0] // 2 + _acc_row(tid, e) * pitch + _acc_col(j, tid, e)] = T.Cast(
                            "float16", value(acc, j, e))
        T.tvm_storage_sync("shared")
        for i in T.unroll((units + ring.threads - 1) // ring.threads):
            if i * ring.threads + tid < units:
                if row0 + (i * ring.threads + tid) // (cols // 8) < n:
                    for v in T.vectorized(8):  # (base[0] // 16 * 8: the load's start provably 16-byte aligned)
                        out[out_row(row0 + (i * ring.threads + tid) // (cols // 8), *rows),
                            col0 + (i * ring.threads + tid) % (cols // 8) * 8 + v] = xs[
                            base[0] // 16 * 8 + (i * ring.threads + tid) // (cols // 8) * pitch
                            + (i * ring.threads + tid) % (cols // 8) * 8 + v]

    return run


def ring_bytes(knobs: TileKnobs, nb: int) -> int:
    """Dynamic shared memory of one block: the ring (and its mbarriers, with producer warps) plus the alignment
    slack."""
    return knobs.stages * (ring_layout(knobs, nb).stage + (2 * MBARRIER_BYTES if knobs.producer else 0)) + ALIGN


def wgmma_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, knobs: TileKnobs = WGMMA_TILES):
    """Macro (x, wg, wu, mask, counts, order, used, out, n): out [n, G * gs] of x [n, K] and W in the "tc" layout
    [N / 16, 16 K] (gate and up with SwiGLU), walking each group's tokens in the reorder's order; on the per-tile
    grid up to SORT_TOKENS tokens each block sorts its group's tokens itself and reads no reorder (the order is
    the same: active tokens ascending, then inactive ones)."""
    G, gs, K = groups, group_size, k_dim
    check_wgmma_shape(gs, K, knobs, swiglu)
    BT, SW = knobs.tokens, bool(knobs.swap)
    NB, BN = wgmma_n(gs, swiglu, knobs)  # weight rows (wgmma N; swapped: its M, a warpgroup per 64), channels
    ring = ring_layout(knobs, NB)
    THREADS, COPIERS, A_BYTES, STAGE = ring.threads, ring.copiers, ring.a_bytes, ring.stage
    BPG = gs // BN  # blocks per group
    CA = (BT * 8 + COPIERS - 1) // COPIERS  # 16-byte activation copies per copying thread and step
    FULL_A = BT * 8 % COPIERS == 0  # (a swapped tile's tokens, any multiple of 8, may leave the last copy partial)
    CB = NB * 8 // COPIERS
    ACC = (BT if SW else NB) // 2  # accumulator registers a thread: wgmma N / 2
    ZU = BN // 8  # 16-byte output units per token row of the block
    KB, NST = knobs.ksplit, K // KSTEP  # blocks splitting K (blockIdx.y = column block x KB + split), K steps
    TAIL = bool(knobs.tail)  # past SORT_TOKENS the last wave's tiles split in K (_tail_pass)
    SKIP = bool(knobs.mma_skip)  # a warpgroup whose rows are all past the group's count skips its wgmmas
    GI = (3 if TAIL else 2) + SKIP  # a block's group, its active tokens (, the first K step of its share)(, whether
    SK = GI - 1  # ... this thread's warpgroup has a row below the count: mma_skip)
    WARPS = THREADS // 32
    SR = (SORT_TOKENS + THREADS - 1) // THREADS  # mask loads per thread when a block sorts its tokens

    def nn(n):
        return T.Cast("int32", n)

    def colblock(by):
        """The block's column block (blockIdx.y without the split)."""
        return by if KB == 1 else by // KB

    def first_step(by):
        """The block's first K step: its split's share starts there."""
        return 0 if KB == 1 else NST * (by % KB) // KB

    def split_steps(by):
        """K steps of the block's split (all of them without a split)."""
        return NST if KB == 1 else NST * (by % KB + 1) // KB - NST * (by % KB) // KB

    def k_step(bg, gi, step):
        """K step of the block's `step`-th: from its split's first (with a split tail, gi[2]: its share's first)."""
        return plus(first_step(bg), step) + gi[2] if TAIL else plus(first_step(bg), step)

    def chan0(gi, bg):
        """First output channel of this block."""
        return gi[0] * gs + colblock(bg) % BPG * BN

    def slot_token(order, gi, bt, pos):
        """The token at sorted position `pos` of group gi[0] (in token tile bt): from the reorder's order [G, n],
        or from the block's own list [BT] of its tile's tokens (sort_tile)."""
        return order[pos - bt * BT] if len(order.shape) == 1 else order[gi[0], pos]

    def w_chan(r):
        """Output channel (from the block's first) of weight tile row r, which is an up row past BN, or swapped with
        SwiGLU in the upper 8 rows of each 16 (w_up): then a thread's accumulator holds gate and up of a channel."""
        return r // 16 * 8 + r % 8 if SW and swiglu else r % BN

    def w_up(r):
        return r % 16 >= 8 if SW else r >= BN

    W_COPY = "cp.async.cg.shared.global" + (f".L2::{knobs.l2}B" if knobs.l2 else "")  # the weights' (knob l2)

    def w_row(c, ct, gi, bg):
        """Weight row (of gate, or of up: w_up) of copier ct's weight copy c."""
        return chan0(gi, bg) + w_chan((c * COPIERS + ct) // 8)

    def a_row(c, ct):
        """Activation tile row of copier ct's copy c (clamped into the tile: a partial last copy copies nothing)."""
        return (c * COPIERS + ct) // 8 if FULL_A else T.min((c * COPIERS + ct) // 8, BT - 1)

    @T.macro
    def copy_w(step, slot, xs, base, w, c, gi, bg, ct):
        T.ptx[W_COPY](
            _ring_ptr(xs, base, slot * STAGE + A_BYTES, c, COPIERS, ct),
            w.ptr_to([w_row(c, ct, gi, bg) // ROWS, _tc_vector(w_row(c, ct, gi, bg),
                                                                k_step(bg, gi, step) * 2 + ct % 8 // 4,
                                                                ct % 8)]), 16, T.uint32(16))

    @T.macro
    def copy_x(step, slot, xs, base, x, trow, tsz, gi, bg, c, ct):
        T.ptx["cp.async.cg.shared.global"](
            _ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
            x.ptr_to([trow[c], k_step(bg, gi, step) * KSTEP + ct % 8 * 8]), 16, tsz[c])

    @T.macro
    def issue(step, slot, nsteps, xs, base, x, wg, wu, trow, tsz, gi, bg, ct):
        """Copier ct's copies of K step `step` into ring slot `slot` (ct: its index among the copiers)."""
        if step < nsteps:
            for c in T.unroll(CA):
                if FULL_A:
                    copy_x(step, slot, xs, base, x, trow, tsz, gi, bg, c, ct)
                elif (c * COPIERS + ct) // 8 < BT:
                    copy_x(step, slot, xs, base, x, trow, tsz, gi, bg, c, ct)
            for c in T.unroll(CB):
                if swiglu and w_up((c * COPIERS + ct) // 8):
                    copy_w(step, slot, xs, base, wu, c, gi, bg, ct)
                else:
                    copy_w(step, slot, xs, base, wg, c, gi, bg, ct)
        T.ptx["cp.async.commit_group"]()

    def rows_active(tid, x, wg, wu, trow, tsz, gi, bg, ct):
        """Whether this thread's warpgroup multiplies (mma_skip): gi[SK], set per tile by warpgroup_rows."""
        return gi[SK] != 0

    run = wgmma_mainloop(knobs, NB, issue, active=rows_active if SKIP else None)

    @T.macro
    def warpgroup_rows(gi, bt, tid):
        """gi[SK] (mma_skip): 1 where this thread's warpgroup has a row of token tile bt below the group's count."""
        gi[SK] = T.Select(bt * BT + tid // 128 * 64 < gi[1], 1, 0)

    @T.macro
    def copy_rows(trow, tsz, order, gi, bt, ct):
        """Copier ct's activation rows of token tile bt: their tokens, and 16 bytes (0 past the count: zero-fill)."""
        for c in T.unroll(CA):
            trow[c] = slot_token(order, gi, bt, T.min(bt * BT + a_row(c, ct), gi[1] - 1))
            tsz[c] = T.Select(bt * BT + a_row(c, ct) < gi[1], T.uint32(16), T.uint32(0))

    @T.macro
    def store_swapped(out, acc, order, gi, bt, bg, tid):
        """store of the swapped GEMM: accumulator rows are weight rows (w_chan), its columns the tile's tokens."""
        for j in T.unroll(BT // 8):
            for e in T.unroll(2 if swiglu else 4):
                if bt * BT + _acc_col(j, tid, e) < gi[1]:
                    out[slot_token(order, gi, bt, bt * BT + _acc_col(j, tid, e)),
                        chan0(gi, bg) + w_chan(_acc_row(tid, e))] = T.Cast(
                        "float16", _silu_mul(acc[4 * j + e], acc[4 * j + e + 2]) if swiglu else acc[4 * j + e])

    @T.macro
    def store_split_swapped(ws, acc, order, gi, bt, by, tid, n):
        """store_split of the swapped GEMM."""
        for j in T.unroll(BT // 8):
            for e in T.unroll(4):
                if bt * BT + _acc_col(j, tid, e) < gi[1]:
                    ws[((by % KB * nn(n) + slot_token(order, gi, bt, bt * BT + _acc_col(j, tid, e))) * (NB // BN)
                        + (e // 2 if swiglu else 0)) * (G * gs) + chan0(gi, by) + w_chan(_acc_row(tid, e))] = \
                        acc[4 * j + e]

    def swiglu_value(acc, j, e):
        """The fp32 output of accumulator column _acc_col(j, tid, e) (j < BN / 8): SiLU(gate) x up, or the
        projection."""
        return _silu_mul(acc[4 * j + e], acc[4 * (j + BN // 8) + e]) if swiglu else acc[4 * j + e]

    @T.macro
    def store(out, acc, order, gi, bt, bg, tid):
        """A warpgroup thread's outputs of the tile (rows past the group's count are not its to write), straight from
        its fragments: the persistent grid's store (its producers already fill the ring with the next tile)."""
        for j in T.unroll(BN // 8):
            for e in T.unroll(4):
                if bt * BT + _acc_row(tid, e) < gi[1]:
                    out[slot_token(order, gi, bt, bt * BT + _acc_row(tid, e)),
                        chan0(gi, bg) + _acc_col(j, tid, e)] = T.Cast("float16", swiglu_value(acc, j, e))

    @T.macro
    def store_split(ws, acc, order, gi, bt, by, tid, n):
        """A warpgroup thread's fp32 partials of the tile into ws [KB, n, gate / up, G gs] (its split's slice), its
        two adjacent columns a store (8 bytes: a warp's store fills 32-byte sectors)."""
        for j in T.unroll(NB // 8):
            for h in T.unroll(2):
                if bt * BT + _acc_row(tid, 2 * h) < gi[1]:
                    for v in T.vectorized(2):
                        ws[((by % KB * nn(n) + slot_token(order, gi, bt, bt * BT + _acc_row(tid, 2 * h)))
                            * (NB // BN) + j // (BN // 8)) * (G * gs) + chan0(gi, by)
                           + _acc_col(j % (BN // 8), tid, 2 * h) + v] = acc[4 * j + 2 * h + v]

    if knobs.persistent:
        return _persistent_mn_body(G, gs, K, knobs, NB, BN, specialised_stages(knobs, NB, issue), copy_rows, store)

    # the per-tile grid's unsplit tile leaves through the ring: its rows are the tile's sorted token slots
    staged_store = staged_tile_store(knobs, NB, ring, BN, swiglu_value,
                                     lambda pos, order, gi, bt: slot_token(order, gi, bt, pos)) \
        if KB == 1 and not SW else None

    @T.macro
    def sort_tile(mask, gi, sl, wcnt, bt, tid, n):
        """gi[1] = the active tokens of group gi[0] and sl[i] = the token at its sorted position bt BT + i (active
        tokens ascending, then inactive ones: the reorder's order), for n <= SORT_TOKENS: each warp ballots 32
        consecutive tokens a round, and the warps' counts in shared memory (wcnt) place every token. Every thread
        calls it (block barriers)."""
        bal = T.decl_buffer((SR,), "uint32", scope="local")
        srt = T.decl_buffer((3,), "int32", scope="local")  # active tokens: all, before the warp's 32, before mine
        for r in T.unroll(SR):  # clamped loads in statements of their own: all in flight at once
            bal[r] = T.Cast("uint32", mask[T.min(r * THREADS + tid, nn(n) - 1), gi[0]])
        for r in T.unroll(SR):
            bal[r] = ballot(r * THREADS + tid < nn(n) and bal[r] != T.uint32(0))
        if tid % 32 == 0:
            for r in T.unroll(SR):
                wcnt[r * WARPS + tid // 32] = popc(T.reinterpret("int32", bal[r]))
        T.tvm_storage_sync("shared")
        srt[0] = 0
        for i in T.unroll(SR * WARPS):
            srt[0] = srt[0] + wcnt[i]
        for r in T.unroll(SR):
            srt[1] = 0
            for i in T.unroll(SR * WARPS):  # the warps (of all rounds) before this one hold the earlier tokens
                if i < r * WARPS + tid // 32:
                    srt[1] = srt[1] + wcnt[i]
            srt[2] = srt[1] + lanes_below(bal[r], tid % 32)
            if T.bitwise_and(T.shift_right(bal[r], T.Cast("uint32", tid % 32)), T.uint32(1)) == T.uint32(0):
                srt[2] = srt[0] + r * THREADS + tid - srt[2]  # inactive: after all active, then the inactive before
            if r * THREADS + tid < nn(n) and bt * BT <= srt[2] and srt[2] < bt * BT + BT:
                sl[srt[2] - bt * BT] = r * THREADS + tid
        gi[1] = srt[0]
        T.tvm_storage_sync("shared")

    def pass_of(sorts: bool):
        """The GEMM pass that sorts its tiles' tokens itself (n <= SORT_TOKENS), or reads the reorder's order."""

        def tokens(order, sl):
            """Where the pass finds its tiles' tokens (slot_token)."""
            return sl if sorts else order

        @T.macro
        def main_pass(x, wg, wu, mask, counts, order, used, out, ws, n):
            """The GEMM; with KB > 1 each split block writes its fp32 partials to ws instead of out, and no zeros."""
            for bt in T.thread_binding((nn(n) + BT - 1) // BT, thread="blockIdx.x"):  # a group's tiles run together
                for bg in T.thread_binding(G * BPG * KB, thread="blockIdx.y"):
                    xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
                    sl = T.decl_buffer((BT,), "int32", scope="shared")  # sorting: the tile's tokens
                    wcnt = T.decl_buffer((SR * WARPS,), "int32", scope="shared")  # sorting: active tokens a warp
                    for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                        gi = T.decl_buffer((GI,), "int32", scope="local")  # group, its active tokens
                        if TAIL:
                            gi[2] = 0  # (the K offset of a split tail's share: none here)
                        gi[0] = colblock(bg) // BPG
                        if sorts:
                            sort_tile(mask, gi, sl, wcnt, bt, tid, n)
                        else:
                            gi[1] = T.min(counts[gi[0]], nn(n))
                        if bt * BT < gi[1]:
                            acc = T.decl_buffer((ACC,), "float32", scope="local")
                            base = T.decl_buffer((1,), "int32", scope="local")
                            desc = T.decl_buffer((2,), "uint64", scope="local")
                            trow = T.decl_buffer((CA,), "int32", scope="local")  # token of each activation copy row
                            tsz = T.decl_buffer((CA,), "uint32", scope="local")  # its bytes: 16, or 0 past the count
                            if tid >= ring.copier0:
                                copy_rows(trow, tsz, tokens(order, sl), gi, bt, tid - ring.copier0)
                            if SKIP:
                                warpgroup_rows(gi, bt, tid)
                            run(xs, base, desc, acc, split_steps(bg), tid, x, wg, wu, trow, tsz, gi, bg,
                                tid - ring.copier0)
                            if KB == 1 and not SW:  # (every thread: block barriers)
                                staged_store(xs, base, acc, tid, out, bt * BT, chan0(gi, bg), gi[1],
                                             tokens(order, sl), gi, bt)
                            elif tid < ring.consumers:  # the warpgroups (always, without producer warps)
                                if KB > 1 and SW:
                                    store_split_swapped(ws, acc, tokens(order, sl), gi, bt, bg, tid, n)
                                elif KB > 1:
                                    store_split(ws, acc, tokens(order, sl), gi, bt, bg, tid, n)
                                else:
                                    store_swapped(out, acc, tokens(order, sl), gi, bt, bg, tid)
                        if KB == 1 and sorts:
                            # this tile's slots that skip the group (all of them past the count): zeros, 16 bytes a
                            # store (split K: the sum of the partials writes them; past SORT_TOKENS: _zero_skipped)
                            for i in range((T.max(T.min(nn(n), bt * BT + BT) - T.max(gi[1], bt * BT), 0) * ZU
                                            + THREADS - 1) // THREADS):
                                if i * THREADS + tid < (T.min(nn(n), bt * BT + BT) - T.max(gi[1], bt * BT)) * ZU:
                                    for v in T.vectorized(8):
                                        out[slot_token(tokens(order, sl), gi, bt,
                                                       T.max(gi[1], bt * BT) + (i * THREADS + tid) // ZU),
                                            chan0(gi, bg) + (i * THREADS + tid) % ZU * 8 + v] = T.float16(0)

        return main_pass

    sorted_pass, reading_pass = pass_of(True), pass_of(False)
    P = tail_blocks(knobs, NB)  # (the split tail's blocks a wave)
    if TAIL:
        tail_pass = _tail_pass(G, gs, K, knobs, NB, BN, ring, run, copy_rows, staged_store, chan0)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        if n <= SORT_TOKENS:  # decided on the host: one launch either way
            sorted_pass(x, wg, wu, mask, counts, order, used, out, out, n)
        elif TAIL:
            # (constant sizes; host code allocates them at function entry, whichever bucket runs)
            ws = T.alloc_buffer((P * BT * NB,), "float32", scope="global")
            hdr = T.alloc_buffer((TAIL_HEADER + 3 * (P // 2),), "int32", scope="global")
            tail_pass(x, wg, wu, counts, order, out, ws, hdr, n)
            _sum_tail(ws, hdr, counts, order, out, n, G, gs, BT, NB, BN, swiglu, P)
            _zero_skipped(out, mask, n, G, gs)
        else:
            reading_pass(x, wg, wu, mask, counts, order, used, out, out, n)
            _zero_skipped(out, mask, n, G, gs)

    @T.macro
    def body_split(x, wg, wu, mask, counts, order, used, out, n):
        ws = T.alloc_buffer((KB * nn(n) * (NB // BN) * G * gs,), "float32", scope="global")  # [KB, n, gate / up, N]
        if n <= SORT_TOKENS:
            sorted_pass(x, wg, wu, mask, counts, order, used, out, ws, n)
        else:
            reading_pass(x, wg, wu, mask, counts, order, used, out, ws, n)
        _sum_mn_splits(ws, out, mask, n, KB, G, gs, swiglu)

    return body_split if KB > 1 else body


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


def tail_blocks(knobs: TileKnobs, nb: int) -> int:
    """Blocks of the per-tile gemm_mn resident at once (a wave): the H200's SMs x blocks an SM by the ring."""
    return WAVE_SMS * max(1, SM_SHARED_BYTES // (ring_bytes(knobs, nb) + 2048))


def _tail_pass(G: int, gs: int, K: int, knobs: TileKnobs, NB: int, BN: int, ring: Ring, run, copy_rows,
               staged_store, chan0):
    """The per-tile gemm_mn past SORT_TOKENS (reading the reorder's order) with its last wave split in K (knob
    tail). With P blocks resident at once, the T existing tiles (numbered in launch order, _tile_numbering's) run
    as T // P whole waves and a rest of R = T % P tiles, which alone would hold the GPU for a whole tile's time with
    most SMs idle (on the H200, Q at 4096 tokens: 123 us at 264 tiles, 157 us at 266; docs/performance.md). When
    0 < R <= P / 2 each rest tile is split into S = tail_shares(...) shares of its K steps: its own block runs the
    first, blocks past the grid's tiles (helper rows of blockIdx.y) the others, each storing fp32 partials into
    ws [R x S, BT, NB] (slot r S + s); a second launch (_sum_tail) sums them in share order (deterministic),
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
                                    if sp[2] * BT + _acc_row(tid, 2 * h) < gi[1]:
                                        for v in T.vectorized(2):
                                            ws[(sp[1] * BT + _acc_row(tid, 2 * h)) * NB + _acc_col(j, tid, 2 * h)
                                               + v] = acc[4 * j + 2 * h + v]

    return main_pass


def _sum_tail(ws, hdr, counts, order, out, n, G: int, gs: int, BT: int, NB: int, BN: int, swiglu: bool, P: int):
    """Second launch of _tail_pass: a block row per possible rest tile (P / 2), UNIT_THREADS threads of 4 output
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
                                        T.Cast("float16", _silu_mul(tot[v], tot[V + v]) if swiglu else tot[v])

    return run(ws, hdr, counts, order, out, n)


# The second launches over gemm_mn's out [n, N] (_zero_skipped, _sum_mn_splits): 256 threads a block, each owning
# V consecutive channels of one token's row
UNIT_THREADS = 256


def _units(n, n_dim: int, v: int):
    """Threads of a second launch over out [n, n_dim], V channels a thread."""
    return T.Cast("int32", n) * (n_dim // v)


def _unit_token(bx, tx, n_dim: int, v: int):
    """The token (row of out) of a second launch's thread."""
    return (bx * UNIT_THREADS + tx) // (n_dim // v)


def _unit_channel(bx, tx, n_dim: int, v: int):
    """The first of a second launch's thread's V channels."""
    return (bx * UNIT_THREADS + tx) % (n_dim // v) * v


def _zero_skipped(out, mask, n, groups: int, group_size: int):
    """Second launch of the unsplit per-tile gemm_mn past SORT_TOKENS: zeros into out[t, c] wherever token t skips
    c's group, 16 bytes a thread, at full occupancy. Written by the GEMM's blocks, these zeros took a block (and its
    SM: one an SM by its ring) per token tile past a group's count, each storing its tile a row per order load: on
    the H200 gate/up g128 at 4096 tokens and 50 % sparsity took 797 us that way in Nsight Compute, 756 + 23 us this
    way; with every group skipped 119 -> 47 us in the benchmark (docs/performance.md)."""
    N, V = groups * group_size, 8

    @T.macro
    def run(out, mask, n):
        for bx in T.thread_binding((_units(n, N, V) + UNIT_THREADS - 1) // UNIT_THREADS, thread="blockIdx.x"):
            for tx in T.thread_binding(UNIT_THREADS, thread="threadIdx.x"):
                if bx * UNIT_THREADS + tx < _units(n, N, V):
                    if mask[_unit_token(bx, tx, N, V), _unit_channel(bx, tx, N, V) // group_size] == 0:
                        for v in T.vectorized(V):
                            out[_unit_token(bx, tx, N, V), _unit_channel(bx, tx, N, V) + v] = T.float16(0)

    return run(out, mask, n)


def _sum_mn_splits(ws, out, mask, n, splits: int, groups: int, group_size: int, swiglu: bool):
    """Second launch of the K-split gemm_mn: out[t, c] = the sum of the fp32 partials ws [splits, n, gate / up,
    N] in split order (deterministic; SwiGLU of gate and up), or zero where token t skips c's group. A thread
    owns 4 consecutive channels and reads the partials only of the groups its token runs."""
    N, NW, V = groups * group_size, 2 if swiglu else 1, 4

    @T.macro
    def run(ws, out, mask, n):
        for bx in T.thread_binding((_units(n, N, V) + UNIT_THREADS - 1) // UNIT_THREADS, thread="blockIdx.x"):
            for tx in T.thread_binding(UNIT_THREADS, thread="threadIdx.x"):
                tot = T.decl_buffer((NW * V,), "float32", scope="local")
                if bx * UNIT_THREADS + tx < _units(n, N, V):
                    if mask[_unit_token(bx, tx, N, V), _unit_channel(bx, tx, N, V) // group_size] != 0:
                        for h in T.unroll(NW):
                            for v in T.vectorized(V):
                                tot[h * V + v] = T.float32(0)
                        for i in T.unroll(splits):
                            for h in T.unroll(NW):
                                for v in T.vectorized(V):  # 16-byte loads
                                    tot[h * V + v] = tot[h * V + v] + ws[
                                        ((i * T.Cast("int32", n) + _unit_token(bx, tx, N, V)) * NW + h) * N
                                        + _unit_channel(bx, tx, N, V) + v]
                        for v in T.unroll(V):
                            out[_unit_token(bx, tx, N, V), _unit_channel(bx, tx, N, V) + v] = T.Cast(
                                "float16", _silu_mul(tot[v], tot[V + v]) if swiglu else tot[v])
                    else:
                        for v in T.unroll(V):
                            out[_unit_token(bx, tx, N, V), _unit_channel(bx, tx, N, V) + v] = T.float16(0)

    return run(ws, out, mask, n)


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


def _persistent_mn_body(G: int, gs: int, K: int, knobs: TileKnobs, NB: int, BN: int, stages, copy_rows, store):
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
                    _encode_descriptors(xs, base, desc, tid, ring.a_bytes)
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


def gemm_k_splits(tiles, col_blocks: int, k_steps: int, knobs: TileKnobs):
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


def wgmma_k_body(groups: int, group_size: int, n_dim: int, knobs: TileKnobs = WGMMA_TILES):
    """Macro (a, w, mask, used, out, n): out [n, N] = sum over the groups g a token runs of a[t, g's K slice] @
    W[:, g's K slice]^T, W in the "tc" layout [N / 16, 16 K] (K = G * gs). Split over blocks (gemm_k_splits: the
    knob's ksplit, more where few token tiles leave SMs idle), the blocks of a tile share its listed K steps and
    write fp32 partials, which a second launch sums in split order (deterministic)."""
    G, gs, N = groups, group_size, n_dim
    check_wgmma_shape(gs, N, knobs)
    BT, S = knobs.tokens, knobs.stages
    NB = 64 * knobs.rows
    ring = ring_layout(knobs, NB)
    THREADS, COPIERS, A_BYTES, STAGE = ring.threads, ring.copiers, ring.a_bytes, ring.stage
    WARPS = THREADS // 32
    CA = BT * 8 // COPIERS
    CB = NB * 8 // COPIERS
    BITS = G + 1 + WARPS  # where the token bit sets start in the shared list buffer
    # weight tiles by TMA (boxes of the "tc" layout: _weight_tensor_map) with every thread copying (the producer
    # warps' ring keeps cp.async): a step of one group's is one box, a step of two groups of 32 K one box a group;
    # the activations stay cp.async (a row whose token skips the group is zero-filled: O's operand is not zero there)
    tma = not knobs.producer
    tmap = T.Var("w_tensormap", T.handle("tensormap").ty)

    # the copies' list entries (group, token bits) loaded into registers a step ahead (lookahead), off the path from
    # the block barrier to the wgmmas, with every thread copying. Not for 64-token tiles of groups of 32: on the
    # H200 it made those 5-15 % slower at 33-128 tokens (128-token tiles of them: 4-8 % faster)
    ahead = not knobs.producer and (gs % KSTEP == 0 or BT == 128)
    # tiles of tokens ordered by mask pattern (knob order): two launches in front sort them (schedules/token_order.py);
    # a copier keeps its rows' tokens in registers past lookahead's entries, the store writes rows to their tokens
    ordered = bool(knobs.order)
    if ordered and not (ahead and order_groups_ok(G)):
        raise ValueError(f"tile knobs {knobs}: the wgmma gemm_k orders tokens by mask pattern for at most "
                         f"{MAX_GROUPS} groups, with lookahead; got {G} groups of {gs}")

    def nn(n):
        return T.Cast("int32", n)

    def tile_row(bt, c, ct, n):
        """Row of copier ct's copy c in token tile bt, clamped into the tokens (ordered tiles: a place in the order)."""
        return T.min(bt * BT + (c * COPIERS + ct) // 8, nn(n) - 1)

    def a_row(pre, tok, bt, c, ct, n):
        """The token of copier ct's copy c in token tile bt: its register (ordered tiles, from entry `tok` of pre)
        or the tile's row."""
        return pre[tok + c] if ordered else tile_row(bt, c, ct, n)

    if gs % KSTEP == 0:  # a listed group is SPG whole K steps
        SPG = gs // KSTEP
        PRE = 1 + CA  # lookahead's entries: the step's group, a token bit word a copy

        def k0(sused, step):
            """First K of step `step` (through the listed groups)."""
            return sused[step // SPG] * gs + step % SPG * KSTEP

        def steps(sused):
            return sused[G] * SPG

        @T.macro
        def lookahead(step, a, w, tbar, sused, pre, first, bt, bx, ct, n):
            """pre[0]: the group of this block's step `step`, pre[1 + c]: the token bit word of copy c's row
            (clamped past the list: those steps copy nothing)."""
            pre[0] = sused[T.min((first[0] + step) // SPG, G)]
            for c in T.unroll(CA):
                pre[1 + c] = sused[BITS + (c * COPIERS + ct) // 8 // 32 * (G + 1)
                                   + T.min((first[0] + step) // SPG, G)]

        @T.macro
        def copy_a(xs, base, slot, a, sused, step, bt, c, ct, n):
            T.ptx["cp.async.cg.shared.global"](
                _ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
                a.ptr_to([tile_row(bt, c, ct, n), k0(sused, step) + ct % 8 * 8]),
                16, T.Select(token_runs(sused, BITS, G, step // SPG, (c * COPIERS + ct) // 8) != 0,
                             T.uint32(16), T.uint32(0)))

        @T.macro
        def copy_a_ahead(xs, base, slot, a, pre, step, bt, c, ct, n):
            """copy_a from the entries lookahead loaded."""
            T.ptx["cp.async.cg.shared.global"](
                _ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
                a.ptr_to([a_row(pre, PRE, bt, c, ct, n), pre[0] * gs + step % SPG * KSTEP + ct % 8 * 8]),
                16, T.Select(T.bitwise_and(T.shift_right(pre[1 + c], (c * COPIERS + ct) // 8 % 32), 1) != 0,
                             T.uint32(16), T.uint32(0)))

        @T.macro
        def copy_w(xs, base, slot, w, sused, step, bx, c, ct):
            T.ptx["cp.async.cg.shared.global"](
                _ring_ptr(xs, base, slot * STAGE + A_BYTES, c, COPIERS, ct),
                w.ptr_to([(bx * NB + (c * COPIERS + ct) // 8) // ROWS,
                          _tc_vector(bx * NB + (c * COPIERS + ct) // 8, k0(sused, step) // 32 + ct % 8 // 4,
                                     ct % 8)]), 16, T.uint32(16))

        @T.macro
        def tma_w(xs, base, slot, tbar, pre, step, bx):
            """The step's whole NB x 64 weight tile, one TMA issued by one thread, landing on slot's mbarrier (its
            group from lookahead's pre[0]: a step's TMA runs only without producer warps, and with lookahead)."""
            T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](tbar.ptr_to([slot]), T.uint32(NB * KSTEP * 2))
            T.ptx["cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                xs.ptr_to([(base[0] + slot * STAGE + A_BYTES) // 2]), T.address_of(tmap), 0, 0, bx * (NB // ROWS),
                (pre[0] * gs + step % SPG * KSTEP) // 32, tbar.ptr_to([slot]))
    else:  # groups of half a step (32 K): a step packs GPS = 2 listed groups side by side in its K
        GPS, UPG = KSTEP // gs, gs // 8  # listed groups per step, 16-byte units per group
        PRE = GPS + CA  # lookahead's entries: the step's groups, a token bit word a copy

        def listed(step, ct):
            """Index in the used list of the group copier ct's 16-byte unit of step `step` belongs to."""
            return step * GPS + ct % 8 // UPG

        def unit_k(sused, step, ct):
            """Global K of copier ct's unit: its group's slice (the last listed group for a slot past the list)."""
            return (sused[T.min(listed(step, ct), sused[G] - 1)] * gs + ct % 8 % UPG * 8)

        def steps(sused):
            return (sused[G] + GPS - 1) // GPS

        @T.macro
        def copy_a(xs, base, slot, a, sused, step, bt, c, ct, n):
            T.ptx["cp.async.cg.shared.global"](
                _ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
                a.ptr_to([tile_row(bt, c, ct, n), unit_k(sused, step, ct)]),
                16, T.Select(listed(step, ct) < sused[G]
                             and token_runs(sused, BITS, G, T.min(listed(step, ct), sused[G] - 1),
                                            (c * COPIERS + ct) // 8) != 0, T.uint32(16), T.uint32(0)))

        def last_listed(sused, i):
            """Listed group i, or the last listed one past the list (clamped into the list buffer)."""
            return T.max(T.min(i, sused[G] - 1), 0)

        @T.macro
        def lookahead(step, a, w, tbar, sused, pre, first, bt, bx, ct, n):
            """pre[h]: the step's listed groups (h < GPS; past the list the last listed one), pre[GPS + c]: the token
            bit word of copy c's row in this copier's group (0 past the list: nothing to copy)."""
            for h in T.unroll(GPS):
                pre[h] = sused[last_listed(sused, (first[0] + step) * GPS + h)]
            for c in T.unroll(CA):
                pre[GPS + c] = T.Select(listed(first[0] + step, ct) < sused[G], sused[
                    BITS + (c * COPIERS + ct) // 8 // 32 * (G + 1) + last_listed(sused, listed(first[0] + step, ct))],
                    0)

        @T.macro
        def copy_a_ahead(xs, base, slot, a, pre, step, bt, c, ct, n):
            """copy_a from the entries lookahead loaded."""
            T.ptx["cp.async.cg.shared.global"](
                _ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
                a.ptr_to([a_row(pre, PRE, bt, c, ct, n), pre[ct % 8 // UPG] * gs + ct % 8 % UPG * 8]),
                16, T.Select(T.bitwise_and(T.shift_right(pre[GPS + c], (c * COPIERS + ct) // 8 % 32), 1) != 0,
                             T.uint32(16), T.uint32(0)))

        @T.macro
        def tma_w(xs, base, slot, tbar, lists, step, bx):
            """The step's GPS groups' NB x 32 weight slices (a chunk of the "tc" layout each), one TMA each into the
            tile's halves, landing on slot's mbarrier; past the used list the last listed group's again (finite: its
            activations there are zero-filled). The groups from lookahead's entries (lists: pre), or the list (lists:
            sused) without lookahead."""
            T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](tbar.ptr_to([slot]), T.uint32(NB * KSTEP * 2))
            for h in T.unroll(GPS):
                T.ptx["cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                    xs.ptr_to([(base[0] + slot * STAGE + A_BYTES + h * NB * 64) // 2]), T.address_of(tmap), 0, 0,
                    bx * (NB // ROWS), (lists[h] if ahead else lists[last_listed(lists, step * GPS + h)]) * gs // 32,
                    tbar.ptr_to([slot]))

        @T.macro
        def copy_w(xs, base, slot, w, sused, step, bx, c, ct):
            """A slot past the used list is zero-filled (its activations are zeros too)."""
            T.ptx["cp.async.cg.shared.global"](
                _ring_ptr(xs, base, slot * STAGE + A_BYTES, c, COPIERS, ct),
                w.ptr_to([(bx * NB + (c * COPIERS + ct) // 8) // ROWS,
                          _tc_vector(bx * NB + (c * COPIERS + ct) // 8, unit_k(sused, step, ct) // 32,
                                     unit_k(sused, step, ct) % 32 // 8)]), 16,
                T.Select(listed(step, ct) < sused[G], T.uint32(16), T.uint32(0)))

    @T.macro
    def issue(step, slot, nsteps, xs, base, a, w, tbar, sused, pre, first, bt, bx, ct, n):
        """Copier ct's copies of step `step` of this block's share (which starts at listed step first[0]) into ring
        slot `slot` (tbar: the TMA mbarriers, a slot each; pre: lookahead's list entries, or the list itself in
        kernels without lookahead)."""
        if step < nsteps:
            for c in T.unroll(CA):
                if ahead:
                    copy_a_ahead(xs, base, slot, a, pre, first[0] + step, bt, c, ct, n)
                else:
                    copy_a(xs, base, slot, a, sused, first[0] + step, bt, c, ct, n)
            if tma:
                if ct == 0:
                    tma_w(xs, base, slot, tbar, pre if ahead else sused, first[0] + step, bx)
            else:
                for c in T.unroll(CB):
                    copy_w(xs, base, slot, w, sused, first[0] + step, bx, c, ct)
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def landed(s, a, w, tbar, sused, pre, first, bt, bx, ct, n):
        """Step s's TMA weight tile is in its slot (the slot's use s // S completes phase s // S % 2)."""
        T.cuda.mbarrier_wait(tbar.ptr_to([s % S]), s // S % 2)

    run = wgmma_mainloop(knobs, NB, issue, landed if tma else None, lookahead if ahead else None)
    staged_store = staged_tile_store(knobs, NB, ring)
    if ordered:  # tile row r is token perm[bt BT + r]
        staged_store = staged_tile_store(knobs, NB, ring, out_row=lambda pos, perm: perm[pos])

    def token(perm, bt, r):
        """The token of row r of token tile bt (r < the tile's rows below n)."""
        return perm[bt * BT + r] if ordered else bt * BT + r

    def partial(sp, bt, j, tid, e, n, perm):
        """Index in ws [splits, n, N] of this split's fp32 partial of accumulator element 4 j + e (rows: tokens; the
        sum's association as before the order existed, so unordered kernels keep their TIR and their records)."""
        row = (sp[1] * nn(n) + perm[bt * BT + _acc_row(tid, e)] if ordered
               else sp[1] * nn(n) + bt * BT + _acc_row(tid, e))
        return row * N + sp[2] * NB + _acc_col(j, tid, e)

    def splits(n):
        """Blocks splitting K at n tokens (int32): gemm_k_splits of the token tiles."""
        return gemm_k_splits((nn(n) + BT - 1) // BT, N // NB, (G * gs + KSTEP - 1) // KSTEP, knobs)

    @T.macro
    def main_pass(a, w, mask, used, out, ws, n, perm):
        """The GEMM; split over blocks (splits(n) > 1) each block writes its fp32 partials to ws [splits, n, N]
        instead of out. Ordered tiles: mask is in perm's token order."""
        for bt in T.thread_binding((nn(n) + BT - 1) // BT, thread="blockIdx.x"):  # a column block's tiles together
            for by in T.thread_binding(N // NB * splits(n), thread="blockIdx.y"):  # column block x splits + split
                xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
                sused = T.decl_buffer((BITS + bit_words(BT) * (G + 1),), "int32", scope="shared")
                if tma:
                    tbar = T.decl_buffer((S,), "uint64", scope="shared")
                else:
                    tbar = sused  # (not read)
                for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                    used_groups(mask, sused, n, tid // 32, tid % 32, G, WARPS, BT, BITS, bt * BT)
                    acc = T.decl_buffer((NB // 2,), "float32", scope="local")
                    base = T.decl_buffer((1,), "int32", scope="local")
                    desc = T.decl_buffer((2,), "uint64", scope="local")
                    sp = T.decl_buffer((3,), "int32", scope="local")  # splits, this block's split, its column block
                    nst = T.decl_buffer((1,), "int32", scope="local")  # this block's K steps (registers: loop bounds)
                    first = T.decl_buffer((1,), "int32", scope="local")  # ... from this listed step on
                    sp[0] = splits(n)
                    sp[1] = by % sp[0]
                    sp[2] = by // sp[0]
                    first[0] = steps(sused) * sp[1] // sp[0]
                    nst[0] = steps(sused) * (sp[1] + 1) // sp[0] - first[0]
                    if tma:
                        if tid == 0:
                            for i in T.unroll(S):
                                T.ptx["mbarrier.init.shared::cta.b64"](tbar.ptr_to([i]), 1)  # the TMA thread's arrive
                            T.ptx["fence.mbarrier_init.release.cluster"]()  # ... before the TMA unit completes on them
                        # ... and before any other thread waits on them (step 0's wait comes before the K loop's
                        # first block barrier). Without this barrier, the O projection over ordered tokens crashed
                        # ("unspecified launch failure") within 2000 back-to-back calls on the H200, and with it
                        # ran 30000 clean (docs/performance.md, 2026-12-04, ninth session)
                        T.tvm_storage_sync("shared")
                    if ahead:
                        # lookahead's list entries (ordered tiles: then the tokens of this copier's rows)
                        pre = T.decl_buffer((PRE + CA if ordered else PRE,), "int32", scope="local")
                        if ordered:
                            for c in T.unroll(CA):
                                pre[PRE + c] = perm[tile_row(bt, c, tid - ring.copier0, n)]
                        run(xs, base, desc, acc, nst[0], tid, a, w, tbar, sused, pre, first, bt, sp[2],
                            tid - ring.copier0, n)
                    else:  # (kernels without lookahead read the list where they use it)
                        run(xs, base, desc, acc, nst[0], tid, a, w, tbar, sused, sused, first, bt, sp[2],
                            tid - ring.copier0, n)
                    if knobs.ksplit == 1:  # the tile leaves through shared memory (staged_tile_store)
                        if sp[0] > 1:
                            if tid < ring.consumers:  # the warpgroups (always, without producer warps)
                                for j in T.unroll(NB // 8):
                                    for h in T.unroll(2):  # 8 bytes a thread: a warp's store fills 32-byte sectors
                                        if bt * BT + _acc_row(tid, 2 * h) < nn(n):
                                            for v in T.vectorized(2):
                                                ws[partial(sp, bt, j, tid, 2 * h, n, perm) + v] = \
                                                    acc[4 * j + 2 * h + v]
                        elif ordered:
                            staged_store(xs, base, acc, tid, out, bt * BT, sp[2] * NB, nn(n), perm)
                        else:
                            staged_store(xs, base, acc, tid, out, bt * BT, sp[2] * NB, nn(n))
                    else:  # a split knob (every count splits K): as before the staging, the out branch never runs
                        if tid < ring.consumers:  # the warpgroups (always, without producer warps)
                            for j in T.unroll(NB // 8):
                                for e in T.unroll(4):
                                    if bt * BT + _acc_row(tid, e) < nn(n):
                                        if sp[0] > 1:
                                            ws[partial(sp, bt, j, tid, e, n, perm)] = acc[4 * j + e]
                                        else:
                                            out[token(perm, bt, _acc_row(tid, e)), sp[2] * NB + _acc_col(j, tid, e)] = \
                                                T.Cast("float16", acc[4 * j + e])

    sort_tokens = pattern_order(G) if ordered else None

    if knobs.persistent:
        return _stream_k_body(
            knobs, G, gs, N, G * SPG if gs % KSTEP == 0 else (G + GPS - 1) // GPS, ring, run, staged_store,
            steps, tma, ahead, PRE, BITS, tmap)

    @T.macro
    def body(a, w, mask, used, out, n):
        if tma:
            _weight_tensor_map(tmap, w, G * gs, N, NB, 2 if gs % KSTEP == 0 else 1)
        # [splits, n, N] fp32 partials (one element, unused, when one block does a tile's whole K)
        ws = T.alloc_buffer((T.Select(splits(n) > 1, T.Cast("int64", splits(n)) * n * N, T.int64(1)),), "float32",
                            scope="global")
        if ordered:  # the tokens in mask-pattern order, and the mask in that order: two launches in front
            perm = T.alloc_buffer((n,), "int32", scope="global")
            smask = T.alloc_buffer((n, G), "int32", scope="global")
            hist = T.alloc_buffer((hist_size(G, n),), "int32", scope="global")
            sort_tokens(mask, perm, smask, hist, n)
            main_pass(a, w, smask, used, out, ws, n, perm)
        else:
            main_pass(a, w, mask, used, out, ws, n, used)
        if splits(n) > 1:  # decided on the host
            _sum_k_partials(ws, out, n, splits(n), N)

    return body


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


def _stream_k_body(knobs: TileKnobs, G: int, gs: int, N: int, KS: int, ring: Ring, run, staged_store, steps, tma: bool,
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
                                    if rng[5] * BT + _acc_row(tid, 2 * h) < nn(n):
                                        for v in T.vectorized(2):
                                            ws[(partial_slot(b, k, rng[3], pt, n) * BT + _acc_row(tid, 2 * h))
                                               * NB + _acc_col(j, tid, 2 * h) + v] = acc[4 * j + 2 * h + v]

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
            _weight_tensor_map(tmap, w, G * gs, N, NB, 2 if gs % KSTEP == 0 else 1)
        # (a constant size; host code allocates it at function entry, whichever bucket runs)
        ws = T.alloc_buffer((P * STREAM_K_SLOTS * BT * NB,), "float32", scope="global")
        main_pass(a, w, mask, out, ws, n)
        sum_pass(ws, out, n)

    return body


@T.macro
def _weight_tensor_map(tmap, w, k_dim: int, n_dim: int, nb: int, chunks: int = 2):
    """Host side: bind `tmap` to a TMA tensor map of the "tc" weight w [N / 16, 16 K] (wide_tvm/weight_layout.py)
    whose box is one K step's nb x 64 tile as two halves of nb rows x 32 K (`chunks` 2; 1: one half, the slice of
    a group of 32 K), each 64-byte swizzled K-major (the 128-byte swizzle needs a 128-byte inner box, and a row's
    64 K are not contiguous in "tc": its 32 K of a chunk are). Dimensions, inner first: the 32 K of a (chunk, row)
    (64 contiguous bytes: lanes q, 8 elements each), the row in its 16-row tile (64 bytes apart), the row tile
    (32 K bytes apart), the chunk (1 KB apart)."""
    T.Bind(T.tvm_stack_alloca("tensormap", 1), var=tmap)
    T.tensormap_encode_tiled(tmap, w.data, 32, ROWS, n_dim // ROWS, k_dim // 32, 64, ROWS * k_dim * 2, 1024,
                             32, ROWS, nb // ROWS, chunks, 1, 1, 1, 1, descriptor_dtype="float16", rank=4,
                             swizzle=SWIZZLE_64B, l2_promotion=TMA_L2_256B)


def _sum_k_partials(ws, out, n, splits, cols: int):
    """Second launch of a split wgmma gemm_k: out [n, cols] = the sum of the fp32 partials ws [splits, n, cols] in
    split order (deterministic); `splits` is known at run time only, so the sum is a loop, 4 channels a thread."""
    V = 4

    @T.macro
    def run(ws, out, n, splits):
        for bx in T.thread_binding((T.Cast("int32", n) * (cols // V) + 255) // 256, thread="blockIdx.x"):
            for tx in T.thread_binding(256, thread="threadIdx.x"):
                tot = T.decl_buffer((V,), "float32", scope="local")
                if bx * 256 + tx < T.Cast("int32", n) * (cols // V):
                    for v in T.unroll(V):
                        tot[v] = T.float32(0)
                    for i in range(splits):
                        for v in T.unroll(V):
                            tot[v] = tot[v] + ws[(i * T.Cast("int32", n) + (bx * 256 + tx) // (cols // V)) * cols
                                                 + (bx * 256 + tx) % (cols // V) * V + v]
                    for v in T.unroll(V):
                        out[(bx * 256 + tx) // (cols // V), (bx * 256 + tx) % (cols // V) * V + v] = T.Cast(
                            "float16", tot[v])

    return run(ws, out, n, splits)
