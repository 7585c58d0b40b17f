"""Relax passes of wide-tvm: recognise router-gated layers and lower them to block-sparse kernels."""

from .blas_dispatch import DispatchDenseMatmuls, DispatchedMatmul
from .lower_gated import GatedLayer, GatedPlan, LowerGatedLayers
from .pipeline import wide_pipeline

__all__ = ["DispatchDenseMatmuls", "DispatchedMatmul", "GatedLayer", "GatedPlan", "LowerGatedLayers", "wide_pipeline"]
