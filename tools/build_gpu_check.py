"""Build, on a machine without a GPU, everything tools/gpu_check.py runs on the H200.

    python tools/build_gpu_check.py OUT_DIR [--only REGEX]

writes OUT_DIR/example.so (+ .weights.npz, the bundled example compiled for cuda: sm_90, device code sm_90a),
OUT_DIR/kernels.so (each kernel configuration below) and OUT_DIR/kernels.json (their specs).
"""

from __future__ import annotations

import argparse
import json
import os
import re

from wide_tvm.cuda_aot import cuda_codegen

cuda_codegen()

import tvm  # noqa: E402

from wide_tvm import compile as wide_compile  # noqa: E402
from wide_tvm.tuning import knob_file  # noqa: E402
from wide_tvm.kernel_spec import kernel_key  # noqa: E402
from wide_tvm.frontends.export import export_model  # noqa: E402
from wide_tvm.frontends.hf_checkpoint import load_wide_checkpoint  # noqa: E402
from wide_tvm.model import WideConfig, build_example, example_inputs  # noqa: E402
from wide_tvm.tiny_checkpoint import LORA_ALPHA, write_tiny_checkpoint  # noqa: E402
from wide_tvm.schedules import gemm_k, gemm_mn, gemm_mn_reorder_bound, mask_reorder  # noqa: E402
from wide_tvm.schedules.launch_bounds import as_built  # noqa: E402
from wide_tvm.knobs import DECODE_BUCKETS, GemvKnobs  # noqa: E402
from wide_tvm.knobs import DEFAULT_TILES, tile_knob  # noqa: E402
from wide_tvm.targets import parse_target  # noqa: E402

KERNELS = [
    # (kind, groups, group_size, other_dim, dtype, layout)
    ("gemm_mn_swiglu", 6, 32, 64, "float32", "nk"),
    ("gemm_mn_swiglu", 8, 128, 256, "float16", "kn"),
    ("gemm_mn", 4, 64, 128, "float16", "nk"),
    ("gemm_k", 6, 32, 64, "float32", "nk"),
    ("gemm_k", 8, 128, 256, "float16", "kn"),
    ("gemm_k", 16, 8, 96, "float16", "nk"),
    ("mask_reorder", 6, 0, 0, "int32", ""),
    ("mask_reorder", 112, 0, 0, "int32", ""),
    ("mask_reorder", 448, 0, 0, "int32", ""),
    # Llama-3.1-8B shapes in tensor-core tiles ("tc"): up to 64 tokens run the direct kernels (buckets 1, 8,
    # 16, 32, 64), more the 64-token tiles
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc"),
    ("gemm_k", 112, 128, 4096, "float16", "tc"),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc"),
    ("gemm_k", 448, 32, 4096, "float16", "tc"),
    ("gemm_mn", 8, 512, 4096, "float16", "tc"),
    ("gemm_k", 8, 512, 4096, "float16", "tc"),
    ("gemm_k", 3, 40, 24, "float32", "nk"),  # odd K chunks: group slices of 40 floats
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc"),  # small fp16 shapes through the tensor-core kernels
    ("gemm_k", 6, 32, 64, "float16", "tc"),
    ("gemm_mn", 4, 16, 96, "float16", "tc"),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "nk"),  # the same in [N, K]: SIMT tiles
    ("gemm_k", 6, 32, 64, "float16", "nk"),
    # decode knob paths the defaults do not take: cp.async weight rings (stages), two row tiles per warp
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", (8, 1, 1, 2)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", (4, 1, 1, 4)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", (16, 1, 1, 2)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", (16, 2, 2, 0)),
    ("gemm_k", 6, 32, 64, "float16", "tc", (4, 2, 2, 4)),
    # row tiles per block (row_warps), alone and with the ring / row tiles per warp
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", (16, 2, 1, 0, 4)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", (8, 1, 1, 2, 4)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", (32, 1, 1, 0, 8)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", (16, 1, 2, 2, 4)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", (16, 2, 1, 0, 4)),
    ("gemm_k", 6, 32, 64, "float16", "tc", (8, 1, 2, 2, 2)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", (4, 1, 1, 0, 2)),
    # blocks splitting K (ksplit) with the fixed-order sum of their partials, alone and with the other knobs
    ("gemm_k", 112, 128, 4096, "float16", "tc", (16, 2, 1, 0, 1, 4)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", (8, 2, 2, 0, 1, 3)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", (16, 1, 1, 2, 4, 2)),
    ("gemm_k", 6, 32, 64, "float16", "tc", (4, 1, 2, 2, 1, 4)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", (8, 1, 1, 2, 1, 2)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", (8, 2, 1, 0, 2, 4)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", (16, 2, 1, 0, 4, 4)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", (4, 1, 1, 0, 2, 2)),
    # many-token tile kernels (tokens per block, row tiles per warp, ring stages, weight prefetch) the defaults
    # (128, 1, 3, 1) do not take
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, (64, 2, 2, 2)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, (128, 2, 4, 2)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, (64, 2, 3, 1)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, (64, 2, 4, 2)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", None, (128, 2, 2, 1)),
    ("gemm_k", 6, 32, 64, "float16", "tc", None, (64, 2, 2, 2)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, (128, 2, 4, 2)),
    ("gemm_mn", 4, 16, 96, "float16", "tc", None, (64, 1, 2, 1)),
    # the Hopper wgmma tile GEMMs (sm_90a) at every swept knob set, Llama shapes and small odd ones
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 64, 4, 5)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 4)),
    # ... the picks past 512 tokens of Q and gate/up g32 (wg128n256s4p4: 128-token tiles, 4 producer warps)
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, ("wgmma", 64, 4, 5)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 64, 4, 5)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 128, 2, 4)),
    ("gemm_k", 3, 64, 256, "float16", "tc", None, ("wgmma", 128, 4, 4)),
    ("gemm_k", 6, 128, 128, "float16", "tc", None, ("wgmma", 64, 2, 3)),
    # ... and gemm_k split over blocks (fp32 partials, fixed-order sum), splits that do not divide the K steps
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 4)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 64, 4, 5, 4)),
    ("gemm_k", 3, 64, 256, "float16", "tc", None, ("wgmma", 64, 4, 5, 3)),
    # ... gemm_mn split over blocks too (fp32 partials by token, a fixed-order sum that applies SwiGLU and the
    # gating): Q and gate/up at 4 splits, 64-channel column blocks, one K step over 8 splits, warp-specialised
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 64, 2, 4, 4)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 64, 1, 6, 4)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 64, 1, 6, 4)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 4)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 64, 2, 4, 8)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 128, 2, 6, 4)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 4, 4, 4)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 64, 1, 6, 4)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, ("wgmma", 64, 2, 4, 8)),
    # ... gemm_k with groups of half a K step (32 K: two listed groups share a step; the half past an odd list is
    # zero-filled): down g32 per tile, split and warp-specialised, and small shapes
    ("gemm_k", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 4)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4)),
    ("gemm_k", 6, 32, 64, "float16", "tc", None, ("wgmma", 64, 1, 4)),
    ("gemm_k", 7, 32, 128, "float16", "tc", None, ("wgmma", 64, 2, 4, 3)),
    ("gemm_k", 5, 32, 64, "float16", "tc", None, ("wgmma", 128, 1, 4, 1, 1)),
    # ... warp-specialised (producer warps, mbarrier-handed ring stages): one K step (fewer than the stages),
    # two producer warps, split K with blocks that get no step at all
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 1)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 64, 4, 5, 1, 1)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 128, 2, 4, 1, 2)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 1, 1)),
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 1)),
    ("gemm_k", 3, 64, 256, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 2)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 64, 4, 5, 4, 1)),
    ("gemm_k", 3, 64, 256, "float16", "tc", None, ("wgmma", 64, 4, 5, 3, 1)),
    # ... gemm_mn on a persistent grid: one ring through a block's tiles (one K step each, fewer than the stages,
    # with 3 blocks for many tiles), two column blocks per group (Q), two producer warps
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4, 132)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 64, 4, 5, 1, 4, 3)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 4, 1, 4, 132)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 128, 2, 4, 1, 2, 5)),
    # ... gemm_mn with swapped operands (weight rows wgmma's M, tokens its N): token tiles that split the copies
    # evenly or not (80 x 8 over 256 threads), one or two warpgroups, groups of 32, split K, Q's column blocks,
    # one K step (fewer than the stages), small tiles of 8 and 24 tokens
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 80, 2, 8, 1, 0, 0, 1)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 144, 2, 6, 1, 0, 0, 1)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 48, 2, 6, 4, 0, 0, 1)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 32, 1, 8, 1, 0, 0, 1)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 80, 2, 6, 4, 0, 0, 1)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 256, 2, 4, 1, 0, 0, 1)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 8, 1, 4, 1, 0, 0, 1)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 24, 2, 4, 1, 0, 0, 1)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 40, 2, 3, 2, 0, 0, 1)),
    # ... with the weights' copies prefetching into L2 (knob l2): the gate/up and Q picks' shapes, groups of 32
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 80, 1, 6, 1, 0, 0, 1, 256)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 48, 1, 8, 1, 0, 0, 1, 256)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 32, 1, 8, 1, 0, 0, 1, 128)),
    # ... gemm_mn's last wave split in K past 512 tokens (knob tail; check at --counts past 512, e.g. 513 700 1000
    # 2049 4097): the picks' shapes, every thread copying, two K steps (at most 2 shares), one K step (never split)
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 16)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 4)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 2)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 128, 2, 4, 1, 0, 0, 0, 0, 16)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 64, 4, 5, 1, 4, 0, 0, 0, 8)),
    # gemm_k on a persistent grid (whole waves, then the last wave's K steps shared out: stream-K): the Llama shapes,
    # small shapes with fewer K steps than blocks (empty shares), and a grid of 5 blocks, each walking many tiles
    ("gemm_k", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 132)),
    ("gemm_k", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 132)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 1, 0, 132)),
    ("gemm_k", 3, 64, 256, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 132)),
    ("gemm_k", 5, 32, 256, "float16", "tc", None, ("wgmma", 128, 2, 6, 1, 0, 132)),
    ("gemm_k", 6, 128, 128, "float16", "tc", None, ("wgmma", 64, 2, 4, 1, 0, 5)),
    # gemm_k over tokens ordered by mask pattern (knob order, at most 8 groups; check at --counts past 512 too): O's
    # shape, split over blocks (partials summed at their tokens), 64-token tiles, one group, groups of 32
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 1)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 2, 0, 0, 0, 0, 0, 1)),
    ("gemm_k", 8, 512, 4096, "float16", "tc", None, ("wgmma", 64, 4, 5, 1, 0, 0, 0, 0, 0, 1)),
    ("gemm_k", 3, 64, 256, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 1)),
    ("gemm_k", 1, 128, 128, "float16", "tc", None, ("wgmma", 64, 2, 4, 3, 0, 0, 0, 0, 0, 1)),
    ("gemm_k", 5, 32, 64, "float16", "tc", None, ("wgmma", 128, 1, 4, 1, 0, 0, 0, 0, 0, 1)),
    # gemm_mn with a warpgroup whose rows are all past the group's count skipping its wgmmas (knob mma_skip; check
    # at --counts past 512 too): the picks' shapes with producer warps, split K, the split tail, every thread
    # copying, small shapes
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 0, 0, 1)),
    ("gemm_mn_swiglu", 448, 32, 4096, "float16", "tc", None, ("wgmma", 128, 2, 4, 1, 4, 0, 0, 0, 0, 0, 1)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 2, 6, 4, 0, 0, 0, 0, 0, 0, 1)),
    ("gemm_mn", 8, 512, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8, 0, 1)),
    ("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", None, ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 0, 1)),
    ("gemm_mn_swiglu", 4, 64, 128, "float16", "tc", None, ("wgmma", 128, 2, 4, 1, 2, 0, 0, 0, 0, 0, 1)),
    ("gemm_mn_swiglu", 6, 32, 64, "float16", "tc", None, ("wgmma", 128, 2, 4, 2, 0, 0, 0, 0, 0, 0, 1)),
]


def kernel_func(kind, g, gs, dim, dtype, layout, knobs=None, tile=None):
    if kind == "mask_reorder":
        return mask_reorder(g, "cuda")
    extra = {"decode_knobs": (GemvKnobs(*knobs),) * len(DECODE_BUCKETS)} if knobs else {}
    if tile:
        extra["tile_knobs"] = (tile_knob(tile, kind),) * len(DEFAULT_TILES)
    if kind == "gemm_k":
        return gemm_k(g, gs, dim, dtype, layout, "cuda", **extra)
    return gemm_mn(g, gs, dim, dtype, layout, kind == "gemm_mn_swiglu", "cuda", **extra)


def reorder_free(spec) -> int:
    """Token counts up to which a gemm_mn case reads no mask reorder (gpu_check hands it a wrong one there): its
    direct kernels' and the many-token kernels that sort their tokens themselves (schedules.gemm_mn_reorder_bound)."""
    if not spec[0].startswith("gemm_mn") or spec[5] != "tc":
        return 0
    tiles = (tile_knob(spec[7], spec[0]),) * len(DEFAULT_TILES) if len(spec) > 7 else DEFAULT_TILES
    return gemm_mn_reorder_bound(tiles)


def build_wgmma_example(out_dir: str, cfg: WideConfig, fp16_path: str) -> None:
    """OUT_DIR/example_fp16_wgmma.so: the fp16 example with a tuning log that gives its gate/up kernel the wgmma
    tile GEMM in every many-token bucket (past 32 tokens), so a whole model runs it."""
    key = kernel_key("gemm_mn_swiglu", cfg.intermediate_size // cfg.ffn_group_size, cfg.ffn_group_size,
                     cfg.hidden_size, "float16")
    log = os.path.join(out_dir, "wgmma_log")
    knob_file.save(log, {key: {"tiles": [["wgmma", 64, 4, 5], ["wgmma", 128, 2, 4], ["wgmma", 128, 4, 4]]}},
                      "cuda", "tools/build_gpu_check.py")
    compiled = wide_compile(fp16_path, "cuda", tuning_log=log)
    compiled.export(os.path.join(out_dir, "example_fp16_wgmma.so"))


def main(out_dir: str, only: str | None = None, examples: bool = False) -> None:
    """only: a regular expression; when given, build just the kernel cases whose knob name matches it (no
    example models), e.g. to check new kernels on the GPU without the 10-minute full build; examples: build
    the example models alone (a compiler change, checked without the kernel cases)."""
    os.makedirs(out_dir, exist_ok=True)
    if only is None:
        build_examples(out_dir)
    if not examples:
        build_kernels(out_dir, only)


def build_examples(out_dir: str) -> None:
    """The example models (fp32, dense, fp16, fp16 on wgmma, fp16 on the dense fallback) and the tiny Llama
    checkpoint, compiled."""
    model_path = os.path.join(out_dir, "example.pt2")
    cfg = WideConfig()
    with open(os.path.join(out_dir, "example_config.json"), "w") as f:
        f.write(cfg.to_json())
    export_model(build_example(cfg), example_inputs(cfg), model_path)
    wide_compile(model_path, "cuda").export(os.path.join(out_dir, "example.so"))
    wide_compile(model_path, "cuda", dense=True).export(os.path.join(out_dir, "example_dense.so"))
    fp16_path = os.path.join(out_dir, "example_fp16.onnx")  # fp16: tensor-core kernels inside a whole model
    export_model(build_example(cfg).half(), example_inputs(cfg), fp16_path)
    wide_compile(fp16_path, "cuda").export(os.path.join(out_dir, "example_fp16.so"))
    # every gated kernel on its dense fallback (cuBLASLt + the mask / SwiGLU epilogue) at every token count
    wide_compile(fp16_path, "cuda", fallback="always").export(os.path.join(out_dir, "example_fp16_fallback.so"))
    build_wgmma_example(out_dir, cfg, fp16_path)
    ckpt_dir = write_tiny_checkpoint(os.path.join(out_dir, "hf_llama"), "llama")
    ckpt = load_wide_checkpoint(ckpt_dir, os.path.join(ckpt_dir, "router.pth"), os.path.join(ckpt_dir, "lora.pth"),
                                lora_alpha=LORA_ALPHA)
    hf_path = os.path.join(out_dir, "hf_llama.pt2")
    export_model(ckpt.model, example_inputs(ckpt.config), hf_path)
    wide_compile(hf_path, "cuda").export(os.path.join(out_dir, "hf_llama.so"))
    import torch

    torch.save(ckpt.model.state_dict(), os.path.join(out_dir, "hf_llama_state.pt"))
    with open(os.path.join(out_dir, "hf_llama_config.json"), "w") as f:
        f.write(ckpt.config.to_json())
    for name in os.listdir(ckpt_dir):  # the checkpoint itself is not needed on the GPU host
        os.remove(os.path.join(ckpt_dir, name))
    os.rmdir(ckpt_dir)


def build_kernels(out_dir: str, only: str | None) -> None:
    """OUT_DIR/kernels.so + kernels.json: the KERNELS cases (those whose knob name matches `only`, if given)."""
    target = parse_target("cuda")
    funcs, specs = {}, []
    for i, spec in enumerate(KERNELS):
        name = f"k{i}_{spec[0]}"
        knobs = ((GemvKnobs(*spec[6]).name() if len(spec) > 6 and spec[6] else "")
                 + (tile_knob(spec[7], spec[0]).name() if len(spec) > 7 else ""))
        if only is not None and not re.search(only, knobs):
            continue
        funcs[name] = as_built(kernel_func(*spec), True).with_attr("global_symbol", name)  # as wide-compile does
        specs.append({"name": name, "kind": spec[0], "groups": spec[1], "group_size": spec[2], "dim": spec[3],
                      "dtype": spec[4], "layout": spec[5], "knobs": knobs, "reorder_free": reorder_free(spec)})
    with target:
        tvm.compile(tvm.IRModule(funcs), target).export_library(os.path.join(out_dir, "kernels.so"))
    with open(os.path.join(out_dir, "kernels.json"), "w") as f:
        json.dump({"config": json.loads(WideConfig().to_json()), "kernels": specs}, f, indent=1)
    print(f"wrote {out_dir}/kernels.so, kernels.json ({len(specs)} kernel cases)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", nargs="?", default="gpu_check")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only", metavar="REGEX", help="only the kernel cases whose knob name matches (no examples)")
    which.add_argument("--examples", action="store_true", help="only the example models (no kernel cases)")
    args = parser.parse_args()
    main(args.out_dir, args.only, args.examples)
