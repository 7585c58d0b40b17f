"""CPU side of wide-bench, measured on this machine: our llvm kernels at a sparsity and with every group
active (the same kernels, dense), TVM dense (wide-compile's pipeline without gating) and torch.matmul."""

from __future__ import annotations

import glob
import time
from dataclasses import replace

import ml_dtypes  # noqa: F401  (numpy learns the name bfloat16)
import numpy as np

from ..kernel_reference import make_mask, ref_mask_reorder
from .measure import roofline_us
from ..weight_layout import pack
from ..kernel_spec import KernelSpec
from .workloads import Workload

CPU_WORKLOADS = [  # Llama-3.1-8B FFN shapes; fp32 here, cpu_workloads gives the other dtypes (fp32 accumulation)
    Workload("gate_up_g128", "gemm_mn", 112, 128, 4096, swiglu=True, dtype="float32"),
    Workload("down_g128", "gemm_k", 112, 128, 4096, dtype="float32"),
]
CPU_DTYPES = {"float32": "", "float16": "_fp16", "bfloat16": "_bf16"}  # dtype: suffix of its workloads' names


def cpu_workloads(dtypes=tuple(CPU_DTYPES)) -> list[Workload]:
    """CPU_WORKLOADS in each of `dtypes` (weights and activations; the kernels accumulate in fp32): models ship
    fp16 / bf16 weights, which halve what a memory-bound CPU kernel reads."""
    unknown = [dt for dt in dtypes if dt not in CPU_DTYPES]
    if unknown:
        from ..errors import WideError

        raise WideError(f"CPU dtype {', '.join(unknown)}: the CPU kernels take {', '.join(CPU_DTYPES)}")
    return [replace(w, name=w.name + CPU_DTYPES[dt], dtype=dt) for dt in dtypes for w in CPU_WORKLOADS]


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (sysfs; 32 MiB where it does not say): weights the benchmark calls repeatedly stay
    there unless the calls rotate through more copies than it holds."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=32 << 20)


def weight_copies(nbytes: int, cache_bytes: int | None = None) -> int:
    """Copies of `nbytes` of weights that together fill four times the last-level cache (at least two): the calls of
    a timing loop take them in turn, so each finds its weights in DRAM, as a model's layers (each its own weights)
    would (the VMs this runs on report L3 caches of up to 480 MiB). Four: a gated call reads about half of its
    copy, and between two calls on one copy the others read at least twice the cache."""
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    return max(2, -(-4 * cache // nbytes))


def time_call(fn, arg_sets, reps: int = 5, max_s: float | None = None) -> float:
    """Median wall time in microseconds (one warm-up call), the calls taking `arg_sets` in turn; with `max_s`, fewer
    reps where the warm-up call shows that `reps` would take longer (at least one: TVM's unscheduled dense takes
    seconds a call)."""
    t0 = time.perf_counter()
    fn(*arg_sets[0])
    if max_s is not None:
        reps = max(1, min(reps, int(max_s / (time.perf_counter() - t0))))
    times = []
    for rep in range(reps):
        args = arg_sets[(rep + 1) % len(arg_sets)]
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def time_interleaved(calls: dict, reps: int = 9, warmup: int = 2) -> dict[str, float]:
    """Median wall time in microseconds of each of `calls` ({label: (fn, arg_sets)}), timed in turns (this VM's
    memory rate drifts by 10-20 % within seconds, which a ratio of two kernels timed one after the other takes in);
    call i of the loop takes set i of its label's arg_sets (cyclic), so calls that follow each other use
    different sets (weight copies, weight_copies)."""
    times = {label: [] for label in calls}
    i = 0
    for rep in range(warmup + reps):
        for label, (fn, arg_sets) in calls.items():
            args = arg_sets[i % len(arg_sets)]
            i += 1
            t0 = time.perf_counter()
            fn(*args)
            if rep >= warmup:
                times[label].append(time.perf_counter() - t0)
    return {label: float(np.median(t)) * 1e6 for label, t in times.items()}


def cpu_limits(reps: int = 5) -> dict:
    """This machine's measured read bandwidth (torch's sum of 1 GB, every core) and dense fp32 throughput (torch's
    2048^3 matmul), the roofline of measure.roofline_us in its keys (TFLOP/s under "tensor_tflops")."""
    import torch

    buf = torch.ones(1 << 28)  # 1 GB of fp32
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    t_read = time_call(lambda: buf.sum(), [[]], reps)
    t_mm = time_call(lambda: torch.matmul(a, b), [[]], reps)
    return {"bandwidth_gbs": buf.numel() * 4 / t_read * 1e-3, "tensor_tflops": 2 * 2048 ** 3 / t_mm * 1e-6}


def build_cpu(spec: KernelSpec, tile, target: str = "llvm"):
    """Our CPU kernel for `spec` with `tile` (None: the default tiles), compiled for `target` (targets.parse_target:
    this machine's CPU by default)."""
    import tvm

    from ..schedules import gated_kernel
    from ..targets import parse_target

    f = gated_kernel(spec.kind, spec.groups, spec.group_size, spec.dim, spec.dtype, spec.layout, "llvm",
                     cpu_tile=tile)
    return tvm.compile(f.with_attr("global_symbol", "main"), target=parse_target(target))["main"]


def run_cpu(tokens=(1, 16, 64), sparsity: float = 0.5, knobs: dict | None = None, progress=print,
            target: str = "llvm", dtypes=tuple(CPU_DTYPES)) -> dict:
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from ..passes import LowerGatedLayers, wide_pipeline
    from ..schedules.tiles import tiles_from_log
    from ..targets import parse_target
    from .build import dense_module

    workloads = cpu_workloads(dtypes)
    tgt = parse_target(target)
    dense_vms = {}
    with tgt:
        for dt in dtypes:  # one module per dtype: the dense functions are named by shape alone
            dense_vms[dt] = rvm.VirtualMachine(tvm.compile(
                dense_module([w for w in workloads if w.dtype == dt]), tgt,
                relax_pipeline=wide_pipeline(tgt, LowerGatedLayers("llvm", enabled=False))), tvm.cpu())
    limits = cpu_limits()
    progress(f"this CPU: {limits['bandwidth_gbs']:.1f} GB/s read, {limits['tensor_tflops'] * 1e3:.0f} GFLOP/s fp32 "
             "matmul (torch)")
    cache = last_level_cache_bytes()
    rng = np.random.default_rng(0)
    rows = []
    for w in workloads:
        spec = w.spec("llvm")
        entry = (knobs or {}).get(spec.key, {})
        tile = tiles_from_log(entry["cpu"]) if "cpu" in entry else None
        fn = build_cpu(spec, tile, target)
        wcat32 = (rng.standard_normal((w.n * w.weights, w.k)) / np.sqrt(w.k)).astype("float32")
        wcat = wcat32.astype(w.dtype)
        copies = weight_copies(wcat.nbytes, cache)  # every call of a timing loop reads weights no other call left in cache
        wts = [torch.from_numpy(wcat32).to(getattr(torch, w.dtype), copy=True) for _ in range(copies)]
        wtvm = tvm.runtime.tensor(wcat)  # TVM dense: seconds a call, the cache is no matter
        if spec.layout in ("kn", "kp"):  # as wide-compile stores it for the CPU
            parts = [[tvm.runtime.tensor(pack(wcat, spec.layout))] * 2 for _ in range(copies)]
        else:
            parts = [[tvm.runtime.tensor(np.ascontiguousarray(wcat[:w.n])),
                      tvm.runtime.tensor(np.ascontiguousarray(wcat[w.n:] if w.swiglu else wcat))] for _ in range(copies)]
        del wcat32
        for m in tokens:
            x32 = rng.standard_normal((m, w.k)).astype("float32")
            xt, xtvm = torch.from_numpy(x32).to(getattr(torch, w.dtype)), tvm.runtime.tensor(x32.astype(w.dtype))
            # torch apart: its OpenMP threads spin after a call
            t_torch = time_call(lambda wt: torch.matmul(xt, wt.t()), [[wt] for wt in wts])
            t_tvm = time_call(lambda: dense_vms[w.dtype][w.dense](xtvm, wtvm), [[]], max_s=20)
            calls = {}
            sparse_mask = make_mask("random", m, w.groups, rng, sparsity)
            limit = roofline_us(w, m, sparse_mask, limits)
            for label, mask in (("sparse", sparse_mask), ("dense", np.ones((m, w.groups), np.int32))):
                counts, order, used = (tvm.runtime.tensor(v) for v in ref_mask_reorder(mask))
                out = tvm.runtime.tensor(np.zeros((m, w.n), w.dtype))
                tail = [tvm.runtime.tensor(mask), counts, order, used, out]
                calls[label] = (fn, [[xtvm, *(p if w.kind == "gemm_mn" else p[:1]), *tail] for p in parts])
            times = time_interleaved(calls)
            row = {"workload": w.name, "dtype": w.dtype, "tokens": m, "sparsity": sparsity, "torch_us": t_torch,
                   "tvm_dense_us": t_tvm, "ours_us": times["sparse"], "ours_all_active_us": times["dense"],
                   "speedup_vs_same_kernel_dense": times["dense"] / times["sparse"],
                   "speedup_vs_torch": t_torch / times["sparse"], "limit_us": limit,
                   "limit_speedup_vs_torch": t_torch / limit, "tile": entry.get("cpu"), "weight_copies": copies}
            rows.append(row)
            progress(f"{w.name:18s} M={m:3d} torch {t_torch:9.0f} us  TVM dense {t_tvm:10.0f} us  ours "
                     f"{times['sparse']:9.0f} us  ours all-active {times['dense']:9.0f} us  "
                     f"x{row['speedup_vs_same_kernel_dense']:.2f} vs same kernel dense  x{row['speedup_vs_torch']:.2f} "
                     f"vs torch  limit {limit:9.0f} us ({limit / times['sparse']:.0%} of it)")
    return {"device": "CPU (this machine)", "target": str(tgt), "cpu": _cpu_name(), "limits": limits,
            "last_level_cache_bytes": cache, "torch": torch.__version__, "rows": rows}


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for the JSON."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"
