"""The Hopper wgmma gemm_mn (gate/up with SwiGLU, Q): out [n, G * gs] = x [n, K] @ W^T per active (token, group).

Token tiles of each group's tokens sorted active-first; a tile past the group's active count only writes zeros
(block-level skipping). Up to SORT_TOKENS tokens a per-tile block sorts its group's tokens itself from the mask (one
ballot a warp), so no mask reorder launches in front of it; past that, and on the persistent grid, the tiles follow
the reorder's order. Composed of the ring (wgmma_ring.py), a tile scheduler (wgmma_tiles.py) and the epilogues
(wgmma_epilogue.py).

Worked example: 300 tokens, a group with 130 active: with 128-token tiles its tokens sort into tiles [0, 128) and
[128, 256) of active tokens (the second with 2) and tile [256, 300) of inactive ones, which only writes zeros.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..kernel_spec import KernelSpec
from ..knobs import KSTEP, SORT_TOKENS, WgmmaMN, wgmma_n
from .gemv import ROWS
from .warp_ops import ballot, lanes_below, plus, popc
from .wgmma_epilogue import acc_col, acc_row, silu_mul, staged_tile_store, sum_mn_splits, zero_skipped
from .wgmma_ring import ring_bytes, ring_layout, ring_ptr, specialised_stages, tc_vector, wgmma_mainloop
from .wgmma_tiles import TAIL_HEADER, persistent_mn_body, sum_tail, tail_blocks, tail_pass


def wgmma_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, knobs: WgmmaMN = WgmmaMN()):
    """Macro (x, wg, wu, mask, counts, order, used, out, n): out [n, G * gs] of x [n, K] and W in the "tc" layout
    [N / 16, 16 K] (gate and up with SwiGLU), walking each group's tokens in the reorder's order; on the per-tile
    grid up to SORT_TOKENS tokens each block sorts its group's tokens itself and reads no reorder (the order is
    the same: active tokens ascending, then inactive ones)."""
    G, gs, K = groups, group_size, k_dim
    knobs.validate(KernelSpec("gemm_mn_swiglu" if swiglu else "gemm_mn", G, gs, K, "float16", "tc"))
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
    TAIL = bool(knobs.tail)  # past SORT_TOKENS the last wave's tiles split in K (tail_pass)
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
            ring_ptr(xs, base, slot * STAGE + A_BYTES, c, COPIERS, ct),
            w.ptr_to([w_row(c, ct, gi, bg) // ROWS, tc_vector(w_row(c, ct, gi, bg),
                                                                k_step(bg, gi, step) * 2 + ct % 8 // 4,
                                                                ct % 8)]), 16, T.uint32(16))

    @T.macro
    def copy_x(step, slot, xs, base, x, trow, tsz, gi, bg, c, ct):
        T.ptx["cp.async.cg.shared.global"](
            ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
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
                if bt * BT + acc_col(j, tid, e) < gi[1]:
                    out[slot_token(order, gi, bt, bt * BT + acc_col(j, tid, e)),
                        chan0(gi, bg) + w_chan(acc_row(tid, e))] = T.Cast(
                        "float16", silu_mul(acc[4 * j + e], acc[4 * j + e + 2]) if swiglu else acc[4 * j + e])

    @T.macro
    def store_split_swapped(ws, acc, order, gi, bt, by, tid, n):
        """store_split of the swapped GEMM."""
        for j in T.unroll(BT // 8):
            for e in T.unroll(4):
                if bt * BT + acc_col(j, tid, e) < gi[1]:
                    ws[((by % KB * nn(n) + slot_token(order, gi, bt, bt * BT + acc_col(j, tid, e))) * (NB // BN)
                        + (e // 2 if swiglu else 0)) * (G * gs) + chan0(gi, by) + w_chan(acc_row(tid, e))] = \
                        acc[4 * j + e]

    def swiglu_value(acc, j, e):
        """The fp32 output of accumulator column acc_col(j, tid, e) (j < BN / 8): SiLU(gate) x up, or the
        projection."""
        return silu_mul(acc[4 * j + e], acc[4 * (j + BN // 8) + e]) if swiglu else acc[4 * j + e]

    @T.macro
    def store(out, acc, order, gi, bt, bg, tid):
        """A warpgroup thread's outputs of the tile (rows past the group's count are not its to write), straight from
        its fragments: the persistent grid's store (its producers already fill the ring with the next tile)."""
        for j in T.unroll(BN // 8):
            for e in T.unroll(4):
                if bt * BT + acc_row(tid, e) < gi[1]:
                    out[slot_token(order, gi, bt, bt * BT + acc_row(tid, e)),
                        chan0(gi, bg) + acc_col(j, tid, e)] = T.Cast("float16", swiglu_value(acc, j, e))

    @T.macro
    def store_split(ws, acc, order, gi, bt, by, tid, n):
        """A warpgroup thread's fp32 partials of the tile into ws [KB, n, gate / up, G gs] (its split's slice), its
        two adjacent columns a store (8 bytes: a warp's store fills 32-byte sectors)."""
        for j in T.unroll(NB // 8):
            for h in T.unroll(2):
                if bt * BT + acc_row(tid, 2 * h) < gi[1]:
                    for v in T.vectorized(2):
                        ws[((by % KB * nn(n) + slot_token(order, gi, bt, bt * BT + acc_row(tid, 2 * h)))
                            * (NB // BN) + j // (BN // 8)) * (G * gs) + chan0(gi, by)
                           + acc_col(j % (BN // 8), tid, 2 * h) + v] = acc[4 * j + 2 * h + v]

    if knobs.persistent:
        return persistent_mn_body(G, gs, K, knobs, NB, BN, specialised_stages(knobs, NB, issue), copy_rows, store)

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
                            # store (split K: the sum of the partials writes them; past SORT_TOKENS: zero_skipped)
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
        split_tail = tail_pass(G, gs, K, knobs, NB, BN, ring, run, copy_rows, staged_store, chan0)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        if n <= SORT_TOKENS:  # decided on the host: one launch either way
            sorted_pass(x, wg, wu, mask, counts, order, used, out, out, n)
        elif TAIL:
            # (constant sizes; host code allocates them at function entry, whichever bucket runs)
            ws = T.alloc_buffer((P * BT * NB,), "float32", scope="global")
            hdr = T.alloc_buffer((TAIL_HEADER + 3 * (P // 2),), "int32", scope="global")
            split_tail(x, wg, wu, counts, order, out, ws, hdr, n)
            sum_tail(ws, hdr, counts, order, out, n, G, gs, BT, NB, BN, swiglu, P)
            zero_skipped(out, mask, n, G, gs)
        else:
            reading_pass(x, wg, wu, mask, counts, order, used, out, out, n)
            zero_skipped(out, mask, n, G, gs)

    @T.macro
    def body_split(x, wg, wu, mask, counts, order, used, out, n):
        ws = T.alloc_buffer((KB * nn(n) * (NB // BN) * G * gs,), "float32", scope="global")  # [KB, n, gate / up, N]
        if n <= SORT_TOKENS:
            sorted_pass(x, wg, wu, mask, counts, order, used, out, ws, n)
        else:
            reading_pass(x, wg, wu, mask, counts, order, used, out, ws, n)
        sum_mn_splits(ws, out, mask, n, KB, G, gs, swiglu)

    return body_split if KB > 1 else body
