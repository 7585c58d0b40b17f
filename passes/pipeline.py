"""The wide-tvm compilation pipeline: one visible, ordered list of passes per target kind.

Modelled on TVM's relax/backend/cuda/pipeline.py. Gated layers are lowered first; everything else
(layers without gates, routers, attention) goes to the vendor BLAS where it is a dense matmul
(`blas_dispatch.py`), and through TVM's own legalization and scheduling where it is anything else.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend.cuda import pipeline as cuda_pipeline

from .attention_matmuls import DecomposeAttention
from .blas_dispatch import DispatchDenseMatmuls
from .legalize import WIDE_LEGALIZATIONS
from .lower_gated import LowerGatedLayers
from .weight_matmul import FuseWeightTranspose


def _gpu_default_schedule() -> tvm.transform.Pass:
    from tvm.s_tir import dlight as dl

    return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                   dl.gpu.GeneralReduction(), dl.gpu.Fallback())


def wide_passes(target: tvm.target.Target, lower: LowerGatedLayers, tuning_log: str | None,
                blas: DispatchDenseMatmuls | None = None, generation=None) -> list:
    """The passes, in order, that turn an imported WIDE model into a VM-ready module for `target`. `blas`: the
    dense-matmul dispatch to the vendor BLAS extern (None: TVM's own kernels for them). `generation`: an
    AddGeneration (passes/kv_cache_create.py) to add the paged-KV-cache and sampling entry points, or None."""
    is_gpu = target.kind.name == "cuda"
    passes = [
        lower,                                                        # gated layers -> block-sparse kernels
        *([generation] if generation is not None else []),           # main's attention on a paged KV cache too
        *([DecomposeAttention(), blas] if blas is not None else []),  # attention's matmuls written out, and every
                                                                      # dense matmul -> cuBLASLt / OpenBLAS
        *([relax.backend.DispatchSampling(), relax.backend.DispatchSortScan()]  # (the samplers' sort, scan and
          if generation is not None else []),                                #  multinomial: TVM's GPU kernels)
        relax.transform.DeadCodeElimination(),
        FuseWeightTranspose(),                                        # x @ W.T without materialising W.T
        relax.transform.LegalizeOps(customize_legalize_map=WIDE_LEGALIZATIONS),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    if tuning_log:
        passes.append(relax.transform.MetaScheduleApplyDatabase(tuning_log))
    if is_gpu:
        passes.append(_gpu_default_schedule())
    passes += cuda_pipeline.dataflow_lower_passes(target)
    passes += [
        relax.transform.StaticPlanBlockMemory(),
        *([relax.transform.RewriteCUDAGraph()] if is_gpu else []),
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ]
    return passes


def wide_pipeline(target: tvm.target.Target, lower: LowerGatedLayers, tuning_log: str | None = None,
                  blas: DispatchDenseMatmuls | None = None, generation=None):
    """A module pass running `wide_passes` under `target`, for `tvm.compile(relax_pipeline=...)`."""

    @tvm.transform.module_pass(opt_level=0, name="WidePipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(wide_passes(target, lower, tuning_log, blas, generation))(mod)

    return _pipeline
