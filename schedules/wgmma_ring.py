"""The wgmma GEMMs' ring and main loop (the producer and the consumers' K loop), shared by gemm_mn and gemm_k.

A ring stage holds a `tokens` x 64 K activation tile and an NB x 64 K weight tile, 128-byte swizzled (16-byte unit u
of row r at unit u ^ (r % 8)). Activation rows whose token skips the step's group are zero-filled by the copy
itself (cp.async src-size 0: nothing read), so the wgmmas need no per-token test. Weights in the "tc" layout land
in the swizzled tile unchanged (a 16-byte vector is 8 consecutive K of one row), or arrive by TMA as two
64-byte-swizzled 32 K halves (`weight_tensor_map`). Step s issues its four k16 wgmmas asynchronously and waits only
for step s - 1's (wgmma.wait_group 1). `wgmma_mainloop`: every thread copies, the copy issued at step s refilling
the slot step s - 2 read; `specialised_stages`: producer warps fill the slots and hand them over through mbarriers.

Worked example: tokens=128, rows=4, stages=4 -> ring_layout: 256 consumer threads (2 warpgroups), a stage of
(128 + 256) x 64 x 2 = 49152 bytes, ring_bytes = 4 x 49152 + 1024 alignment slack = 197632 bytes (one block an SM).
"""

from __future__ import annotations

from typing import NamedTuple

from tvm.script import tirx as T

from ..knobs import KSTEP
from ..knobs import WgmmaKnobs
from .gemv import ROWS


SWIZZLE_128B, SWIZZLE_64B = 3, 2  # swizzle codes (CUtensorMapSwizzle) of the wgmma descriptors and the TMA
TMA_L2_256B = 3  # CUtensorMapL2promotion: the TMA's L2 fills in 256 bytes
SBO_16B = 1024 // 16  # descriptor stride between 8-row core-matrix groups, in 16-byte units
SBO_HALF_16B = 512 // 16  # ... of a 64-byte-swizzled tile (rows of 32 K: the TMA weight halves)
ALIGN = 1024  # bytes: a 128-byte-swizzled tile starts on an 8-row x 128-byte boundary
MBARRIER_BYTES = 8  # one mbarrier; a warp-specialised ring has two a stage (full, empty), past the stages


def _wgmma(acc, nb: int, a_desc, b_desc):
    """One wgmma m64n{nb}k16 (fp16 in, fp32 accumulate into acc[0 : nb / 2]), both operands from shared memory."""
    op = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{nb}k16.f32.f16.f16"]
    return op(*[acc[i] for i in range(nb // 2)], a_desc, b_desc, True, 1, 1, 0, 0)


def _swz(row, unit):
    """Byte offset of 16-byte unit `unit` of K-major row `row` in a 128-byte-swizzled tile."""
    return row * 128 + T.bitwise_xor(unit, row % 8) * 16


def ring_ptr(xs, base, offset, c, threads, tid):
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


def ring_layout(knobs: WgmmaKnobs, nb: int) -> Ring:
    """The block layout of a wgmma GEMM with `nb` weight rows (wgmma N; swapped: M, a warpgroup per 64)."""
    consumers = 128 * (nb // 64 if knobs.swap else knobs.tokens // 64)
    threads = consumers + 32 * knobs.producer
    return Ring(threads, consumers, 32 * knobs.producer or threads, knobs.tokens * KSTEP * 2,
                (knobs.tokens + nb) * KSTEP * 2)


def tc_vector(row, chunk, unit):
    """Offset in a "tc" row tile of the 16-byte vector holding K 32 chunk + 8 (unit % 4) .. + 8 of weight row
    `row`: (chunk, half h, lane 4 g + unit % 4), row = 16 tile + 8 h + g."""
    return ((chunk * 2 + row % ROWS // 8) * 32 + row % 8 * 4 + unit % 4) * 8


@T.macro
def encode_descriptors(xs, base, desc, tid, a_bytes, b_halves=False, swap=False):
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


def wgmma_mainloop(knobs: WgmmaKnobs, nb: int, issue, landed=None, lookahead=None, active=None):
    """Macro (xs, base, desc, acc, nsteps, tid, *args): zero acc, then the K loop over `nsteps` steps with the
    kernel's `issue(step, slot, nsteps, xs, base, *args)` (cp.async one step's activation and weight tiles into
    ring slot `slot`, or an empty group past the last). xs: the dynamic shared ring; base: a local int32 [1] for its
    1024-aligned start; desc: a local uint64 [2] for the descriptors of this warpgroup's activation rows and of
    the weights in slot 0. With producer warps (`knobs.producer`) only they call `issue`, and only the
    warpgroups' acc holds the result. `landed(s, *args)`, if given, waits for step s's weight tile, which a TMA
    brings in two 64-byte-swizzled halves (weight_tensor_map), on its mbarrier before step s's block barrier.
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
        encode_descriptors(xs, base, desc, tid, ring.a_bytes, landed is not None, bool(knobs.swap))
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


def _specialised_mainloop(knobs: WgmmaKnobs, nb: int, issue, active=None):
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
            encode_descriptors(xs, base, desc, tid, ring.a_bytes)
            consume(xs, base, desc, acc, nsteps, 0, tid, *args)

    return run


def specialised_stages(knobs: WgmmaKnobs, nb: int, issue, active=None):
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


def ring_bytes(knobs: WgmmaKnobs, nb: int) -> int:
    """Dynamic shared memory of one block: the ring (and its mbarriers, with producer warps) plus the alignment
    slack."""
    return knobs.stages * (ring_layout(knobs, nb).stage + (2 * MBARRIER_BYTES if knobs.producer else 0)) + ALIGN


@T.macro
def weight_tensor_map(tmap, w, k_dim: int, n_dim: int, nb: int, chunks: int = 2):
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
