"""The Hopper wgmma gemm_k (down, O): out [n, N] = sum over the groups a token runs of a [n, gs] @ W_g^T.

Token tiles in natural order (or, knob `order`, ordered by mask pattern: schedules/token_order.py); a block lists
the groups its tokens run and steps through their K slices only (block-level skipping); groups narrower than a K
step share one, side by side. Weights by TMA where every thread copies. Composed of the ring (wgmma_ring.py), the
schedulers of wgmma_stream_k.py and the epilogues (wgmma_epilogue.py).

Worked example: a 128-token tile whose tokens run groups {0, 2, 5} of 8 (groups of 512 = 8 K steps each) walks
3 x 8 = 24 K steps instead of 64.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..kernel_spec import KernelSpec
from ..knobs import KSTEP, WgmmaK
from .gemv import ROWS, bit_words, token_runs, used_groups
from .token_order import hist_size, pattern_order
from .wgmma_epilogue import acc_col, acc_row, staged_tile_store, sum_k_partials
from .wgmma_ring import ring_bytes, ring_layout, ring_ptr, tc_vector, weight_tensor_map, wgmma_mainloop
from .wgmma_stream_k import gemm_k_splits, stream_k_body


def wgmma_k_body(groups: int, group_size: int, n_dim: int, knobs: WgmmaK = WgmmaK()):
    """Macro (a, w, mask, used, out, n): out [n, N] = sum over the groups g a token runs of a[t, g's K slice] @
    W[:, g's K slice]^T, W in the "tc" layout [N / 16, 16 K] (K = G * gs). Split over blocks (gemm_k_splits: the
    knob's ksplit, more where few token tiles leave SMs idle), the blocks of a tile share its listed K steps and
    write fp32 partials, which a second launch sums in split order (deterministic)."""
    G, gs, N = groups, group_size, n_dim
    knobs.validate(KernelSpec("gemm_k", G, gs, N, "float16", "tc"))
    BT, S = knobs.tokens, knobs.stages
    NB = 64 * knobs.rows
    ring = ring_layout(knobs, NB)
    THREADS, COPIERS, A_BYTES, STAGE = ring.threads, ring.copiers, ring.a_bytes, ring.stage
    WARPS = THREADS // 32
    CA = BT * 8 // COPIERS
    CB = NB * 8 // COPIERS
    BITS = G + 1 + WARPS  # where the token bit sets start in the shared list buffer
    # weight tiles by TMA (boxes of the "tc" layout: weight_tensor_map) with every thread copying (the producer
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
    ordered = bool(knobs.order)  # (WgmmaK.validate: only with lookahead, for at most MAX_GROUPS groups)

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
                ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
                a.ptr_to([tile_row(bt, c, ct, n), k0(sused, step) + ct % 8 * 8]),
                16, T.Select(token_runs(sused, BITS, G, step // SPG, (c * COPIERS + ct) // 8) != 0,
                             T.uint32(16), T.uint32(0)))

        @T.macro
        def copy_a_ahead(xs, base, slot, a, pre, step, bt, c, ct, n):
            """copy_a from the entries lookahead loaded."""
            T.ptx["cp.async.cg.shared.global"](
                ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
                a.ptr_to([a_row(pre, PRE, bt, c, ct, n), pre[0] * gs + step % SPG * KSTEP + ct % 8 * 8]),
                16, T.Select(T.bitwise_and(T.shift_right(pre[1 + c], (c * COPIERS + ct) // 8 % 32), 1) != 0,
                             T.uint32(16), T.uint32(0)))

        @T.macro
        def copy_w(xs, base, slot, w, sused, step, bx, c, ct):
            T.ptx["cp.async.cg.shared.global"](
                ring_ptr(xs, base, slot * STAGE + A_BYTES, c, COPIERS, ct),
                w.ptr_to([(bx * NB + (c * COPIERS + ct) // 8) // ROWS,
                          tc_vector(bx * NB + (c * COPIERS + ct) // 8, k0(sused, step) // 32 + ct % 8 // 4,
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
                ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
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
                ring_ptr(xs, base, slot * STAGE, c, COPIERS, ct),
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
                ring_ptr(xs, base, slot * STAGE + A_BYTES, c, COPIERS, ct),
                w.ptr_to([(bx * NB + (c * COPIERS + ct) // 8) // ROWS,
                          tc_vector(bx * NB + (c * COPIERS + ct) // 8, unit_k(sused, step, ct) // 32,
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
        row = (sp[1] * nn(n) + perm[bt * BT + acc_row(tid, e)] if ordered
               else sp[1] * nn(n) + bt * BT + acc_row(tid, e))
        return row * N + sp[2] * NB + acc_col(j, tid, e)

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
                                        if bt * BT + acc_row(tid, 2 * h) < nn(n):
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
                                    if bt * BT + acc_row(tid, e) < nn(n):
                                        if sp[0] > 1:
                                            ws[partial(sp, bt, j, tid, e, n, perm)] = acc[4 * j + e]
                                        else:
                                            out[token(perm, bt, acc_row(tid, e)), sp[2] * NB + acc_col(j, tid, e)] = \
                                                T.Cast("float16", acc[4 * j + e])

    sort_tokens = pattern_order(G) if ordered else None

    if knobs.persistent:
        return stream_k_body(
            knobs, G, gs, N, G * SPG if gs % KSTEP == 0 else (G + GPS - 1) // GPS, ring, run, staged_store,
            steps, tma, ahead, PRE, BITS, tmap)

    @T.macro
    def body(a, w, mask, used, out, n):
        if tma:
            weight_tensor_map(tmap, w, G * gs, N, NB, 2 if gs % KSTEP == 0 else 1)
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
            sum_k_partials(ws, out, n, splits(n), N)

    return body
