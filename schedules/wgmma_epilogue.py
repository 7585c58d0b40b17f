"""The wgmma GEMMs' epilogues: how a tile's accumulators reach `out`, and the second launches.

* `staged_tile_store`: the fp16 tile through the ring (rows padded by 16 bytes), then 16-byte stores of whole rows
  instead of the accumulator fragments' 2-byte ones;
* `zero_skipped`: zeros wherever a token skips a channel's group (gemm_mn past SORT_TOKENS), 16 bytes a thread;
* `sum_mn_splits` / `sum_k_partials`: K-split fp32 partials summed in split order (deterministic), SwiGLU applied.

Accumulator layout (wgmma's D fragment): element 4 j + e of thread tid is row acc_row(tid, e) = 16 (tid / 32) +
(tid % 32) / 4 + 8 (e / 2), column acc_col(j, tid, e) = 8 j + 2 (tid % 4) + e % 2; e.g. thread 37, j = 1, e = 3 holds
row 16 + 1 + 8 = 25, column 8 + 2 + 1 = 11.
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..knobs import WgmmaKnobs
from .wgmma_ring import Ring


def silu_mul(gate, up):
    """SwiGLU's output from fp32 gate and up: SiLU(gate) x up."""
    return gate * T.sigmoid(gate) * up


def acc_row(tid, e):
    """Tile row of accumulator element 4 j + e (D fragment: warp w holds rows 16 w + lane / 4 (+ 8 for e >= 2))."""
    return tid // 32 * 16 + tid % 32 // 4 + e // 2 * 8


def acc_col(j, tid, e):
    """Tile column of accumulator element 4 j + e (columns 8 j + 2 (lane % 4) + e % 2)."""
    return j * 8 + tid % 4 * 2 + e % 2


def staged_tile_store(knobs: WgmmaKnobs, nb: int, ring: Ring, cols: int | None = None, value=None, out_row=None):
    """Macro (xs, base, acc, tid, out, row0, col0, n, *rows): the block's fp16 tile (`tokens` rows x `cols` columns,
    nb by default, of value(acc, j, e): the fp32 of accumulator column acc_col(j, tid, e), acc[4 j + e] by
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
                    if row0 + acc_row(tid, e) < n:
                        xs[base[0] // 2 + acc_row(tid, e) * pitch + acc_col(j, tid, e)] = T.Cast(
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


# The second launches over gemm_mn's out [n, N] (zero_skipped, sum_mn_splits): 256 threads a block, each owning
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


def zero_skipped(out, mask, n, groups: int, group_size: int):
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


def sum_mn_splits(ws, out, mask, n, splits: int, groups: int, group_size: int, swiglu: bool):
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
                                "float16", silu_mul(tot[v], tot[V + v]) if swiglu else tot[v])
                    else:
                        for v in T.unroll(V):
                            out[_unit_token(bx, tx, N, V), _unit_channel(bx, tx, N, V) + v] = T.float16(0)

    return run(ws, out, mask, n)


def sum_k_partials(ws, out, n, splits, cols: int):
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
