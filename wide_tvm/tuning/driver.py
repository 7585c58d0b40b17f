"""wide-tune: MetaSchedule searches the knobs of a model's gated kernels on the target, per token bucket.

The kernels' intra-block knobs (CPU: tokens per tile and columns per task; CUDA: the direct kernels' warps,
loads in flight, row tiles, cp.async ring and split-K, the many-token kernels' tile GEMM, wgmma shape, ring
depth and producer warps) are a MetaSchedule search space (tuning/space.py) timed at bucketed token
counts (symbolic token counts cannot be timed). The records go to OUT/database_*.json, which wide-compile
applies; a rerun continues from them. CUDA candidates must be timed on a GPU: run wide-tune there, or time the
sweep's candidates with `wide-bench run --sweep` and import them with `--from-sweep` (OUT/kernel_knobs.json).
"""

from __future__ import annotations

import os

from ..errors import WideError
from ..kernel_spec import KernelSpec
from . import knob_file

DEFAULT_TRIALS = 16  # measured candidates per kernel and token bucket (fewer when its space is smaller)


def model_kernels(model: str, target: str) -> list[KernelSpec]:
    """The gated kernels wide-compile would build for `model` on `target`: the lowering's plan, without building a
    kernel (LowerGatedLayers(build=False))."""
    from ..frontends.loader import import_model
    from ..passes import LowerGatedLayers
    from ..targets import parse_target

    tgt = parse_target(target)
    lower = LowerGatedLayers(tgt.kind.name, build=False)
    with tgt:
        lower(import_model(model).mod)
    return lower.plan.kernels


def from_sweep(paths: list[str]) -> dict:
    """Kernel-knob entries from `wide-bench run --sweep` JSONs measured on the GPU; a later file's picks replace
    an earlier one's (e.g. a sweep of the tile kernels alone over a full one)."""
    import json

    from ..bench.workloads import LLAMA_8B, TILE_SWEEP_BUCKETS
    from ..knobs import DECODE_BUCKETS, GemvKnobs, tile_knob

    best = {}
    for path in paths:
        with open(path) as f:
            best.update(json.load(f)["best"])
    entries = {}
    for w in LLAMA_8B:
        picks = [best.get(f"{w.name}/{bucket}") for bucket in DECODE_BUCKETS]
        if None in picks:
            continue
        key = w.spec("cuda").key
        entries[key] = {
            "decode": [GemvKnobs(p["warps"], p["unroll"], p.get("rows", 1), p.get("stages", 0), p.get("row_warps", 1),
                                 p.get("ksplit", 1)).to_json() for p in picks],
            "us": [round(p.get("summed_us", p.get("kernel_us", 0.0)), 1) for p in picks],
            "timed_at_tokens": [p["tokens"] for p in picks]}
        tiles = [best.get(f"{w.name}/{b}") for b in TILE_SWEEP_BUCKETS]
        if None not in tiles:  # the many-token kernels' picks (sweeps since the tile GEMM)
            entries[key].update(
                tiles=[tile_knob(p["tile"], w.kernel_kind).to_json() for p in tiles], tiles_us=[round(p["summed_us"], 1) for p in tiles],
                tiles_timed_at_tokens=[p["tokens"] for p in tiles])
    return entries


def bench_kernels(target_kind: str) -> list[KernelSpec]:
    """The benchmark's Llama-3.1-8B kernels (wide-bench: the FFN in fp32, fp16 and bf16 on the CPU; FFN and Q/O
    projections in fp16 on CUDA), for tuning without a model file."""
    if target_kind == "llvm":
        from ..bench.cpu import cpu_workloads

        workloads = cpu_workloads()
    else:
        from ..bench.workloads import LLAMA_8B as workloads
    return [w.spec(target_kind) for w in workloads]


def tune(model: str | None, target: str, out: str, force: bool = False, sweep: list[str] | None = None,
         llama8b: bool = False, trials: int = DEFAULT_TRIALS, only: str | None = None) -> str:
    from rich.progress import Progress

    from ..targets import parse_target
    from .database import WORKLOAD_FILE, repair
    from .folders import folder_lock
    from .search import tune_tasks

    tgt = parse_target(target)
    shown_out = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else out
    command = " ".join(part for part in ("wide-tune", model, "--llama8b" if llama8b else None, "--target", target,
                                         f"--trials {trials}" if not sweep else None,
                                         f"--only '{only}'" if only else None, "--out", shown_out,
                                         "--force" if force else None,
                                         f"--from-sweep {' '.join(sweep)}" if sweep else None) if part)
    if sweep:
        if tgt.kind.name != "cuda":
            raise WideError("--from-sweep imports GPU measurements; use it with a cuda target")
        import json

        with open(sweep[-1]) as f:
            device = json.load(f).get("device", "GPU of the sweep")
        with folder_lock(out, wait_note=lambda: print(f"waiting for another wide-tune writing {out}")):
            return knob_file.save(out, from_sweep(sweep), str(tgt), command, hardware=device)
    if model is None and not llama8b:
        raise WideError("give a MODEL to tune, --llama8b, or --from-sweep")
    if trials < 1:
        raise WideError(f"--trials {trials}: give at least 1 trial per kernel and token bucket")
    if tgt.kind.name == "cuda" and not has_gpu():
        raise WideError(f"tuning for {target} times kernels on a GPU, and none is usable here: run wide-tune on "
                        "the GPU host, or build the candidates with `wide-bench build DIR --sweep`, time them on "
                        "the GPU with `wide-bench run DIR --sweep --json sweep.json`, then `wide-tune --target "
                        "cuda --from-sweep sweep.json`")
    specs = bench_kernels(tgt.kind.name) if llama8b else model_kernels(model, target)
    tasks = spec_tasks(specs, tgt)
    if not tasks:
        raise WideError(f"{model or 'the Llama-3.1-8B kernels'}: no gated kernels with knobs to tune for {target}")
    if only:
        import re

        names = [t.name for t in tasks]
        tasks = [t for t in tasks if re.search(only, t.name)]
        if not tasks:
            raise WideError(f"--only {only!r} matches no task; the tasks are: {', '.join(names)}")
    with folder_lock(out, wait_note=lambda: print(f"waiting for another wide-tune writing {out}")):
        repair(out)  # a torn line a killed tuner left (appends would follow it)
        run = knob_file.record_run(out, str(tgt), command, [t.name for t in tasks],
                                   hardware=gpu_name() if tgt.kind.name == "cuda" else None)
        with Progress() as progress:
            ran = tune_tasks(tasks, tgt, out, trials, force, progress)
        knob_file.finish_run(out, run, ran)
    return os.path.join(out, WORKLOAD_FILE)


def spec_tasks(specs: list[KernelSpec], tgt) -> list:
    """The knob tasks (tuning/space.py) of gated kernels for a target: per kernel, one per token bucket."""
    from ..targets import has_wgmma
    from .space import kernel_tasks

    return [t for s in specs for t in kernel_tasks(s.kind, s.groups, s.group_size, s.dim, s.dtype, s.layout,
                                                   tgt.kind.name, has_wgmma(tgt))]


def has_gpu() -> bool:
    import tvm

    return tvm.cuda(0).exist


def gpu_name() -> str:
    import tvm

    return tvm.cuda(0).device_name
