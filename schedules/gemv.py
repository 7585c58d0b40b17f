"""Tensor-core CUDA kernels for gated projections that read only the weights of used groups.

Written for decode and short prompts (<= 64 tokens, one grid row, one kernel per token bucket 1 / 2-8 /
9-16 / 17-32 / 33-64 with its own knobs): the tokens themselves are the mma columns and the kernels read the
mask directly, so no reorder has to run first and every weight byte in use is read once, whatever the token
count. With `token_tiles` the same kernels cover any token count in grid rows of TILE_TOKENS tokens
sorted by the mask reorder (prefill), a row past a group's active count being skipped.

With few tokens a gated projection is memory bound: its time is the weight bytes it reads. Both kernels
compute out^T = W x^T with `mma.sync.m16n8k16` (weights as the 16-row A operand, the tokens as the
8-column B operand), so each weight byte is loaded once, as a 16-byte vector, and multiplied on tensor
cores; fp16 in, fp32 accumulate.

* `gemv_mn` (gate/up with SwiGLU, or a plain projection such as Q): a block owns 16 output channels of
  one group; a group no token runs writes zeros and reads nothing (block-level skipping), a token that
  skips the group is zeroed in the B operand (intra-block skipping). Token tiles gather only a group's
  active tokens (the first `count` of the reorder's order).
* `gemv_k` (down / O projection): a block owns 16 (x `rows`) output rows and streams only the K-slices of
  the groups some token runs: the block builds that list (and each listed group's token bit set) in
  shared memory from the mask rows of its tokens (decode: all of them; token tiles: the tile's); a token
  that skips a group contributes zeros.

Weights are stored in the "tc" layout (wide_tvm/weight_layout.py): each lane's 16-byte fragment vector
sits where a warp load of 512 contiguous bytes fetches it, and a 16-row tile streams as one block.

The warps of a block split K; their partial tiles are summed through shared memory in a fixed order, so
results are deterministic. K-chunk order inside a warp is fixed as well. Decode weights are loaded straight
into registers, or (knob `stages`) streamed through a per-warp cp.async ring in shared memory, each lane
reading back only the bytes it copied (no barrier needed).

Fragment mapping (m16n8k16): lane = 4 * g + q holds, for one 32-wide K chunk, the 16-byte vectors
W[row g, 8q:8q+8], W[row g+8, 8q:8q+8] and x[token g, 8q:8q+8]. Physical elements 8q + {0,1,2,3} play the
logical k's {2q, 2q+1, 2q+8, 2q+9} of the first mma and 8q + {4..7} those of the second; A and B use the
same permutation, so the dot products are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T

from .dispatch import token_dispatch
from .warp_ops import plus

MAX_TOKENS = 64  # token counts up to this use the direct (decode) kernels
TILE_TOKENS = 64  # sorted tokens per grid row of the tensor-core kernels for more tokens
ROWS = 16  # output rows per block (the mma M)
CHUNK = 32  # K elements per warp step (4 lanes x 8 halves)
SMEM_BYTES = 48 * 1024  # static shared memory per block


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
# (tools/restamp_records.py --set gemv.TILE_TAKEOVER=32 rebuilds today's kernels with the bound before it).
TILE_TAKEOVER = 16


def direct_bound(kind: str, tile_knobs: tuple, group_size: int) -> int:
    """Token counts up to which a tensor-core kernel of `kind` ("gemm_k" or a gemm_mn kind) runs its direct kernels,
    given its many-token knobs per tile bucket (schedules/tile_gemm.py: tile_knobs) and group size. Past it gemm_mn's
    many-token kernels read the mask reorder's sorted order unless they sort their tokens themselves
    (wgmma_gemm.reorder_free_bound); no gemm_k kernel reads the reorder at any count (passes/lower_gated.py:
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


def tensor_core_kernels(kind: str, decode_knobs: DecodeKnobs, make_body, many: list, bound: int | None = None):
    """Macro (n, *args) running the direct kernel of n's token bucket (each bucket with its knobs) up to `bound`
    tokens (default DIRECT_TOKENS[kind]; see direct_bound), then the many-token kernels `many` ([(bound, body),
    ..., (None, body)], schedules/tile_gemm.py: many_token_kernels); make_body(max_tokens, knobs) builds one
    direct kernel body of `kind` ("gemm_mn" or "gemm_k")."""
    if len(decode_knobs) != len(DECODE_BUCKETS):
        raise ValueError(f"knobs for {len(decode_knobs)} token buckets; the direct kernels have "
                         f"{len(DECODE_BUCKETS)} ({', '.join(map(str, DECODE_BUCKETS))} tokens)")
    bound = DIRECT_TOKENS[kind] if bound is None else bound
    if bound not in DECODE_BUCKETS:
        raise ValueError(f"direct kernels up to {bound} tokens: the bound must be a bucket ({DECODE_BUCKETS})")
    direct = [(b, make_body(bucket_tokens(b), knobs)) for b, knobs in zip(DECODE_BUCKETS, decode_knobs) if b <= bound]
    return token_dispatch(direct + [(b, body) for b, body in many if b is None or b > bound])


def bucket_tokens(bucket: int) -> int:
    """Token columns (mma N, a multiple of 8) of the direct kernel for a bucket."""
    return max(8, bucket)


def fit_registers(unroll: int, max_tokens: int) -> int:
    """K chunks per step that keep a step's activations (unroll x tokens halves per lane) within 32
    registers: the tuned unroll of a small bucket, capped for the wide ones (64 tokens: 1)."""
    return max(1, min(unroll, 64 // max_tokens))


def fit_partials(warps: int, nacc: int, extra_bytes: int = 0) -> int:
    """Warps whose split-K partial tiles (nacc floats per lane) fit static shared memory."""
    while warps > 1 and warps * nacc * 32 * 4 + extra_bytes > SMEM_BYTES:
        warps //= 2
    return warps


PREFILL_KNOBS = GemvKnobs(warps=4, unroll=1)  # many-token kernels: 160 registers, no spills at these


@T.macro
def a_fragment(af, wreg, w_off, p):
    """af = the A operand of mma p (0, 1) of a 32-wide K chunk, from a lane's two 16-byte weight vectors at
    wreg[w_off] (row g: 0..7, row g + 8: 8..15), in the permuted k order the B operand shares (module docstring)."""
    af[0] = wreg[w_off + 4 * p]
    af[1] = wreg[w_off + 4 * p + 1]
    af[2] = wreg[w_off + 8 + 4 * p]
    af[3] = wreg[w_off + 8 + 4 * p + 1]
    af[4] = wreg[w_off + 4 * p + 2]
    af[5] = wreg[w_off + 4 * p + 3]
    af[6] = wreg[w_off + 8 + 4 * p + 2]
    af[7] = wreg[w_off + 8 + 4 * p + 3]


@T.macro
def _mma_pair(wreg, xreg, af, bf, acc, w_off, x_off, acc_off, keep, zero):
    """Two m16n8k16 mmas over one 32-wide K chunk: weights at wreg[w_off] (row g: 0..7, row g+8: 8..15);
    this lane's token column counts only where the register `keep` is nonzero (loads are unconditional,
    so they batch; the select reads registers only -- `zero` holds fp16 0, since a literal fp16 constant is
    an inline-asm conversion that nvcc cannot if-convert -- so it compiles to selp, not a branch)."""
    for p in T.unroll(2):
        a_fragment(af, wreg, w_off, p)
        for e in T.unroll(4):
            bf[e] = T.Select(keep != 0, xreg[x_off + 4 * p + e], zero[0])
        T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", af.data, 0, bf.data, 0,
                         acc.data, acc_off, False)


def _fit_ring(stages: int, unroll: int, warps: int, vec_per_chunk: int, red_bytes) -> tuple[int, int, int]:
    """(stages, unroll, warps) whose cp.async ring (512 bytes per 16-byte vector per lane group) plus the
    split-K partials (`red_bytes(warps)`) fit static shared memory: fewer stages first, then unroll, then warps."""
    while stages and warps * stages * unroll * vec_per_chunk * 512 + red_bytes(warps) > SMEM_BYTES:
        if stages > 2:
            stages -= 1
        elif unroll > 1:
            unroll //= 2
        elif warps > 1:
            warps //= 2
        else:
            return 0, unroll, warps
    return stages, unroll, warps


def _ring_at(wy, slot, u, v, lane, stages: int, u_count: int, vec: int):
    """Offset (halves) in the cp.async ring of lane `lane`'s vector v of chunk u in a warp's slot."""
    return (((wy * stages + slot) * u_count + u) * vec + v) * 256 + lane * 8


@T.macro
def _ring_issue(ring, w, tile, step, c, u_count, vec, wy, lane, stages, chunk_of, off):
    """cp.async one weight matrix's (or row tile's) vectors c * 2 + {0, 1} of one step into ring slot `slot`
    (16 bytes per lane and vector, straight from the tile layout; no registers held while in flight)."""
    for u in T.unroll(u_count):
        for h in T.unroll(2):
            T.ptx["cp.async.cg.shared.global"](
                ring.ptr_to([_ring_at(wy, step % stages, u, c * 2 + h, lane, stages, u_count, vec)]),
                w.ptr_to([tile, ((off + chunk_of(step, u, wy)) * 2 + h) * 32 * 8 + lane * 8]), 16)


@T.macro
def _ring_read(wreg, ring, wy, step, lane, stages, u_count, vec):
    """Step `step`'s weight vectors back from this warp's ring slot into registers, after its wait_group
    (each lane reads only the bytes it copied itself, so no barrier is needed)."""
    for u in T.unroll(u_count):
        for v2 in T.unroll(vec):
            for v in T.vectorized(8):
                wreg[(u * vec + v2) * 8 + v] = ring[_ring_at(wy, step % stages, u, v2, lane, stages, u_count, vec) + v]


@T.macro
def _share_partials(red, acc, nacc, wy, lane):
    """Each warp's partial tile into shared memory, for the fixed-order split-K sum."""
    for a in T.unroll(nacc):
        red[(wy * nacc + a) * 32 + lane] = acc[a]


@T.macro
def _sum_over_warps(red, tot, t_idx, slot, first, stride, count, nacc, lane):
    """tot[t_idx] = sum of partial accumulator `slot` of warps first, first + stride, ... (count of them: the
    warps that split K for one row tile), in warp order (deterministic)."""
    tot[t_idx] = T.float32(0)
    for i in T.unroll(count):
        tot[t_idx] = tot[t_idx] + red[((first + i * stride) * nacc + slot) * 32 + lane]


def _row_warps(request: int, warps: int, tiles: int) -> int:
    """Row tiles per block: the requested count, halved until it divides the warps and the row tiles."""
    rb = request
    while rb > 1 and (warps % rb or tiles % rb):
        rb //= 2
    return rb


def mn_plan(group_size: int, k_dim: int, swiglu: bool, max_tokens: int, knobs: GemvKnobs,
            direct: bool = True) -> GemvKnobs:
    """The knobs gemv_mn_body actually runs with: `knobs` fitted to the registers, shared memory and K (unroll,
    then warps, then stages shrink), row_warps and ksplit to what divides (direct kernels only; token tiles
    take neither, nor a ring). Knob sets with the same plan build the same kernel."""
    nw = 2 if swiglu else 1  # weight matrices
    nacc = nw * (max_tokens // 8) * 4
    ch = k_dim // CHUNK
    u, w = fit_registers(knobs.unroll, max_tokens), fit_partials(knobs.warps, nacc)
    s, u, w = _fit_ring(knobs.stages if direct else 0, u, w, nw * 2, lambda n: n * nacc * 128)
    rb = _row_warps(knobs.row_warps if direct else 1, w, group_size // ROWS)
    ks, kb = w // rb, knobs.ksplit if direct else 1
    while ch % (kb * u * ks):  # every step loads U full chunks per warp: no bounds branches between the loads
        u, ks, kb = (u // 2, ks, kb) if u > 1 else ((u, ks // 2, kb) if ks > 1 else (u, ks, kb // 2))
    return GemvKnobs(warps=ks * rb, unroll=u, rows=1, stages=s, row_warps=rb, ksplit=kb)


def k_plan(groups: int, n_dim: int, max_tokens: int, knobs: GemvKnobs, direct: bool = True) -> GemvKnobs:
    """The knobs gemv_k_body actually runs with (as mn_plan): rows to 1 unless it divides N's row tiles, then
    unroll, warps and stages fitted to the registers and shared memory (with the block's used-group list)."""
    rt = knobs.rows if n_dim % (ROWS * knobs.rows) == 0 else 1
    nacc = rt * (max_tokens // 8) * 4
    nwd = bit_words(max_tokens)
    list_bytes = lambda w: (groups + 1 + w + nwd * (groups + 1)) * 4  # noqa: E731  used list, scratch, bit sets
    u, w = fit_registers(knobs.unroll, max_tokens), fit_partials(knobs.warps, nacc, list_bytes(knobs.warps))
    s, u, w = _fit_ring(knobs.stages if direct else 0, u, w, rt * 2, lambda n: n * nacc * 128 + list_bytes(n))
    rb = _row_warps(knobs.row_warps if direct else 1, w, n_dim // (ROWS * rt))
    return GemvKnobs(warps=w, unroll=u, rows=rt, stages=s, row_warps=rb, ksplit=knobs.ksplit if direct else 1)


def token_tile(byk, splits: int):
    """Token tile of grid row byk (grid rows are token tiles x K splits; one of the two counts is 1)."""
    return byk // splits


def k_split(byk, splits: int):
    """K split of grid row byk."""
    return byk % splits


@T.macro
def _sum_k_splits(ws, out, mask, n, splits, max_tokens, cols, nw, swiglu, gate_size):
    """Second launch of a K-split kernel: out[t, c] = the sum of the `splits` fp32 partials of ws [splits,
    max_tokens, nw, cols] in split order (deterministic), with SwiGLU of (gate, up) when `swiglu`, and zero where
    the token skips column c's group when `gate_size` (the group size; 0: no gating)."""
    for bx in T.thread_binding((T.Cast("int32", n) * cols + 255) // 256, thread="blockIdx.x"):
        for tx in T.thread_binding(256, thread="threadIdx.x"):
            tot = T.decl_buffer((2,), "float32", scope="local")
            if bx * 256 + tx < T.Cast("int32", n) * cols:
                for c in T.unroll(nw):
                    tot[c] = T.float32(0)
                    for i in T.unroll(splits):
                        tot[c] = tot[c] + ws[((i * max_tokens + (bx * 256 + tx) // cols) * nw + c) * cols
                                             + (bx * 256 + tx) % cols]
                if gate_size > 0:
                    out[(bx * 256 + tx) // cols, (bx * 256 + tx) % cols] = T.Select(
                        mask[(bx * 256 + tx) // cols, (bx * 256 + tx) % cols // gate_size] != 0,
                        T.Cast("float16", (tot[0] * T.sigmoid(tot[0]) * tot[1]) if swiglu else tot[0]), T.float16(0))
                else:
                    out[(bx * 256 + tx) // cols, (bx * 256 + tx) % cols] = T.Cast("float16", tot[0])


def token_runs(sused, bits_at, groups, slot, row):
    """1 where tile row `row` runs listed group `slot` (its bit in that group's token bit set, which
    `used_groups` wrote from bits_at on)."""
    return T.bitwise_and(T.shift_right(sused[bits_at + row // 32 * (groups + 1) + slot], row % 32), 1)


def bit_words(max_tokens: int) -> int:
    """int32 words of a token bit set (bit t % 32 of word t // 32: token t runs the group)."""
    return (max_tokens + 31) // 32


def _list_slot(flag, part, groups):
    """Where this lane's group goes in the used list: its scanned position, or the scratch slot `groups`."""
    return T.Select(flag[0] != 0, part[0] + flag[1] - 1, groups)


@T.macro
def used_groups(mask, sused, n, wy, lane, groups, warps, max_tokens, bits_at, t0):
    """sused[:c] = the groups some token runs (ascending), sused[groups] = c, computed by the whole block from
    the mask [n, groups] rows t0 .. t0 + max_tokens - 1 (those below n): per group an OR over the tokens
    (branch-free clamped loads), then a block-wide exclusive scan (warp shuffles, one shared slot per warp).
    Decode kernels call this instead of waiting for a separate mask-reorder launch; the tile GEMM for its tile. sused: shared int32 [groups + 1 + warps], the last `warps`
    slots being per-warp scratch (one buffer, so the compiler cannot fold the scratch into the list), then
    from `bits_at` the token bit set of each listed group (word d of slot i at bits_at + d * (groups + 1) + i),
    so the K loop reads its intra-block skipping from shared memory instead of the mask."""
    flag = T.decl_buffer((2,), "int32", scope="local")  # used flag, inclusive warp scan
    words = T.decl_buffer((bit_words(max_tokens),), "uint32", scope="local")  # this group's token bit set
    part = T.decl_buffer((3,), "int32", scope="local")  # shuffle / prefix scratch, groups found so far
    mreg = T.decl_buffer((max_tokens,), "int32", scope="local")
    part[2] = 0
    for p in T.unroll((groups + 32 * warps - 1) // (32 * warps)):  # straight-line barriers
        for t in T.unroll(max_tokens):  # clamped loads in their own statements: no short-circuit, all in flight
            mreg[t] = mask[T.min(plus(t0, t), T.Cast("int32", n) - 1),
                           T.min(p * 32 * warps + wy * 32 + lane, groups - 1)]
        flag[0] = 0
        for d in T.unroll(bit_words(max_tokens)):
            words[d] = T.uint32(0)
            for b in T.unroll(min(32, max_tokens)):
                words[d] = words[d] | T.Select(
                    plus(t0, d * 32 + b) < T.Cast("int32", n) and p * 32 * warps + wy * 32 + lane < groups
                    and mreg[d * 32 + b] != 0, T.shift_left(T.uint32(1), T.Cast("uint32", b)), T.uint32(0))
            flag[0] = T.Select(words[d] != T.uint32(0), 1, flag[0])
        flag[1] = T.Select(flag[0] != 0, 1, 0)
        for sh in T.unroll(5):
            part[0] = T.tvm_warp_shuffle_up(T.tvm_warp_activemask(), flag[1], 1 << sh, 32, 32)
            flag[1] = flag[1] + T.Select(lane >= (1 << sh), part[0], 0)
        if lane == 31:
            sused[groups + 1 + wy] = flag[1]
        T.tvm_storage_sync("shared")
        part[0] = part[2]  # used groups of earlier passes and earlier warps
        for w in T.unroll(warps):
            part[0] = part[0] + T.Select(w < wy, sused[groups + 1 + w], 0)
            part[2] = part[2] + sused[groups + 1 + w]
        T.tvm_storage_sync("shared")  # barriers are all explicit: under the host-side ifs TVM cannot add one
        # unused groups write the scratch slot sused[groups] (set to the count below, after a barrier)
        sused[_list_slot(flag, part, groups)] = p * 32 * warps + wy * 32 + lane
        for d in T.unroll(bit_words(max_tokens)):
            sused[bits_at + d * (groups + 1) + _list_slot(flag, part, groups)] = T.reinterpret("int32", words[d])
        T.tvm_storage_sync("shared")
    if wy == 0 and lane == 0:
        sused[groups] = part[2]
    T.tvm_storage_sync("shared")


def gemv_mn_body(groups: int, group_size: int, k_dim: int, swiglu: bool, max_tokens: int,
                 knobs: GemvKnobs = GemvKnobs(), token_tiles: bool = False):
    """Macro (x, wg, wu, mask, counts, order, used, out, n), fp16, W in the "tc" layout [N / 16, 16 K].

    Decode (n <= max_tokens, 8 or 16): the tokens themselves are the mma columns and the mask is read
    directly (a token that skips the group is zeroed in the B operand; a group no token runs reads no
    weights); the reorder outputs are not used. With `token_tiles`, any n in grid rows of `max_tokens`
    sorted tokens of the reorder (a tile past the group's count only writes its zeros)."""
    G, gs, K = groups, group_size, k_dim
    N = G * gs
    NW = 2 if swiglu else 1
    MT = max_tokens
    NT = MT // 8
    CH = K // CHUNK
    NACC = NW * NT * 4
    direct = not token_tiles
    plan = mn_plan(group_size, k_dim, swiglu, max_tokens, knobs, direct)
    W, U, S, KB = plan.warps, plan.unroll, plan.stages, plan.ksplit  # KB: blocks splitting K, CHB chunks each
    TPG = gs // ROWS  # row tiles per group
    RB = plan.row_warps  # a block's row tiles, all of one group
    KS = W // RB  # warps splitting K per row tile
    CHB = CH // KB
    steps = CHB // (U * KS)
    VEC = NW * 2  # 16-byte weight vectors per lane and chunk

    def nn(n):
        return T.Cast("int32", n)

    def cnt(counts, g, n):
        return T.min(counts[g], nn(n))

    def chunk(s, u, wy):
        """K chunk of this warp's u-th load in step s, counted from its block's first chunk (gid[3]; K is a
        multiple of KB * U * KS chunks: no bounds checks)."""
        return (s * U + u) * KS + wy // RB

    def kcol(gid, s, u, wy, lane):
        return (gid[3] + chunk(s, u, wy)) * CHUNK + lane % 4 * 8

    def wvec(gid, s, u, wy, h, lane):
        """Offset in a weight row tile of this lane's 16-byte vector h of its u-th chunk in step s."""
        return (((gid[3] + chunk(s, u, wy)) * 2 + h) * 32 + lane) * 8

    def ytiles(n):
        return (nn(n) + MT - 1) // MT if token_tiles else 1


    def col_token(by, j, lane):
        """Token (decode) or reorder slot (token tiles) of this lane's B column j."""
        return by * MT + j * 8 + lane // 4

    def out_token(by, j, e, lane):
        """Token / slot of accumulator element e of column block j (C fragment: columns 2q, 2q + 1)."""
        return by * MT + j * 8 + lane % 4 * 2 + e % 2

    def x_row(order, counts, g, by, j, lane, n):
        if direct:
            return T.min(col_token(by, j, lane), nn(n) - 1)
        return order[g, T.min(col_token(by, j, lane), cnt(counts, g, n) - 1)]  # clamped to the last active

    @T.macro
    def keeps(keep, mask, counts, g, by, lane, n):
        """keep[j]: this lane's B column j counts (decode: the mask, loaded unconditionally, then tested)."""
        for j in T.unroll(NT):
            if direct:
                keep[j] = mask[T.min(col_token(by, j, lane), nn(n) - 1), g]
                keep[j] = T.Select(col_token(by, j, lane) < nn(n) and keep[j] != 0, 1, 0)
            else:
                keep[j] = T.Select(col_token(by, j, lane) < cnt(counts, g, n), 1, 0)

    def out_row(order, g, by, j, e, lane):
        return out_token(by, j, e, lane) if direct else order[g, out_token(by, j, e, lane)]

    def gated(mask, g, by, j, e, lane, value):
        """Decode writes every token: zero where the token skips the group (token tiles write active slots)."""
        if direct:
            return T.Select(mask[out_token(by, j, e, lane), g] != 0, value, T.float16(0))
        return value

    def zfirst(counts, g, by, n):
        """Slots zfirst .. zend of a token tile are tokens that skip the group: they get zeros."""
        return T.max(cnt(counts, g, n), by * MT)

    def zend(by, n):
        return T.min(nn(n), by * MT + MT)

    @T.macro
    def group_of(gid, mask, counts, used, bx, wy, n):
        """gid = (group, this warp's row tile, whether any token runs the group)."""
        if direct:
            gid[0] = bx * RB // TPG
            gid[2] = 0
            for t in T.unroll(MT):  # unconditional clamped loads (a short-circuit && would serialise them)
                gid[2] = gid[2] | T.Select(mask[T.min(t, nn(n) - 1), bx * RB // TPG] != 0, 1, 0)
        else:
            gid[0] = bx // TPG
            gid[2] = T.Select(cnt(counts, gid[0], n) > 0, 1, 0)
        gid[1] = gid[0] * TPG + bx * RB % TPG + wy % RB

    @T.macro
    def load_x(xreg, x, order, counts, gid, by, s, wy, lane, n):
        for u in T.unroll(U):
            for j in T.unroll(NT):
                for v in T.vectorized(8):
                    xreg[(u * NT + j) * 8 + v] = x[x_row(order, counts, gid[0], by, j, lane, n),
                                                   kcol(gid, s, u, wy, lane) + v]

    @T.macro
    def multiply(wreg, xreg, af, bf, acc, keep, zero):
        for u in T.unroll(U):
            for c in T.unroll(NW):
                for j in T.unroll(NT):
                    _mma_pair(wreg, xreg, af, bf, acc, (u * NW + c) * 16, (u * NT + j) * 8, (c * NT + j) * 4,
                              keep[j], zero)

    @T.macro
    def issue(ring, wg, wu, gid, step, wy, lane):
        _ring_issue(ring, wg, gid[1], step, 0, U, VEC, wy, lane, S, chunk, gid[3])
        if swiglu:
            _ring_issue(ring, wu, gid[1], step, 1, U, VEC, wy, lane, S, chunk, gid[3])
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def main_pass(x, wg, wu, mask, counts, order, used, out, ws, n):
        """The gated GEMM; with KB > 1 each K-split block writes its fp32 partials to `ws` instead of `out`."""
        for bx in T.thread_binding(N // (ROWS * RB), thread="blockIdx.x"):
            for byk in T.thread_binding(ytiles(n) * KB, thread="blockIdx.y"):  # token tile, K split (one of them 1)
                red = T.decl_buffer((W * NACC * 32,), "float32", scope="shared")
                ring = T.decl_buffer((max(1, W * S * U * VEC * 256),), "float16", scope="shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        gid = T.decl_buffer((4,), "int32", scope="local")  # group, row tile, has work, 1st chunk
                        group_of(gid, mask, counts, used, bx, wy, n)
                        gid[3] = k_split(byk, KB) * CHB
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
                        keeps(keep, mask, counts, gid[0], token_tile(byk, KB), lane, n)
                        if S > 0:  # weights through an S-deep cp.async ring, per warp (decode only)
                            if gid[2] != 0:
                                for st in T.unroll(S - 1):
                                    if st < steps:
                                        issue(ring, wg, wu, gid, st, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                for s in range(steps):
                                    if s + S - 1 < steps:
                                        issue(ring, wg, wu, gid, s + S - 1, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                    T.ptx["cp.async.wait_group"](S - 1)  # step s landed
                                    _ring_read(wreg, ring, wy, s, lane, S, U, VEC)
                                    load_x(xreg, x, order, counts, gid, token_tile(byk, KB), s, wy, lane, n)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        else:
                            if gid[2] != 0 and (direct or cnt(counts, gid[0], n) > token_tile(byk, KB) * MT):
                                for s in range(steps):
                                    for u in T.unroll(U):
                                        for h in T.unroll(2):
                                            for v in T.vectorized(8):
                                                wreg[(u * NW * 2 + h) * 8 + v] = \
                                                    wg[gid[1], wvec(gid, s, u, wy, h, lane) + v]
                                            if swiglu:
                                                for v in T.vectorized(8):
                                                    wreg[(u * NW * 2 + 2 + h) * 8 + v] = \
                                                        wu[gid[1], wvec(gid, s, u, wy, h, lane) + v]
                                    load_x(xreg, x, order, counts, gid, token_tile(byk, KB), s, wy, lane, n)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        if S > 0:  # the compiler may place `red` over the (now dead) ring
                            T.tvm_storage_sync("shared")
                        _share_partials(red, acc, NACC, wy, lane)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        tot = T.decl_buffer((2,), "float32", scope="local")
                        g = T.decl_buffer((3,), "int32", scope="local")
                        group_of(g, mask, counts, used, bx, wy, n)
                        if wy < RB:
                            for j in T.unroll(NT):
                                for e in T.unroll(4):
                                    if out_token(token_tile(byk, KB), j, e, lane) < (
                                            nn(n) if direct else cnt(counts, g[0], n)):
                                        for c in T.unroll(NW):
                                            _sum_over_warps(red, tot, c, (c * NT + j) * 4 + e, wy, RB, KS, NACC, lane)
                                        if KB == 1:
                                            out[out_row(order, g[0], token_tile(byk, KB), j, e, lane),
                                                g[1] * ROWS + lane // 4 + 8 * (e // 2)] = \
                                                gated(mask, g[0], token_tile(byk, KB), j, e, lane, T.Cast(
                                                    "float16",
                                                    (tot[0] * T.sigmoid(tot[0]) * tot[1]) if swiglu else tot[0]))
                                        else:  # direct kernels (token tile 0): partial sums, gated in the fix-up
                                            for c in T.unroll(NW):
                                                ws[((k_split(byk, KB) * MT + out_token(token_tile(byk, KB), j, e, lane))
                                                    * NW + c) * N + g[1] * ROWS + lane // 4 + 8 * (e // 2)] = tot[c]
                        if not direct:  # token tiles run one K split: grid row byk is the token tile
                            # this tile's tokens that skip the group: zeros (all threads share the (token, row) pairs)
                            for i in range((T.max(zend(byk, n) - zfirst(counts, g[0], byk, n), 0) * ROWS + 32 * W - 1)
                                           // (32 * W)):
                                if i * 32 * W + wy * 32 + lane < (zend(byk, n) - zfirst(counts, g[0], byk, n)) * ROWS:
                                    out[order[g[0],
                                              zfirst(counts, g[0], byk, n) + (i * 32 * W + wy * 32 + lane) // ROWS],
                                        g[1] * ROWS + (i * 32 * W + wy * 32 + lane) % ROWS] = T.float16(0)

    @T.macro
    def body(x, wg, wu, mask, counts, order, used, out, n):
        main_pass(x, wg, wu, mask, counts, order, used, out, out, n)

    @T.macro
    def body_split(x, wg, wu, mask, counts, order, used, out, n):
        ws = T.alloc_buffer((KB * MT * NW * N,), "float32", scope="global")  # [KB, MT, NW, N] partials
        main_pass(x, wg, wu, mask, counts, order, used, out, ws, n)
        _sum_k_splits(ws, out, mask, n, KB, MT, N, NW, swiglu, gs)  # then SwiGLU and the token's gating

    return body_split if KB > 1 else body


def gemv_k_body(groups: int, group_size: int, n_dim: int, max_tokens: int, knobs: GemvKnobs = GemvKnobs(),
                token_tiles: bool = False):
    """Macro (a, w, mask, used, out, n), fp16, W [N, K = G * gs] in the "tc" layout [N / 16, 16 K]: for
    n <= max_tokens (8 to 64), or, with `token_tiles`, any n in grid rows of `max_tokens` tokens. Each block
    builds the list of groups its tokens run from the mask (decode needs no reorder launch)."""
    G, gs, N = groups, group_size, n_dim
    MT = max_tokens
    NT = MT // 8
    LPG = gs // CHUNK  # chunks per group slice
    NWD = bit_words(MT)
    direct = not token_tiles
    plan = k_plan(groups, n_dim, max_tokens, knobs, direct)
    W, U, RT, S, KB = plan.warps, plan.unroll, plan.rows, plan.stages, plan.ksplit  # KB: blocks splitting used K
    RB = plan.row_warps  # a block's row-tile groups
    KS = W // RB  # warps splitting K per row-tile group
    NACC = RT * NT * 4
    VEC = RT * 2  # 16-byte weight vectors per lane and chunk
    BITS = G + 1 + W  # where the decode token bit sets start in the shared list buffer

    def chunk(s, u, wy):
        """This block's u-th K chunk of warp wy in step s, counted from the block's first used chunk."""
        return (s * U + u) * KS + wy // RB

    def used_chunk(s, u, wy, nch):
        """Index into the used chunks (nch = [this block's count, its first]); past the count, the last one."""
        return (nch[1] if KB > 1 else 0) + T.min(chunk(s, u, wy), nch[0] - 1)

    def tile(bx, wy, rt):
        """Weight row tile rt of this warp's row-tile group."""
        return (bx * RB + wy % RB) * RT + rt

    def kchunk(g, s, u, wy, nch):
        """K chunk of this lane's u-th load in group g; chunks past the used ones repeat the last (zeroed)."""
        return g * LPG + used_chunk(s, u, wy, nch) % LPG

    def kcol(g, s, u, wy, lane, nch):
        return kchunk(g, s, u, wy, nch) * CHUNK + lane % 4 * 8

    def ytiles(n):
        return (T.Cast("int32", n) + MT - 1) // MT if token_tiles else 1

    def tok(by, j, lane, n):
        return T.min(by * MT + j * 8 + lane // 4, T.Cast("int32", n) - 1)

    def nsteps(nch):
        """Steps of U chunks per warp that cover this block's nch[0] used K chunks."""
        return (nch[0] + U * KS - 1) // (U * KS)

    @T.macro
    def keeps(keep, mask, sused, g, s, u, wy, by, j, lane, n, nch):
        """keep[u, j]: this lane's token column j counts for the u-th chunk (decode: the shared token bit
        sets; token tiles: the mask, loaded unconditionally and then tested)."""
        if direct:
            keep[u * NT + j] = T.bitwise_and(T.shift_right(
                sused[BITS + j // 4 * (G + 1) + used_chunk(s, u, wy, nch) // LPG], j % 4 * 8 + lane // 4), 1)
        else:
            keep[u * NT + j] = mask[tok(by, j, lane, n), g]
        keep[u * NT + j] = T.Select(chunk(s, u, wy) < nch[0] and by * MT + j * 8 + lane // 4 < T.Cast("int32", n)
                                    and keep[u * NT + j] != 0, 1, 0)

    def ring_chunk(sused, s, u, wy, nch):
        """Tile-layout K chunk of step s's u-th load (through the used-group list)."""
        return sused[used_chunk(s, u, wy, nch) // LPG] * LPG + used_chunk(s, u, wy, nch) % LPG

    @T.macro
    def issue(ring, w, sused, nch, bx, step, wy, lane):
        """cp.async step `step`'s weight vectors of the RT row tiles into its ring slot (like _ring_issue,
        with the K chunk taken through the used-group list)."""
        for u in T.unroll(U):
            for rt in T.unroll(RT):
                for h in T.unroll(2):
                    T.ptx["cp.async.cg.shared.global"](
                        ring.ptr_to([_ring_at(wy, step % S, u, rt * 2 + h, lane, S, U, VEC)]),
                        w.ptr_to([tile(bx, wy, rt), ((ring_chunk(sused, step, u, wy, nch) * 2 + h) * 32 + lane) * 8]),
                        16)
        T.ptx["cp.async.commit_group"]()

    @T.macro
    def load_ax(xreg, keep, greg, a, mask, sused, by, s, wy, lane, n, nch):
        """Activations and token masks of step s (the weights come separately)."""
        for u in T.unroll(U):
            greg[u] = sused[used_chunk(s, u, wy, nch) // LPG]
            for j in T.unroll(NT):
                for v in T.vectorized(8):
                    xreg[(u * NT + j) * 8 + v] = a[tok(by, j, lane, n), kcol(greg[u], s, u, wy, lane, nch) + v]
                keeps(keep, mask, sused, greg[u], s, u, wy, by, j, lane, n, nch)

    @T.macro
    def multiply(wreg, xreg, af, bf, acc, keep, zero):
        for u in T.unroll(U):
            for rt in T.unroll(RT):
                for j in T.unroll(NT):
                    _mma_pair(wreg, xreg, af, bf, acc, (u * RT + rt) * 16, (u * NT + j) * 8, (rt * NT + j) * 4,
                              keep[u * NT + j], zero)

    @T.macro
    def main_pass(a, w, mask, used, out, ws, n):
        """The gated GEMM; with KB > 1 each K-split block writes its fp32 partial to `ws` instead of `out`."""
        for bx in T.thread_binding(N // (ROWS * RT * RB), thread="blockIdx.x"):
            for byk in T.thread_binding(ytiles(n) * KB, thread="blockIdx.y"):  # token tile, K split (one of them 1)
                red = T.decl_buffer((W * NACC * 32,), "float32", scope="shared")
                # the used-group list, read every chunk (+ scratch for building it, + decode token bit sets)
                sused = T.decl_buffer((BITS + NWD * (G + 1),), "int32", scope="shared")
                ring = T.decl_buffer((max(1, W * S * U * VEC * 256),), "float16", scope="shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        # the groups this block's tokens run (token tiles: tile byk's; decode: all n <= MT)
                        used_groups(mask, sused, n, wy, lane, G, W, MT, BITS, byk // KB * MT)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        acc = T.decl_buffer((NACC,), "float32", scope="local")
                        wreg = T.decl_buffer((U * RT * 16,), "float16", scope="local")
                        xreg = T.decl_buffer((U * NT * 8,), "float16", scope="local")
                        af = T.decl_buffer((8,), "float16", scope="local")
                        bf = T.decl_buffer((4,), "float16", scope="local")
                        greg = T.decl_buffer((U,), "int32", scope="local")
                        keep = T.decl_buffer((U * NT,), "int32", scope="local")
                        zero = T.decl_buffer((1,), "float16", scope="local")
                        zero[0] = T.float16(0)
                        nch = T.decl_buffer((2,), "int32", scope="local")  # this block's used chunks, first
                        nch[1] = (sused[G] * LPG + KB - 1) // KB * k_split(byk, KB)
                        nch[0] = T.max(T.min((sused[G] * LPG + KB - 1) // KB, sused[G] * LPG - nch[1]), 0)
                        for i in T.unroll(NACC):
                            acc[i] = T.float32(0)
                        if S > 0:  # weights through an S-deep cp.async ring, per warp (decode only)
                            if nch[0] > 0:
                                for st in T.unroll(S - 1):
                                    if st < nsteps(nch):
                                        issue(ring, w, sused, nch, bx, st, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                for s in range(nsteps(nch)):
                                    if s + S - 1 < nsteps(nch):
                                        issue(ring, w, sused, nch, bx, s + S - 1, wy, lane)
                                    else:
                                        T.ptx["cp.async.commit_group"]()
                                    T.ptx["cp.async.wait_group"](S - 1)  # step s landed
                                    _ring_read(wreg, ring, wy, s, lane, S, U, VEC)
                                    load_ax(xreg, keep, greg, a, mask, sused, token_tile(byk, KB), s, wy, lane, n, nch)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        else:
                            if nch[0] > 0:
                                for s in range(nsteps(nch)):
                                    for u in T.unroll(U):
                                        for rt in T.unroll(RT):
                                            for h in T.unroll(2):
                                                for v in T.vectorized(8):
                                                    wreg[((u * RT + rt) * 2 + h) * 8 + v] = w[tile(bx, wy, rt), (
                                                        (kchunk(sused[used_chunk(s, u, wy, nch) // LPG], s, u, wy, nch)
                                                         * 2 + h) * 32 + lane) * 8 + v]
                                    load_ax(xreg, keep, greg, a, mask, sused, token_tile(byk, KB), s, wy, lane, n,
                                            nch)
                                    multiply(wreg, xreg, af, bf, acc, keep, zero)
                        # the compiler may place `red` over the (now dead) list: every warp must be done reading it
                        T.tvm_storage_sync("shared")
                        _share_partials(red, acc, NACC, wy, lane)
                T.tvm_storage_sync("shared")
                for wy in T.thread_binding(W, thread="threadIdx.y"):
                    for lane in T.thread_binding(32, thread="threadIdx.x"):
                        tot = T.decl_buffer((1,), "float32", scope="local")
                        if wy < RB:
                            for rt in T.unroll(RT):
                                for j in T.unroll(NT):
                                    for e in T.unroll(4):
                                        if token_tile(byk, KB) * MT + j * 8 + lane % 4 * 2 + e % 2 < T.Cast("int32", n):
                                            _sum_over_warps(red, tot, 0, (rt * NT + j) * 4 + e, wy, RB, KS, NACC, lane)
                                            if KB == 1:
                                                out[token_tile(byk, KB) * MT + j * 8 + lane % 4 * 2 + e % 2,
                                                    tile(bx, wy, rt) * ROWS + lane // 4 + 8 * (e // 2)] = \
                                                    T.Cast("float16", tot[0])
                                            else:  # direct kernels: token tile 0
                                                ws[(k_split(byk, KB) * MT + j * 8 + lane % 4 * 2 + e % 2) * N
                                                   + tile(bx, wy, rt) * ROWS + lane // 4 + 8 * (e // 2)] = tot[0]

    @T.macro
    def body(a, w, mask, used, out, n):
        main_pass(a, w, mask, used, out, out, n)

    @T.macro
    def body_split(a, w, mask, used, out, n):
        ws = T.alloc_buffer((KB * MT * N,), "float32", scope="global")  # [KB, MT, N] partials
        main_pass(a, w, mask, used, out, ws, n)
        _sum_k_splits(ws, out, mask, n, KB, MT, N, 1, False, 0)

    return body_split if KB > 1 else body
