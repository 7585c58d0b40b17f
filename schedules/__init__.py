"""TensorIR kernels of wide-tvm, each one function with its CUDA and CPU schedule beside it."""

from .gemm_k import gemm_k
from .gemm_mn import gemm_mn
from .mask_reorder import mask_reorder
from .tiles import TileConfig, tile_config

__all__ = ["gemm_k", "gemm_mn", "mask_reorder", "TileConfig", "tile_config"]
