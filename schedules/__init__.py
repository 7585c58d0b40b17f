"""TensorIR kernels of wide-tvm, each one function with its CUDA and CPU schedule beside it."""

from ..knobs import direct_bound
from ..knobs import reorder_free_bound
from .gemm_k import gemm_k
from .gemm_mn import gemm_mn
from .mask_reorder import mask_reorder
from .tiles import TileConfig, tile_config


def gated_kernel(kind: str, groups: int, group_size: int, dim: int, dtype: str, layout: str, target_kind: str,
                 **knobs):
    """The kernel of a kernel-knob kind (kernel_spec.kernel_key's): gemm_mn_swiglu, gemm_mn (dim = K) or
    gemm_k (dim = N), with `knobs` as gemm_mn / gemm_k take them."""
    if kind == "gemm_k":
        return gemm_k(groups, group_size, dim, dtype, layout, target_kind, **knobs)
    return gemm_mn(groups, group_size, dim, dtype, layout, kind == "gemm_mn_swiglu", target_kind, **knobs)


def gemm_mn_reorder_bound(tile_knobs: tuple) -> int:
    """Token counts up to which no kernel of a tensor-core gemm_mn with these many-token knobs (one per tile
    bucket) reads the mask reorder: its direct kernels' (knobs.direct_bound, which for gemm_mn does not depend on the
    group size) and those that sort their tokens themselves."""
    return max(direct_bound("gemm_mn", tile_knobs, 0), reorder_free_bound(tile_knobs))


__all__ = ["gated_kernel", "gemm_k", "gemm_mn", "gemm_mn_reorder_bound", "mask_reorder", "TileConfig",
           "tile_config"]
