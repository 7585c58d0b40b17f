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

This module holds their shared parts (fragments, the cp.async ring, the split-K sums, the plans that fit knobs to
registers and shared memory, the used-group list); the kernel bodies are in gemv_mn.py and gemv_k.py.

Fragment mapping (m16n8k16): lane = 4 * g + q holds, for one 32-wide K chunk, the 16-byte vectors
W[row g, 8q:8q+8], W[row g+8, 8q:8q+8] and x[token g, 8q:8q+8]. Physical elements 8q + {0,1,2,3} play the
logical k's {2q, 2q+1, 2q+8, 2q+9} of the first mma and 8q + {4..7} those of the second; A and B use the
same permutation, so the dot products are unchanged.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..knobs import DECODE_BUCKETS, DIRECT_TOKENS, DecodeKnobs, GemvKnobs, bucket_tokens
from .dispatch import token_dispatch
from .warp_ops import plus


TILE_TOKENS = 64  # sorted tokens per grid row of the tensor-core kernels for more tokens
ROWS = 16  # output rows per block (the mma M)
CHUNK = 32  # K elements per warp step (4 lanes x 8 halves)
SMEM_BYTES = 48 * 1024  # static shared memory per block


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
def mma_pair(wreg, xreg, af, bf, acc, w_off, x_off, acc_off, keep, zero):
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


def ring_at(wy, slot, u, v, lane, stages: int, u_count: int, vec: int):
    """Offset (halves) in the cp.async ring of lane `lane`'s vector v of chunk u in a warp's slot."""
    return (((wy * stages + slot) * u_count + u) * vec + v) * 256 + lane * 8


@T.macro
def ring_issue(ring, w, tile, step, c, u_count, vec, wy, lane, stages, chunk_of, off):
    """cp.async one weight matrix's (or row tile's) vectors c * 2 + {0, 1} of one step into ring slot `slot`
    (16 bytes per lane and vector, straight from the tile layout; no registers held while in flight)."""
    for u in T.unroll(u_count):
        for h in T.unroll(2):
            T.ptx["cp.async.cg.shared.global"](
                ring.ptr_to([ring_at(wy, step % stages, u, c * 2 + h, lane, stages, u_count, vec)]),
                w.ptr_to([tile, ((off + chunk_of(step, u, wy)) * 2 + h) * 32 * 8 + lane * 8]), 16)


@T.macro
def ring_read(wreg, ring, wy, step, lane, stages, u_count, vec):
    """Step `step`'s weight vectors back from this warp's ring slot into registers, after its wait_group
    (each lane reads only the bytes it copied itself, so no barrier is needed)."""
    for u in T.unroll(u_count):
        for v2 in T.unroll(vec):
            for v in T.vectorized(8):
                wreg[(u * vec + v2) * 8 + v] = ring[ring_at(wy, step % stages, u, v2, lane, stages, u_count, vec) + v]


@T.macro
def share_partials(red, acc, nacc, wy, lane):
    """Each warp's partial tile into shared memory, for the fixed-order split-K sum."""
    for a in T.unroll(nacc):
        red[(wy * nacc + a) * 32 + lane] = acc[a]


@T.macro
def sum_over_warps(red, tot, t_idx, slot, first, stride, count, nacc, lane):
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
def sum_k_splits(ws, out, mask, n, splits, max_tokens, cols, nw, swiglu, gate_size):
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
