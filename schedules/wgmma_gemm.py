"""Hopper (sm_90a) warpgroup tile GEMMs for gated projections over many tokens: `wgmma.mma_async` from shared memory.

A block is one warpgroup (128 threads) per 64 tokens of its token tile and owns the tile x NB weight rows
(`rows` x 64; gate and up rows side by side for SwiGLU, so one wgmma m64nNBk16 covers both). K walks in 64-wide
steps through an S-deep cp.async ring in dynamic shared memory, both operands K-major with the 128-byte swizzle
(16-byte unit u of row r stored at unit u ^ (r % 8)), described to wgmma by matrix descriptors:

* activations, 16 bytes a copy; a row whose token skips the step's group is zero-filled by the copy itself
  (src-size 0: nothing read), so the wgmmas need no per-token test (intra-block skipping on the load);
* weights: the "tc" layout's 16-byte vectors are 8 consecutive K of one row (wide_tvm/weight_layout.py), so
  they land in the swizzled tile unchanged, and the decode kernels and these share one stored weight.

Step s issues its four wgmmas asynchronously and waits only for step s - 1's (wgmma.wait_group 1), so the tensor
cores do not drain between steps; the copy issued at step s refills the slot step s - 2 read, which every
warpgroup has finished by the barrier at the top of step s. Every output element is written by one thread, with
no atomics: deterministic.

* `wgmma_mn_body` (gate/up with SwiGLU, Q): token tiles sorted per group by the mask reorder; a tile past the
  group's active count only writes its zeros (block-level skipping).
* `wgmma_k_body` (down, O): token tiles in natural order; the block lists the groups its tokens run and steps
  through their K slices only (block-level skipping).
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..targets import hopper_device_code
from .gemv import ROWS, _sum_k_splits, _used_groups, bit_words, token_runs
from .tile_gemm import TileKnobs, check_tile_knobs

hopper_device_code()  # these kernels need sm_90a device code, whichever way an sm_90 target reaches the compiler

KSTEP = 64  # K per ring stage: one 128-byte swizzle span of fp16
SWIZZLE_128B = 3  # the descriptor's swizzle code for 128 bytes
SBO_16B = 1024 // 16  # descriptor stride between 8-row core-matrix groups, in 16-byte units
ALIGN = 1024  # bytes: a 128-byte-swizzled tile starts on an 8-row x 128-byte boundary
# 2 warpgroups x N 256 (rows x 64), a 4-deep ring: 192 KB of shared memory, one block per SM
WGMMA_TILES = TileKnobs(tokens=128, rows=4, stages=4, kernel="wgmma")


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
        if group_size % KSTEP or k_dim % (64 * knobs.rows):
            raise ValueError(f"the wgmma gemm_k needs a group size that is a multiple of {KSTEP} and N a multiple "
                             f"of {64 * knobs.rows}; got group size {group_size}, N={k_dim}")
        return
    if knobs.ksplit > 1:
        raise ValueError(f"tile knobs {knobs}: only the wgmma gemm_k splits K over blocks")
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


def ring_layout(knobs: TileKnobs, nb: int) -> tuple[int, int, int]:
    """(threads, activation tile bytes, stage bytes) of a block with wgmma N `nb`: a warpgroup per 64 tokens; a
    ring stage holds the tokens x 64 K activation tile, then the nb x 64 K weight tile."""
    return 128 * (knobs.tokens // 64), knobs.tokens * KSTEP * 2, (knobs.tokens + nb) * KSTEP * 2


def _tc_vector(row, chunk, unit):
    """Offset in a "tc" row tile of the 16-byte vector holding K 32 chunk + 8 (unit % 4) .. + 8 of weight row
    `row`: (chunk, half h, lane 4 g + unit % 4), row = 16 tile + 8 h + g."""
    return ((chunk * 2 + row % ROWS // 8) * 32 + row % 8 * 4 + unit % 4) * 8


def wgmma_mainloop(knobs: TileKnobs, nb: int, issue):
    """Macro (xs, base, desc, acc, nsteps, *args): zero acc, then the K loop over `nsteps` steps with the kernel's
    `issue(step, nsteps, xs, base, *args)` (cp.async one step's activation and weight tiles into ring slot
    step % S, or an empty group past the last). xs: the dynamic shared ring; base: a local int32 [1] for its
    1024-aligned start; desc: a local uint64 [2] for the descriptors of this warpgroup's activation rows and of
    the weights in slot 0."""
    S = knobs.stages
    _, a_bytes, stage = ring_layout(knobs, nb)

    @T.macro
    def run(xs, base, desc, acc, nsteps, tid, *args):
        base[0] = T.Cast("int32", (ALIGN - T.cuda.cvta_generic_to_shared(xs.ptr_to([0])) % ALIGN) % ALIGN)
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]),
                                              xs.ptr_to([(base[0] + tid // 128 * 64 * 128) // 2]),
                                              1, SBO_16B, SWIZZLE_128B)
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[1]), xs.ptr_to([(base[0] + a_bytes) // 2]),
                                              1, SBO_16B, SWIZZLE_128B)
        for a in T.unroll(nb // 2):
            acc[a] = T.float32(0)
        for st in T.unroll(S - 2):
            issue(st, nsteps, xs, base, *args)
        for s in range(nsteps):
            T.ptx["cp.async.wait_group"](S - 3)  # this thread's copies of step s landed
            T.ptx["fence.proxy.async.shared::cta"]()  # ... and are visible to wgmma (the async proxy)
            T.tvm_storage_sync("shared")  # everyone's; and step s - 2's wgmmas are done everywhere
            issue(s + S - 2, nsteps, xs, base, *args)
            T.ptx["wgmma.fence.sync.aligned"]()
            for kk in T.unroll(KSTEP // 16):  # descriptors advance 32 bytes per k16 inside the swizzle span
                T.evaluate(_wgmma(acc, nb, desc[0] + T.Cast("uint64", (s % S * stage + kk * 32) // 16),
                                  desc[1] + T.Cast("uint64", (s % S * stage + kk * 32) // 16)))
            T.ptx["wgmma.commit_group.sync.aligned"]()
            T.ptx["wgmma.wait_group.sync.aligned"](1)
        T.ptx["wgmma.wait_group.sync.aligned"](0)
        T.ptx["cp.async.wait_group"](0)  # no copy outlives the kernel (the last ones were empty groups)

    return run


def _acc_row(tid, e):
    """Tile row of accumulator element 4 j + e (D fragment: warp w holds rows 16 w + lane / 4 (+ 8 for e >= 2))."""
    return tid // 32 * 16 + tid % 32 // 4 + e // 2 * 8


def _acc_col(j, tid, e):
    """Tile column of accumulator element 4 j + e (columns 8 j + 2 (lane % 4) + e % 2)."""
    return j * 8 + tid % 4 * 2 + e % 2


def ring_bytes(knobs: TileKnobs, nb: int) -> int:
    """Dynamic shared memory of one block: the ring plus the alignment slack."""
    return knobs.stages * ring_layout(knobs, nb)[2] + ALIGN


def wgmma_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, knobs: TileKnobs = WGMMA_TILES):
    """Macro (x, wg, wu, mask, counts, order, used, out, n): out [n, G * gs] of x [n, K] and W in the "tc" layout
    [N / 16, 16 K] (gate and up with SwiGLU), walking each group's tokens in the reorder's order."""
    G, gs, K = groups, group_size, k_dim
    check_wgmma_shape(gs, K, knobs, swiglu)
    BT, S = knobs.tokens, knobs.stages
    NB, BN = wgmma_n(gs, swiglu, knobs)
    THREADS, A_BYTES, STAGE = ring_layout(knobs, NB)
    BPG = gs // BN  # blocks per group
    CA = BT * 8 // THREADS  # 16-byte activation copies per thread and step
    CB = NB * 8 // THREADS
    ZU = BN // 8  # 16-byte output units per token row of the block

    def nn(n):
        return T.Cast("int32", n)

    def chan0(gi, bg):
        """First output channel of this block."""
        return gi[0] * gs + bg % BPG * BN

    def w_row(c, tid, gi, bg):
        """Weight row (of gate, or of up for ring rows past BN) of this thread's weight copy c."""
        return chan0(gi, bg) + (c * THREADS + tid) // 8 % BN

    @T.macro
    def copy_w(step, xs, base, w, c, gi, bg, tid):
        T.ptx["cp.async.cg.shared.global"](
            _ring_ptr(xs, base, step % S * STAGE + A_BYTES, c, THREADS, tid),
            w.ptr_to([w_row(c, tid, gi, bg) // ROWS, _tc_vector(w_row(c, tid, gi, bg), step * 2 + tid % 8 // 4,
                                                                 tid % 8)]), 16, T.uint32(16))

    @T.macro
    def issue(step, nsteps, xs, base, x, wg, wu, trow, tsz, gi, bg, tid):
        if step < nsteps:
            for c in T.unroll(CA):
                T.ptx["cp.async.cg.shared.global"](
                    _ring_ptr(xs, base, step % S * STAGE, c, THREADS, tid),
                    x.ptr_to([trow[c], step * KSTEP + tid % 8 * 8]), 16, tsz[c])
            for c in T.unroll(CB):
                if swiglu and (c * THREADS + tid) // 8 >= BN:  # up rows follow the gate rows
                    copy_w(step, xs, base, wu, c, gi, bg, tid)
                else:
                    copy_w(step, xs, base, wg, c, gi, bg, tid)
        T.ptx["cp.async.commit_group"]()

    run = wgmma_mainloop(knobs, NB, issue)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        for bt in T.thread_binding((nn(n) + BT - 1) // BT, thread="blockIdx.x"):  # a group's tiles run together
            for bg in T.thread_binding(G * BPG, thread="blockIdx.y"):
                xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
                for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                    gi = T.decl_buffer((2,), "int32", scope="local")  # group, its active tokens
                    gi[0] = used[bg // BPG]  # groups some token runs first: blocks with work start first
                    gi[1] = T.min(counts[gi[0]], nn(n))
                    if bt * BT < gi[1]:
                        acc = T.decl_buffer((NB // 2,), "float32", scope="local")
                        base = T.decl_buffer((1,), "int32", scope="local")
                        desc = T.decl_buffer((2,), "uint64", scope="local")
                        trow = T.decl_buffer((CA,), "int32", scope="local")  # token of each activation copy row
                        tsz = T.decl_buffer((CA,), "uint32", scope="local")  # its bytes: 16, or 0 past the count
                        for c in T.unroll(CA):
                            trow[c] = order[gi[0], T.min(bt * BT + (c * THREADS + tid) // 8, gi[1] - 1)]
                            tsz[c] = T.Select(bt * BT + (c * THREADS + tid) // 8 < gi[1], T.uint32(16), T.uint32(0))
                        run(xs, base, desc, acc, K // KSTEP, tid, x, wg, wu, trow, tsz, gi, bg, tid)
                        for j in T.unroll(BN // 8):
                            for e in T.unroll(4):
                                if bt * BT + _acc_row(tid, e) < gi[1]:
                                    out[order[gi[0], bt * BT + _acc_row(tid, e)],
                                        chan0(gi, bg) + _acc_col(j, tid, e)] = \
                                        T.Cast("float16", (acc[4 * j + e] * T.sigmoid(acc[4 * j + e])
                                                           * acc[4 * (j + BN // 8) + e]) if swiglu else acc[4 * j + e])
                    # this tile's slots that skip the group (all of them past the count): zeros, 16 bytes a store
                    for i in range((T.max(T.min(nn(n), bt * BT + BT) - T.max(gi[1], bt * BT), 0) * ZU
                                    + THREADS - 1) // THREADS):
                        if i * THREADS + tid < (T.min(nn(n), bt * BT + BT) - T.max(gi[1], bt * BT)) * ZU:
                            for v in T.vectorized(8):
                                out[order[gi[0], T.max(gi[1], bt * BT) + (i * THREADS + tid) // ZU],
                                    chan0(gi, bg) + (i * THREADS + tid) % ZU * 8 + v] = T.float16(0)

    return body


def wgmma_k_body(groups: int, group_size: int, n_dim: int, knobs: TileKnobs = WGMMA_TILES):
    """Macro (a, w, mask, used, out, n): out [n, N] = sum over the groups g a token runs of a[t, g's K slice] @
    W[:, g's K slice]^T, W in the "tc" layout [N / 16, 16 K] (K = G * gs). With ksplit KB > 1 (few tokens: few
    blocks) KB blocks share a tile's listed K steps and write fp32 partials, which a second launch sums in split
    order (deterministic)."""
    G, gs, N = groups, group_size, n_dim
    check_wgmma_shape(gs, N, knobs)
    BT, S = knobs.tokens, knobs.stages
    NB = 64 * knobs.rows
    THREADS, A_BYTES, STAGE = ring_layout(knobs, NB)
    WARPS = THREADS // 32
    SPG = gs // KSTEP  # K steps per group slice
    CA = BT * 8 // THREADS
    CB = NB * 8 // THREADS
    BITS = G + 1 + WARPS  # where the token bit sets start in the shared list buffer
    KB = knobs.ksplit

    def nn(n):
        return T.Cast("int32", n)

    def k0(sused, step):
        """First K of step `step` (through the listed groups)."""
        return sused[step // SPG] * gs + step % SPG * KSTEP

    @T.macro
    def issue(step, nsteps, xs, base, a, w, sused, first, bt, bx, tid, n):
        """Step `step` of this block's share, which starts at listed step first[0]."""
        if step < nsteps:
            for c in T.unroll(CA):
                T.ptx["cp.async.cg.shared.global"](
                    _ring_ptr(xs, base, step % S * STAGE, c, THREADS, tid),
                    a.ptr_to([T.min(bt * BT + (c * THREADS + tid) // 8, nn(n) - 1),
                              k0(sused, first[0] + step) + tid % 8 * 8]),
                    16, T.Select(token_runs(sused, BITS, G, (first[0] + step) // SPG, (c * THREADS + tid) // 8) != 0,
                                 T.uint32(16), T.uint32(0)))
            for c in T.unroll(CB):
                T.ptx["cp.async.cg.shared.global"](
                    _ring_ptr(xs, base, step % S * STAGE + A_BYTES, c, THREADS, tid),
                    w.ptr_to([(bx * NB + (c * THREADS + tid) // 8) // ROWS,
                              _tc_vector(bx * NB + (c * THREADS + tid) // 8,
                                         k0(sused, first[0] + step) // 32 + tid % 8 // 4, tid % 8)]), 16, T.uint32(16))
        T.ptx["cp.async.commit_group"]()

    run = wgmma_mainloop(knobs, NB, issue)

    @T.macro
    def main_pass(a, w, mask, used, out, ws, n):
        """The GEMM; with KB > 1 each split block writes its fp32 partials to ws [KB, n, N] instead of out."""
        for bt in T.thread_binding((nn(n) + BT - 1) // BT, thread="blockIdx.x"):  # a column block's tiles together
            for by in T.thread_binding(N // NB * KB, thread="blockIdx.y"):  # column block by // KB, split by % KB
                xs = T.decl_buffer((ring_bytes(knobs, NB) // 2,), "float16", scope="shared.dyn")
                sused = T.decl_buffer((BITS + bit_words(BT) * (G + 1),), "int32", scope="shared")
                for tid in T.thread_binding(THREADS, thread="threadIdx.x"):
                    _used_groups(mask, sused, n, tid // 32, tid % 32, G, WARPS, BT, BITS, bt * BT)
                    acc = T.decl_buffer((NB // 2,), "float32", scope="local")
                    base = T.decl_buffer((1,), "int32", scope="local")
                    desc = T.decl_buffer((2,), "uint64", scope="local")
                    nst = T.decl_buffer((1,), "int32", scope="local")  # this block's K steps (registers: loop bounds)
                    first = T.decl_buffer((1,), "int32", scope="local")  # ... from this listed step on
                    first[0] = sused[G] * SPG * (by % KB) // KB
                    nst[0] = sused[G] * SPG * (by % KB + 1) // KB - first[0]
                    run(xs, base, desc, acc, nst[0], tid, a, w, sused, first, bt, by // KB, tid, n)
                    for j in T.unroll(NB // 8):
                        for e in T.unroll(4):
                            if bt * BT + _acc_row(tid, e) < nn(n):
                                if KB > 1:
                                    ws[(by % KB * nn(n) + bt * BT + _acc_row(tid, e)) * N + by // KB * NB
                                       + _acc_col(j, tid, e)] = acc[4 * j + e]
                                else:
                                    out[bt * BT + _acc_row(tid, e), by // KB * NB + _acc_col(j, tid, e)] = \
                                        T.Cast("float16", acc[4 * j + e])

    @T.macro
    def body(a, w, mask, used, out, n):
        main_pass(a, w, mask, used, out, out, n)

    @T.macro
    def body_split(a, w, mask, used, out, n):
        ws = T.alloc_buffer((KB * n * N,), "float32", scope="global")  # [KB, n, N] partials
        main_pass(a, w, mask, used, out, ws, n)
        _sum_k_splits(ws, out, mask, n, KB, nn(n), N, 1, False, 0)

    return body_split if KB > 1 else body
