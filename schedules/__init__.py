"""TensorIR kernels of wide-tvm, each one function with its CUDA and CPU schedule beside it."""

from .gemm_k import gemm_k
from .gemm_mn import gemm_mn
from .mask_reorder import mask_reorder
from .tiles import TileConfig, tile_config


def gated_kernel(kind: str, groups: int, group_size: int, dim: int, dtype: str, layout: str, target_kind: str,
                 **knobs):
    """The kernel of a kernel-knob kind (kernel_knobs.kernel_key's): gemm_mn_swiglu, gemm_mn (dim = K) or
    gemm_k (dim = N), with `knobs` as gemm_mn / gemm_k take them."""
    if kind == "gemm_k":
        return gemm_k(groups, group_size, dim, dtype, layout, target_kind, **knobs)
    return gemm_mn(groups, group_size, dim, dtype, layout, kind == "gemm_mn_swiglu", target_kind, **knobs)


__all__ = ["gated_kernel", "gemm_k", "gemm_mn", "mask_reorder", "TileConfig", "tile_config"]
