"""Which token counts of a gated kernel run the dense fallback (the vendor BLAS on the masked operand) instead of
the gated kernel: never slower than dense.

Per kernel shape (kernel_spec.kernel_key) the decision comes, in this order, from
1. measurements: `crossover.json` in a tuning folder (`wide-tune --crossover RUN.json` writes it from a `wide-bench
   run` that timed both paths), the gated path (mask reorder + kernel) and the fallback at each measured token
   count, at the sparsity and masks the run used; each measured count decides the counts nearest to it on a log
   scale;
2. the measurements of the nearest measured shape (same kind, group size and dtype, within tuning/nearest.py's
   distance), as untuned shapes take the nearest tuned shape's knobs -- where its fallback won by more than
   BORROWED_MARGIN;
3. a cost model (`model_prefers_dense`): the gated kernel's work relative to dense at `SPARSITY`, over its efficiency
   relative to the vendor BLAS on the target.

Worked example: measured points (tokens, gated us, dense us) (1, 10, 17), (16, 40, 38), (256, 300, 250),
(4096, 2400, 2600): counts 1..4 take the 1-token point (gated), 5..64 the 16-token point (dense), 65..1024 the
256-token point (dense), 1025 on the 4096-token point (gated), so the fallback ranges are ((5, 1024),).

Pure Python (the GPU host's benchmark and the tuner import it without TVM).
"""

from __future__ import annotations

import json
import math
import os

from .tuning.nearest import nearest

CROSSOVER_FILE = "crossover.json"
MODES = ("auto", "off", "always")
# A shape without its own measurements falls back where the nearest measured shape's fallback won by more than this
# (H100: the Llama gate/up's 3 % win at 256 tokens was a 20 % loss for Qwen2.5-7B's gate/up)
BORROWED_MARGIN = 0.05
SPARSITY = 0.5  # the share of groups a token skips that the cost model assumes (WIDE's usual training target)
# Gated kernels' throughput relative to the vendor BLAS at equal work, per target kind (the cost model):
# CUDA from the H200 runs with every group active (docs/performance.md: gate/up 0.74-0.82x, down 0.53-0.61x at 64+
# tokens; the direct kernels stream weights at 0.95-1.0x of cuBLAS's bandwidth); CPU: the gated kernels are faster
# than OpenBLAS at every measured count (1.15-2.16x at 1-16 tokens), so the model never falls back there.
EFFICIENCY = {"cuda": {"direct": 0.95, "gemm_mn": 0.75, "gemm_k": 0.6}, "llvm": {"direct": 1.5, "gemm_mn": 1.5,
                                                                                "gemm_k": 1.5}}
DIRECT_TOKENS = 16  # up to this many tokens the kernels stream weights (memory-bound: work = used groups' bytes)
# The fallback's time relative to the bare BLAS GEMM: gate/up adds the SwiGLU pass (reads 2 N, writes N columns: about
# a tenth of the GEMM's time from 16 tokens on, H200 estimate from the DRAM rate); the others add at most a mask pass
FALLBACK_COST = {"gemm_mn_swiglu": 1.1}


def load_crossovers(folders: list[str]) -> dict:
    """Kernel key -> measured entry ({"points": [[tokens, gated_us, dense_us], ...], ...}) of the folders'
    crossover files, each folder on top of the ones before (whole entries)."""
    merged: dict = {}
    for folder in folders:
        path = os.path.join(folder, CROSSOVER_FILE)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            merged.update(json.load(f).get("kernels", {}))
    return merged


def ranges_from_points(points, margin: float = 0.0) -> tuple:
    """Fallback ranges ((lo, hi), hi None = no end) from measured [tokens, gated_us, dense_us] points: each count
    takes the decision of the measured count nearest to it on a log scale (the module's worked example); dense where
    it is faster by more than `margin` (a share of the gated time)."""
    pts = sorted((int(t), float(g), float(d)) for t, g, d in points)
    if not pts:
        return ()
    dense = []
    for i, (t, g, d) in enumerate(pts):
        lo = 1 if i == 0 else math.floor(math.sqrt(pts[i - 1][0] * t)) + 1
        hi = None if i == len(pts) - 1 else math.floor(math.sqrt(t * pts[i + 1][0]))
        if d < g * (1 - margin):
            dense.append((lo, hi))
    return merge(dense)


def merge(ranges) -> tuple:
    """Adjacent or overlapping (lo, hi) ranges joined, in order."""
    out: list = []
    for lo, hi in sorted(ranges):
        if out and (out[-1][1] is None or out[-1][1] >= lo - 1):
            last_hi = out[-1][1]
            out[-1] = (out[-1][0], None if last_hi is None or hi is None else max(last_hi, hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def model_prefers_dense(kind: str, tokens: int, target_kind: str, sparsity: float = SPARSITY) -> bool:
    """The cost model: the gated kernel's work relative to dense -- the share of groups some token uses,
    1 - sparsity^tokens, while the kernels stream weights (up to DIRECT_TOKENS), then gemm_mn's active (token,
    group) pairs (1 - sparsity) and gemm_k's every group (a tile of tokens skips a group only if all its tokens
    do) -- over its efficiency relative to the vendor BLAS (EFFICIENCY), against the fallback's own cost (the BLAS,
    and for SwiGLU its elementwise pass over [T, 2N] -> [T, N]: FALLBACK_COST); dense where the gated side is
    dearer."""
    eff = EFFICIENCY["cuda" if target_kind == "cuda" else "llvm"]
    dense = FALLBACK_COST.get(kind, 1.0)
    if tokens <= DIRECT_TOKENS:
        return (1 - sparsity ** tokens) / eff["direct"] > dense
    op = "gemm_k" if kind == "gemm_k" else "gemm_mn"
    work = 1.0 if op == "gemm_k" else 1 - sparsity
    return work / eff[op] > dense


def model_ranges(kind: str, target_kind: str) -> tuple:
    """model_prefers_dense as fallback ranges (past DIRECT_TOKENS the model does not depend on the count)."""
    dense = [(t, t) for t in range(1, DIRECT_TOKENS + 1) if model_prefers_dense(kind, t, target_kind)]
    if model_prefers_dense(kind, DIRECT_TOKENS + 1, target_kind):
        dense.append((DIRECT_TOKENS + 1, None))
    return merge(dense)


def decide(key: str, kind: str, target_kind: str, mode: str, crossovers: dict) -> tuple[tuple, str]:
    """(fallback ranges, where they come from) of the kernel `key` of `kind` under `mode` ("auto": measurements,
    the nearest measured shape's, else the cost model; "off": none; "always": every count)."""
    if mode == "off":
        return (), "off"
    if mode == "always":
        return ((1, None),), "always"
    if mode != "auto":
        raise ValueError(f"dense fallback mode {mode!r}: expected one of {', '.join(MODES)}")
    if key in crossovers:
        return ranges_from_points(crossovers[key]["points"]), "measured"
    near = nearest(crossovers, key)
    if near is not None:  # (another shape's near-ties can go either way here: only its clear wins count)
        return ranges_from_points(crossovers[near]["points"], BORROWED_MARGIN), f"measured for {near}"
    return model_ranges(kind, target_kind), "cost model"


def covers(ranges, tokens: int) -> bool:
    """Whether a call of `tokens` tokens runs the dense fallback under `ranges` (schedules/dense_fallback.py:
    in_ranges is the same test in the kernel)."""
    return any(lo <= tokens and (hi is None or tokens <= hi) for lo, hi in ranges)


def describe(ranges) -> str:
    """'4-1023, 2048+' style text of fallback ranges ('never' when empty)."""
    if not ranges:
        return "never"
    return ", ".join(f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}-{hi}") for lo, hi in ranges)
