"""wide-tune: measure the knob candidates of a model's gated kernels on the target, keep the fastest.

The kernels' intra-block knobs (CPU: tokens per tile and vector width; CUDA decode kernels: warps
splitting K and loads in flight) are searched by building every candidate and timing it on random
inputs at bucketed token counts (symbolic token counts cannot be timed). Results are merged into
`OUT/kernel_knobs.json`, which wide-compile applies; kernels already in that file are skipped unless
`--force`, so an interrupted run resumes. CUDA candidates must be timed on a GPU: run wide-tune there,
or time them with `wide-bench run --sweep` and import the result with `--from-sweep`.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import numpy as np

from . import kernel_knobs
from .errors import WideError

CPU_BM = (1, 4, 8)
CPU_BN = (8, 32, 64, 256)
CPU_TOKENS = (1, 16, 64)  # token counts timed on the CPU, one per bucket (schedules.tiles.CPU_BUCKETS)


@dataclass(frozen=True)
class KernelSpec:
    """One gated kernel of a model, as LowerGatedLayers instantiated it."""

    kind: str  # gemm_mn_swiglu | gemm_k
    groups: int
    group_size: int
    dim: int
    dtype: str
    layout: str

    @property
    def key(self) -> str:
        return kernel_knobs.kernel_key(self.kind, self.groups, self.group_size, self.dim, self.dtype)

    @classmethod
    def from_name(cls, name: str) -> "KernelSpec | None":
        """Parse wide_gemm_mn_swiglu_g6x32_k64_float32_kn / wide_gemm_k_g6x32_n64_float32_kn."""
        parts = name.split("_")
        if not name.startswith("wide_gemm_"):
            return None
        kind = "gemm_mn_swiglu" if parts[2] == "mn" else "gemm_k"
        g, gs = parts[-4][1:].split("x")
        return cls(kind, int(g), int(gs), int(parts[-3][1:]), parts[-2], parts[-1])


def model_kernels(model: str, target: str) -> list[KernelSpec]:
    """The gated kernels wide-compile would build for `model` on `target`."""
    from .frontends.loader import import_model
    from .passes import LowerGatedLayers
    from .targets import parse_target

    tgt = parse_target(target)
    lower = LowerGatedLayers(tgt.kind.name)  # the lowering alone names the kernels: no need to build them
    with tgt:
        lower(import_model(model).mod)
    specs = {KernelSpec.from_name(k) for layer in lower.layers for k in layer.kernels}
    return sorted((s for s in specs if s is not None), key=lambda s: s.key)


def _cpu_candidates(spec: KernelSpec) -> list:
    from .schedules.tiles import TileConfig

    width = spec.group_size if spec.kind != "gemm_k" else spec.dim
    return [TileConfig(bm, bn) for bm, bn in itertools.product(CPU_BM, CPU_BN) if width % bn == 0]


def _build_cpu(spec: KernelSpec, tile):
    import tvm

    from .schedules import gemm_k, gemm_mn

    if spec.kind == "gemm_k":
        f = gemm_k(spec.groups, spec.group_size, spec.dim, spec.dtype, spec.layout, "llvm", cpu_tile=tile)
    else:
        f = gemm_mn(spec.groups, spec.group_size, spec.dim, spec.dtype, spec.layout, True, "llvm", cpu_tile=tile)
    return tvm.compile(f.with_attr("global_symbol", "main"), target="llvm")["main"]


def _cpu_inputs(spec: KernelSpec, tokens: int, sparsity: float, rng):
    import tvm

    from .kernel_reference import make_mask, ref_mask_reorder

    t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a))  # noqa: E731
    mask = make_mask("random", tokens, spec.groups, rng, sparsity)
    counts, order, used = ref_mask_reorder(mask)
    k = spec.groups * spec.group_size
    if spec.kind == "gemm_k":
        w = rng.standard_normal((spec.dim, k) if spec.layout == "nk" else (k, spec.dim)).astype(spec.dtype)
        return [t(rng.standard_normal((tokens, k)).astype(spec.dtype)), t(w), t(mask), t(counts), t(order), t(used),
                t(np.zeros((tokens, spec.dim), spec.dtype))]
    wshape = (k, spec.dim) if spec.layout == "nk" else (spec.dim, k)
    return [t(rng.standard_normal((tokens, spec.dim)).astype(spec.dtype)),
            t(rng.standard_normal(wshape).astype(spec.dtype)), t(rng.standard_normal(wshape).astype(spec.dtype)),
            t(mask), t(counts), t(order), t(used), t(np.zeros((tokens, k), spec.dtype))]


def time_call(fn, args, reps: int = 5) -> float:
    """Median wall time in microseconds (one warm-up call)."""
    fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def tune_cpu(specs: list[KernelSpec], done: dict, force: bool, progress) -> dict:
    """Per kernel and CPU token bucket, the tile that runs that bucket's token count fastest."""
    from .schedules.tiles import CPU_BUCKETS

    bucket_of = [next((i for i, b in enumerate(CPU_BUCKETS) if m <= b), len(CPU_BUCKETS)) for m in CPU_TOKENS]
    if sorted(set(bucket_of)) != list(range(len(CPU_BUCKETS) + 1)):
        raise WideError(f"CPU_TOKENS {CPU_TOKENS} must time every CPU bucket {CPU_BUCKETS}")
    rng = np.random.default_rng(0)
    entries = {}
    for spec in specs:
        if spec.key in done and not force:
            progress.console.print(f"{spec.key}: already tuned ({done[spec.key]}), skipped")
            continue
        cands = _cpu_candidates(spec)
        task = progress.add_task(spec.key, total=len(cands))
        inputs = [_cpu_inputs(spec, m, 0.5, rng) for m in CPU_TOKENS]
        best = [None] * (len(CPU_BUCKETS) + 1)  # per bucket: (summed time of its token counts, tile)
        for tile in cands:
            fn = _build_cpu(spec, tile)
            per_bucket = [0.0] * len(best)
            for b, args in zip(bucket_of, inputs):
                per_bucket[b] += time_call(fn, args)
            for b, t in enumerate(per_bucket):
                if best[b] is None or t < best[b][0]:
                    best[b] = (t, tile)
            progress.advance(task)
        entries[spec.key] = {"cpu": [{"bm": tile.bm, "bn": tile.bn} for _, tile in best],
                             "us": [round(t, 1) for t, _ in best], "tokens": list(CPU_TOKENS)}
    return entries


def from_sweep(paths: list[str]) -> dict:
    """Kernel-knob entries from `wide-bench run --sweep` JSONs measured on the GPU; a later file's picks replace
    an earlier one's (e.g. a sweep of the tile kernels alone over a full one)."""
    import json

    from .bench.workloads import DECODE_BUCKETS, LLAMA_8B, TILE_SWEEP_BUCKETS

    best = {}
    for path in paths:
        with open(path) as f:
            best.update(json.load(f)["best"])
    entries = {}
    for w in LLAMA_8B:
        picks = [best.get(f"{w.name}/{bucket}") for bucket in DECODE_BUCKETS]
        if None in picks:
            continue
        kind = "gemm_k" if w.kind == "gemm_k" else ("gemm_mn_swiglu" if w.swiglu else "gemm_mn")
        entries[kernel_knobs.kernel_key(kind, w.groups, w.group_size, w.dim, w.dtype)] = {
            "decode": [[p["warps"], p["unroll"], p.get("rows", 1), p.get("stages", 0), p.get("row_warps", 1),
                        p.get("ksplit", 1)] for p in picks],
            "us": [round(p.get("summed_us", p.get("kernel_us", 0.0)), 1) for p in picks],
            "timed_at_tokens": [p["tokens"] for p in picks]}
        tiles = [best.get(f"{w.name}/{b}") for b in TILE_SWEEP_BUCKETS]
        if None not in tiles:  # the many-token kernels' picks (sweeps since the tile GEMM)
            entries[kernel_knobs.kernel_key(kind, w.groups, w.group_size, w.dim, w.dtype)].update(
                tiles=[p["tile"] for p in tiles], tiles_us=[round(p["summed_us"], 1) for p in tiles],
                tiles_timed_at_tokens=[p["tokens"] for p in tiles])
    return entries


def bench_kernels() -> list[KernelSpec]:
    """The CPU benchmark's Llama-3.1-8B FFN kernels (wide-bench cpu), for tuning without a model file."""
    from .bench.cpu import CPU_WORKLOADS

    return [KernelSpec("gemm_mn_swiglu" if w.swiglu else w.kind, w.groups, w.group_size, w.dim, w.dtype,
                       cpu_layout(w.kind)) for w in CPU_WORKLOADS]


def cpu_layout(kind: str) -> str:
    """Weight layout wide-compile gives a CPU kernel: gemm_k weights are folded to [K, N] (contiguous groups)."""
    return "kn" if kind == "gemm_k" else "nk"


def tune(model: str | None, target: str, out: str, force: bool = False, sweep: list[str] | None = None,
         llama8b: bool = False) -> str:
    from rich.progress import Progress

    from .targets import parse_target

    tgt = parse_target(target)
    import os

    shown_out = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else out
    command = " ".join(part for part in ("wide-tune", model, "--llama8b" if llama8b else None, "--target", target,
                                         "--out", shown_out, "--force" if force else None,
                                         f"--from-sweep {' '.join(sweep)}" if sweep else None) if part)
    if sweep:
        if tgt.kind.name != "cuda":
            raise WideError("--from-sweep imports GPU measurements; use it with a cuda target")
        import json

        with open(sweep[-1]) as f:
            device = json.load(f).get("device", "GPU of the sweep")
        return kernel_knobs.save(out, from_sweep(sweep), str(tgt), command, hardware=device)
    if model is None and not llama8b:
        raise WideError("give a MODEL to tune, --llama8b, or --from-sweep")
    if tgt.kind.name == "cuda":
        raise WideError(f"tuning for {target} times kernels on a GPU, and none is usable here: build the "
                        "candidates with `wide-bench build DIR --sweep`, time them on the GPU with "
                        "`wide-bench run DIR --sweep --json sweep.json`, then `wide-tune --target cuda "
                        "--from-sweep sweep.json`")
    specs = bench_kernels() if llama8b else model_kernels(model, target)
    if not specs:
        raise WideError(f"{model}: no gated kernels to tune")
    done = kernel_knobs.load(out) if os.path.isdir(out) else {}
    with Progress() as progress:
        entries = tune_cpu(specs, done, force, progress)
    return kernel_knobs.save(out, entries, str(tgt), command)
