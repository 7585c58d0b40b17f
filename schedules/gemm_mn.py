"""gemm_mn: output-group pruning (gate/up with SwiGLU fused in the epilogue; Q projection).

out[t, g*gs:(g+1)*gs] = epilogue(x[t] @ W_g) for tokens active in group g, and 0 for the others.
Tokens are walked in the mask-reorder order of each group; a tile of BM sorted tokens that lies past
the group's active count holds no active token, so it only writes its zeros and computes nothing.
Every output element is written by exactly one thread: deterministic.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..kernel_spec import supports_mn
from ..knobs import DEFAULT_DECODE, DecodeKnobs, direct_bound
from ..knobs import DEFAULT_TILES
from ..weight_layout import stored_shape
from . import cpu_gemm
from .gemv import PREFILL_KNOBS, TILE_TOKENS, tensor_core_kernels
from .gemv_mn import gemv_mn_body
from .tile_gemm import many_token_kernels, tile_mn_body
from .tiles import TileConfig, cpu_default_tile, cpu_kernels, tile_config, tile_dims
from .weights import check_layout, weight_loader
from .wgmma_mn import wgmma_mn_body


def gemm_mn(groups: int, group_size: int, k_dim: int, dtype: str, w_layout: str, swiglu: bool,
            target_kind: str, decode_knobs: DecodeKnobs = DEFAULT_DECODE,
            tile_knobs: tuple = DEFAULT_TILES,
            cpu_tile: TileConfig | tuple | None = None) -> tirx.PrimFunc:
    """x [n, K], w (and w_up for SwiGLU) [N, K] ("nk"), [K, N] ("kn") or tensor-core tiles ("tc", CUDA fp16),
    mask [n, G], counts [G], order [G, n], used [G + 1] (the mask reorder) -> out [n, N]. The tensor-core
    direct kernels (up to knobs.direct_bound tokens) read the mask itself; every other path walks the reorder."""
    G, gs, K = groups, group_size, k_dim
    N = G * gs
    check_layout(w_layout, target_kind, supports_mn(gs, K, dtype))
    wshape = stored_shape(w_layout, N, K)
    load_w = weight_loader(w_layout)
    if target_kind == "cuda":
        BM, BN = tile_dims(tile_config(target_kind, gs), gs, "the group size")
        n_col_tiles = gs // BN

    @T.macro
    def dot_store(x, wg, wu, out, t, col):
        acc = T.decl_buffer((2,), "float32", scope="local")
        acc[0] = T.float32(0)
        acc[1] = T.float32(0)
        for k in range(K):
            xv = T.Cast("float32", x[t, k])
            acc[0] = acc[0] + xv * T.Cast("float32", load_w(wg, k, col))
            if swiglu:
                acc[1] = acc[1] + xv * T.Cast("float32", load_w(wu, k, col))
        if swiglu:
            out[t, col] = T.Cast(dtype, acc[0] * T.sigmoid(acc[0]) * acc[1])
        else:
            out[t, col] = T.Cast(dtype, acc[0])

    if target_kind == "cuda":
        small = w_layout == "tc"  # the tensor-core kernels; SIMT tiles for "nk" / "kn"
        run_tc = tensor_core_kernels(
            "gemm_mn", decode_knobs, lambda mt, knobs: gemv_mn_body(G, gs, K, swiglu, mt, knobs),
            many_token_kernels(tile_knobs, lambda: gemv_mn_body(G, gs, K, swiglu, TILE_TOKENS, PREFILL_KNOBS, True),
                               lambda k: tile_mn_body(G, gs, K, swiglu, k),
                               lambda k: wgmma_mn_body(G, gs, K, swiglu, k)),
            direct_bound("gemm_mn", tile_knobs, gs)) if small else None

        @T.macro
        def tiled(x, wg, wu, mask, counts, order, used, out, n):
            for bx in T.thread_binding(G * ((n + BM - 1) // BM), thread="blockIdx.x"):
                for by in T.thread_binding(n_col_tiles, thread="blockIdx.y"):
                    for ty in T.thread_binding(BM, thread="threadIdx.y"):
                        for tx in T.thread_binding(BN, thread="threadIdx.x"):
                            g = bx // ((n + BM - 1) // BM)
                            i = bx % ((n + BM - 1) // BM) * BM + ty
                            col = g * gs + by * BN + tx
                            if i < n:
                                t = T.Cast("int64", order[g, i])
                                if i < T.Cast("int64", counts[g]):
                                    dot_store(x, wg, wu, out, t, col)
                                else:
                                    out[t, col] = T.Cast(dtype, 0)

        @T.macro
        def dispatch(x, wg, wu, mask, counts, order, used, out, n):
            if small:  # decided on the host: one kernel launch either way
                run_tc(n, x, wg, wu, mask, counts, order, used, out)
            else:
                tiled(x, wg, wu, mask, counts, order, used, out, n)


    if target_kind != "cuda":
        run_cpu = cpu_kernels(cpu_tile, cpu_default_tile(w_layout == "nk", gs),
                              lambda tile: cpu_gemm.mn_body(G, gs, K, swiglu, dtype, w_layout, tile))

        @T.macro
        def dispatch(x, wg, wu, mask, counts, order, used, out, n):
            run_cpu(n, x, wg, wu, counts, order, out)

    @T.prim_func(private=True)
    def gemm_mn(x_h: T.handle, wg_h: T.handle, wu_h: T.handle, mask_h: T.handle, counts_h: T.handle,
                order_h: T.handle, used_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, K), dtype)
        wg = T.match_buffer(wg_h, wshape, dtype)
        wu = T.match_buffer(wu_h, wshape, dtype)
        mask = T.match_buffer(mask_h, (n, G), "int32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        used = T.match_buffer(used_h, (G + 1,), "int32")
        out = T.match_buffer(out_h, (n, N), dtype)
        dispatch(x, wg, wu, mask, counts, order, used, out, n)

    return gemm_mn

