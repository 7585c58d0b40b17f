"""Tensor-core CUDA kernels for gated projections that read only the weights of used groups.

Written for decode (<= 16 tokens, one grid row); with `token_tiles` the same kernels cover any token count
in grid rows of TILE_TOKENS sorted tokens (prefill), a row past a group's active count being skipped.

With few tokens a gated projection is memory bound: its time is the weight bytes it reads. Both kernels
compute out^T = W x^T with `mma.sync.m16n8k16` (weights as the 16-row A operand, the tokens as the
8-column B operand), so each weight byte is loaded once, as a 16-byte vector, and multiplied on tensor
cores; fp16 in, fp32 accumulate.

* `gemv_mn` (gate/up with SwiGLU, or a plain projection such as Q): a block owns 16 output channels of
  one group. A group no token runs (count 0 in the mask reorder) writes zeros and reads nothing
  (block-level skipping); inside a used group only its active tokens (the first `count` of the
  reorder's order) are gathered into the B operand (intra-block skipping).
* `gemv_k` (down / O projection): a block owns 16 output rows and streams only the K-slices of the
  groups some token runs (the reorder's `used` list); a token that skips a group contributes zeros.

The warps of a block split K; their partial tiles are summed through shared memory in a fixed order, so
results are deterministic. K-chunk order inside a warp is fixed as well.

Fragment mapping (m16n8k16): lane = 4 * g + q holds, for one 32-wide K chunk, the 16-byte vectors
W[row g, 8q:8q+8], W[row g+8, 8q:8q+8] and x[token g, 8q:8q+8]. Physical elements 8q + {0,1,2,3} play the
logical k's {2q, 2q+1, 2q+8, 2q+9} of the first mma and 8q + {4..7} those of the second; A and B use the
same permutation, so the dot products are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T

MAX_TOKENS = 16  # token counts up to this use the decode kernels
TILE_TOKENS = 64  # sorted tokens per grid row of the tensor-core kernels for more tokens
ROWS = 16  # output rows per block (the mma M)
CHUNK = 32  # K elements per warp step (4 lanes x 8 halves)


@dataclass(frozen=True)
class GemvKnobs:
    warps: int = 4  # warps per block, splitting K
    unroll: int = 4  # K chunks each warp loads before multiplying

    def name(self) -> str:
        return f"w{self.warps}u{self.unroll}"


DecodeKnobs = tuple  # (knobs for <= 8 tokens, knobs for <= 16 tokens)
DEFAULT_DECODE: DecodeKnobs = (GemvKnobs(), GemvKnobs())
PREFILL_KNOBS = GemvKnobs(warps=4, unroll=1)  # many-token kernels: 160 registers, no spills at these


def supports_mn(group_size: int, k_dim: int, dtype: str) -> bool:
    return dtype == "float16" and group_size % ROWS == 0 and k_dim % CHUNK == 0


def supports_k(group_size: int, n_dim: int, dtype: str) -> bool:
    return dtype == "float16" and group_size % CHUNK == 0 and n_dim % ROWS == 0


@T.macro
def _mma_pair(wreg, xreg, af, bf, acc, w_off, x_off, acc_off, keep, zero):
    """Two m16n8k16 mmas over one 32-wide K chunk: weights at wreg[w_off] (row g: 0..7, row g+8: 8..15);
    this lane's token column counts only where the register `keep` is nonzero (loads are unconditional,
    so they batch; the select reads registers only -- `zero` holds fp16 0, since a literal fp16 constant is
    an inline-asm conversion that nvcc cannot if-convert -- so it compiles to selp, not a branch)."""
    for p in T.unroll(2):
        af[0] = wreg[w_off + 4 * p]
        af[1] = wreg[w_off + 4 * p + 1]
        af[2] = wreg[w_off + 8 + 4 * p]
        af[3] = wreg[w_off + 8 + 4 * p + 1]
        af[4] = wreg[w_off + 4 * p + 2]
        af[5] = wreg[w_off + 4 * p + 3]
        af[6] = wreg[w_off + 8 + 4 * p + 2]
        af[7] = wreg[w_off + 8 + 4 * p + 3]
        for e in T.unroll(4):
            bf[e] = T.Select(keep != 0, xreg[x_off + 4 * p + e], zero[0])
        T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", af.data, 0, bf.data, 0,
                         acc.data, acc_off, False)


@T.macro
def _share_partials(red, acc, nacc, wy, lane):
    """Each warp's partial tile into shared memory, for the fixed-order split-K sum."""
    for a in T.unroll(nacc):
        red[(wy * nacc + a) * 32 + lane] = acc[a]


@T.macro
def _sum_over_warps(red, tot, t_idx, slot, warps, nacc, lane):
    """tot[t_idx] = sum of the warps' partial accumulator `slot`, in warp order (deterministic)."""
    tot[t_idx] = T.float32(0)
    for w in T.unroll(warps):
        tot[t_idx] = tot[t_idx] + red[(w * nacc + slot) * 32 + lane]


def gemv_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, max_tokens: int,
                 knobs: GemvKnobs = GemvKnobs(), token_tiles: bool = False):
    """Macro (x, wg, wu, counts, order, out, n), fp16, W [N, K]: for n <= max_tokens (8 or 16), or, with
    `token_tiles`, any n in grid rows of `max_tokens` sorted tokens (a tile past the group's count only
    writes its zeros: block-level skipping)."""
    G, gs, K = groups, group_size, k_dim
    N = G * gs
    W, U = knobs.warps, knobs.unroll
    NW = 2 if swiglu else 1
    MT = max_tokens
    NT = MT // 8
    CH = K // CHUNK
    while CH % (U * W):  # every step loads U full chunks per warp: no bounds branches between the loads
        U, W = (U // 2, W) if U > 1 else (U, W // 2)
    steps = CH // (U * W)
    NACC = NW * NT * 4

    def grp(bx):
        return bx * ROWS // gs

    def cnt(counts, bx, n):
        return T.min(counts[grp(bx)], T.Cast("int32", n))

    def kcol(s, u, wy, lane):
        """K column of this lane's 16-byte vector (K is a multiple of U * W chunks: no bounds checks)."""
        return ((s * U + u) * W + wy) * CHUNK + lane % 4 * 8

    def ytiles(n):
        return (T.Cast("int32", n) + MT - 1) // MT if token_tiles else 1

    def slot(counts, bx, by, n, j, lane):
        """Reorder slot of this lane's token, clamped to the last active one (its column is zeroed)."""
        return T.min(by * MT + j * 8 + lane // 4, cnt(counts, bx, n) - 1)

    def zfirst(counts, bx, by, n):
        """Slots zfirst .. zend of this tile are tokens that skip the group: they get zeros."""
        return T.max(cnt(counts, bx, n), by * MT)

    def zend(by, n):
        return T.min(T.Cast("int32", n), by * MT + MT)

    @T.macro
    def body(x, wg, wu, counts, order, out, n):
        for bx in T.thread_binding(N // ROWS, thread="blockIdx.x"):
            for by in T.thread_binding(ytiles(n), thread="blockIdx.y"):
                red = T.decl_buffer((W * NACC * 32,), "float32", scope="shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        acc = T.decl_buffer((NACC,), "float32", scope="local")
                        wreg = T.decl_buffer((U * NW * 16,), "float16", scope="local")
                        xreg = T.decl_buffer((U * NT * 8,), "float16", scope="local")
                        af = T.decl_buffer((8,), "float16", scope="local")
                        bf = T.decl_buffer((4,), "float16", scope="local")
                        keep = T.decl_buffer((NT,), "int32", scope="local")
                        zero = T.decl_buffer((1,), "float16", scope="local")
                        zero[0] = T.float16(0)
                        for a in T.unroll(NACC):
                            acc[a] = T.float32(0)
                        for j in T.unroll(NT):
                            keep[j] = T.Select(by * MT + j * 8 + lane // 4 < cnt(counts, bx, n), 1, 0)
                        if cnt(counts, bx, n) > by * MT:
                            for s in range(steps):
                                for u in T.unroll(U):
                                    for h in T.unroll(2):
                                        for v in T.vectorized(8):
                                            wreg[(u * NW * 2 + h) * 8 + v] = \
                                                wg[bx * ROWS + lane // 4 + 8 * h, kcol(s, u, wy, lane) + v]
                                        if swiglu:
                                            for v in T.vectorized(8):
                                                wreg[(u * NW * 2 + 2 + h) * 8 + v] = \
                                                    wu[bx * ROWS + lane // 4 + 8 * h, kcol(s, u, wy, lane) + v]
                                    for j in T.unroll(NT):
                                        for v in T.vectorized(8):
                                            xreg[(u * NT + j) * 8 + v] = x[order[grp(bx), slot(
                                                counts, bx, by, n, j, lane)], kcol(s, u, wy, lane) + v]
                                for u in T.unroll(U):
                                    for c in T.unroll(NW):
                                        for j in T.unroll(NT):
                                            _mma_pair(wreg, xreg, af, bf, acc, (u * NW + c) * 16, (u * NT + j) * 8,
                                                      (c * NT + j) * 4, keep[j], zero)
                        _share_partials(red, acc, NACC, wy, lane)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        tot = T.decl_buffer((2,), "float32", scope="local")
                        if wy == 0:
                            for j in T.unroll(NT):
                                for e in T.unroll(4):
                                    if by * MT + j * 8 + lane % 4 * 2 + e % 2 < cnt(counts, bx, n):
                                        for c in T.unroll(NW):
                                            _sum_over_warps(red, tot, c, (c * NT + j) * 4 + e, W, NACC, lane)
                                        if swiglu:
                                            out[order[grp(bx), by * MT + j * 8 + lane % 4 * 2 + e % 2],
                                                bx * ROWS + lane // 4 + 8 * (e // 2)] = \
                                                T.Cast("float16", tot[0] * T.sigmoid(tot[0]) * tot[1])
                                        else:
                                            out[order[grp(bx), by * MT + j * 8 + lane % 4 * 2 + e % 2],
                                                bx * ROWS + lane // 4 + 8 * (e // 2)] = T.Cast("float16", tot[0])
                        # this tile's tokens that skip the group: zeros (all threads share the (token, row) pairs)
                        for i in range((T.max(zend(by, n) - zfirst(counts, bx, by, n), 0) * ROWS + 32 * W - 1)
                                       // (32 * W)):
                            if i * 32 * W + wy * 32 + lane < (zend(by, n) - zfirst(counts, bx, by, n)) * ROWS:
                                out[order[grp(bx), zfirst(counts, bx, by, n) + (i * 32 * W + wy * 32 + lane) // ROWS],
                                    bx * ROWS + (i * 32 * W + wy * 32 + lane) % ROWS] = T.float16(0)

    return body


def gemv_k_body(groups: int, group_size: int, n_dim: int, max_tokens: int, knobs: GemvKnobs = GemvKnobs(),
                token_tiles: bool = False):
    """Macro (a, w, mask, used, out, n), fp16, W [N, K=G*gs]: for n <= max_tokens (8 or 16), or, with
    `token_tiles`, any n in grid rows of `max_tokens` tokens."""
    G, gs, N = groups, group_size, n_dim
    W, U = knobs.warps, knobs.unroll
    MT = max_tokens
    NT = MT // 8
    LPG = gs // CHUNK  # chunks per group slice
    NACC = NT * 4

    def chunk(s, u, wy):
        return (s * U + u) * W + wy

    def kcol(g, s, u, wy, lane, nch):
        """K column of this lane's vector in group g; chunks past the used ones repeat the last (zeroed)."""
        return g * gs + T.min(chunk(s, u, wy), nch - 1) % LPG * CHUNK + lane % 4 * 8

    def ytiles(n):
        return (T.Cast("int32", n) + MT - 1) // MT if token_tiles else 1

    def tok(by, j, lane, n):
        return T.min(by * MT + j * 8 + lane // 4, T.Cast("int32", n) - 1)

    @T.macro
    def body(a, w, mask, used, out, n):
        for bx in T.thread_binding(N // ROWS, thread="blockIdx.x"):
            for by in T.thread_binding(ytiles(n), thread="blockIdx.y"):
                red = T.decl_buffer((W * NACC * 32,), "float32", scope="shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        acc = T.decl_buffer((NACC,), "float32", scope="local")
                        wreg = T.decl_buffer((U * 16,), "float16", scope="local")
                        xreg = T.decl_buffer((U * NT * 8,), "float16", scope="local")
                        af = T.decl_buffer((8,), "float16", scope="local")
                        bf = T.decl_buffer((4,), "float16", scope="local")
                        greg = T.decl_buffer((U,), "int32", scope="local")
                        keep = T.decl_buffer((U * NT,), "int32", scope="local")
                        zero = T.decl_buffer((1,), "float16", scope="local")
                        zero[0] = T.float16(0)
                        nch = T.decl_buffer((1,), "int32", scope="local")
                        nch[0] = used[G] * LPG
                        for i in T.unroll(NACC):
                            acc[i] = T.float32(0)
                        if nch[0] > 0:
                            for s in range((nch[0] + U * W - 1) // (U * W)):
                                for u in T.unroll(U):
                                    greg[u] = used[T.min(chunk(s, u, wy), nch[0] - 1) // LPG]
                                    for h in T.unroll(2):
                                        for v in T.vectorized(8):
                                            wreg[(u * 2 + h) * 8 + v] = w[bx * ROWS + lane // 4 + 8 * h,
                                                                          kcol(greg[u], s, u, wy, lane, nch[0]) + v]
                                    for j in T.unroll(NT):
                                        for v in T.vectorized(8):
                                            xreg[(u * NT + j) * 8 + v] = \
                                                a[tok(by, j, lane, n), kcol(greg[u], s, u, wy, lane, nch[0]) + v]
                                        keep[u * NT + j] = T.Select(
                                            chunk(s, u, wy) < nch[0] and by * MT + j * 8 + lane // 4 < T.Cast("int32", n)
                                            and mask[tok(by, j, lane, n), greg[u]] != 0, 1, 0)
                                for u in T.unroll(U):
                                    for j in T.unroll(NT):
                                        _mma_pair(wreg, xreg, af, bf, acc, u * 16, (u * NT + j) * 8, j * 4,
                                                  keep[u * NT + j], zero)
                        _share_partials(red, acc, NACC, wy, lane)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        tot = T.decl_buffer((1,), "float32", scope="local")
                        if wy == 0:
                            for j in T.unroll(NT):
                                for e in T.unroll(4):
                                    if by * MT + j * 8 + lane % 4 * 2 + e % 2 < T.Cast("int32", n):
                                        _sum_over_warps(red, tot, 0, j * 4 + e, W, NACC, lane)
                                        out[by * MT + j * 8 + lane % 4 * 2 + e % 2,
                                            bx * ROWS + lane // 4 + 8 * (e // 2)] = T.Cast("float16", tot[0])

    return body
