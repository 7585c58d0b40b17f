"""gemm_k: reduction-group pruning (down projection; O projection of gated attention).

out[t] = sum over groups g active for token t of a[t, g*gs:(g+1)*gs] @ W[g*gs:(g+1)*gs, :].
CUDA: tensor-core kernels over the used groups' K-slices (schedules/gemv.py) for fp16 "tc" weights, else
SIMT tiles of BM consecutive tokens x BN columns that skip a group's K-slice when no token of the tile
runs it. CPU: with [K, N] weights, a task owns BN columns and walks each used group's active tokens from
the mask reorder (work = active (token, group) pairs); with [N, K] weights, tiles as on CUDA.
The reduction runs over groups in a fixed order inside one thread: no atomics, deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..kernel_spec import supports_k
from ..knobs import DEFAULT_DECODE, DecodeKnobs, direct_bound
from ..knobs import DEFAULT_TILES
from ..weight_layout import stored_shape
from . import cpu_gemm
from .gemv import PREFILL_KNOBS, TILE_TOKENS, tensor_core_kernels
from .gemv_k import gemv_k_body
from .tile_gemm import many_token_kernels, tile_k_body
from .tiles import TileConfig, cpu_default_tile, cpu_kernels, tile_config, tile_dims
from .weights import check_layout, weight_loader
from .wgmma_k import wgmma_k_body


def gemm_k(groups: int, group_size: int, n_dim: int, dtype: str, w_layout: str,
           target_kind: str, decode_knobs: DecodeKnobs = DEFAULT_DECODE,
           tile_knobs: tuple = DEFAULT_TILES,
           cpu_tile: TileConfig | tuple | None = None) -> tirx.PrimFunc:
    """a [n, K=G*gs], w [N, K] ("nk"), [K, N] ("kn") or tensor-core tiles ("tc", CUDA fp16), mask [n, G],
    counts [G], order [G, n], used [G+1] (mask reorder) -> out [n, N]."""
    G, gs, N = groups, group_size, n_dim
    K = G * gs
    check_layout(w_layout, target_kind, supports_k(gs, N, dtype))
    wshape = stored_shape(w_layout, N, K)
    load_w = weight_loader(w_layout)

    def tile_active(BM: int):
        """Macro (mask, row0, g, n, flag): flag[0] = whether any of tokens row0 .. row0 + BM - 1 runs group g."""

        @T.macro
        def run(mask, row0, g, n, flag):
            flag[0] = 0
            for r in range(BM):
                if row0 + r < n:
                    flag[0] = T.max(flag[0], mask[row0 + r, g])

        return run

    if target_kind == "cuda":
        BM, BN = tile_dims(tile_config(target_kind, N), N, "the output width")
        tile_any = tile_active(BM)
        small = w_layout == "tc"  # the tensor-core kernels; SIMT tiles for "nk" / "kn"
        run_tc = tensor_core_kernels(
            "gemm_k", decode_knobs, lambda mt, knobs: gemv_k_body(G, gs, N, mt, knobs),
            many_token_kernels(tile_knobs, lambda: gemv_k_body(G, gs, N, TILE_TOKENS, PREFILL_KNOBS, True),
                               lambda k: tile_k_body(G, gs, N, k), lambda k: wgmma_k_body(G, gs, N, k)),
            direct_bound("gemm_k", tile_knobs, gs)) if small else None

        @T.macro
        def tiled(a, w, mask, used, out, n):
            for bx in T.thread_binding((n + BM - 1) // BM, thread="blockIdx.x"):
                for by in T.thread_binding(N // BN, thread="blockIdx.y"):
                    for ty in T.thread_binding(BM, thread="threadIdx.y"):
                        for tx in T.thread_binding(BN, thread="threadIdx.x"):
                            acc = T.decl_buffer((1,), "float32", scope="local")
                            flag = T.decl_buffer((1,), "int32", scope="local")
                            acc[0] = T.float32(0)
                            for g in range(G):
                                tile_any(mask, bx * BM, g, n, flag)
                                if flag[0] != 0:
                                    if bx * BM + ty < n:
                                        if mask[bx * BM + ty, g] != 0:
                                            for k in range(gs):
                                                acc[0] = acc[0] + T.Cast("float32", a[bx * BM + ty, g * gs + k]) * \
                                                    T.Cast("float32", load_w(w, g * gs + k, by * BN + tx))
                            if bx * BM + ty < n:
                                out[bx * BM + ty, by * BN + tx] = T.Cast(dtype, acc[0])

        @T.macro
        def dispatch(a, w, mask, counts, order, used, out, n):
            if small:  # decided on the host: one kernel launch either way
                run_tc(n, a, w, mask, used, out)
            else:
                tiled(a, w, mask, used, out, n)


    if target_kind != "cuda":
        run_cpu = cpu_kernels(cpu_tile, cpu_default_tile(False, N),
                              lambda tile: cpu_gemm.k_body(G, gs, N, dtype, w_layout, tile, tile_active))

        @T.macro
        def dispatch(a, w, mask, counts, order, used, out, n):
            run_cpu(n, a, w, mask, counts, order, used, out)

    @T.prim_func(private=True)
    def gemm_k(a_h: T.handle, w_h: T.handle, mask_h: T.handle, counts_h: T.handle, order_h: T.handle,
               used_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        a = T.match_buffer(a_h, (n, K), dtype)
        w = T.match_buffer(w_h, wshape, dtype)
        mask = T.match_buffer(mask_h, (n, G), "int32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        used = T.match_buffer(used_h, (G + 1,), "int32")
        out = T.match_buffer(out_h, (n, N), dtype)
        dispatch(a, w, mask, counts, order, used, out, n)

    return gemm_k
