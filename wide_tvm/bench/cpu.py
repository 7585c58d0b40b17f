"""CPU side of wide-bench, measured on this machine: our llvm kernels at a sparsity and with every group
active (the same kernels, dense), TVM dense (wide-compile's pipeline without gating) and torch.matmul."""

from __future__ import annotations

import numpy as np

import time

from ..kernel_reference import make_mask, ref_mask_reorder
from .measure import roofline_us
from ..weight_layout import pack
from ..tune import KernelSpec, cpu_layout
from .workloads import Workload

CPU_WORKLOADS = [  # Llama-3.1-8B FFN shapes in fp32 (x86 has no fast fp16 arithmetic); gemm_k weights [K, N]
    Workload("gate_up_g128", "gemm_mn", 112, 128, 4096, swiglu=True, dtype="float32"),
    Workload("down_g128", "gemm_k", 112, 128, 4096, dtype="float32"),
]


def time_call(fn, args, reps: int = 5) -> float:
    """Median wall time in microseconds (one warm-up call)."""
    fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def cpu_limits(reps: int = 5) -> dict:
    """This machine's measured read bandwidth (torch's sum of 1 GB, every core) and dense fp32 throughput (torch's
    2048^3 matmul), the roofline of measure.roofline_us in its keys (TFLOP/s under "tensor_tflops")."""
    import torch

    buf = torch.ones(1 << 28)  # 1 GB of fp32
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    t_read = time_call(lambda: buf.sum(), [], reps)
    t_mm = time_call(lambda: torch.matmul(a, b), [], reps)
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
            target: str = "llvm") -> dict:
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from ..passes import LowerGatedLayers, wide_pipeline
    from ..schedules.tiles import tiles_from_log
    from ..targets import parse_target
    from .build import dense_module

    tgt = parse_target(target)
    with tgt:
        dense_vm = rvm.VirtualMachine(tvm.compile(dense_module(CPU_WORKLOADS), tgt, relax_pipeline=wide_pipeline(
            tgt, LowerGatedLayers("llvm", enabled=False))), tvm.cpu())
    limits = cpu_limits()
    progress(f"this CPU: {limits['bandwidth_gbs']:.1f} GB/s read, {limits['tensor_tflops'] * 1e3:.0f} GFLOP/s fp32 "
             "matmul (torch)")
    rng = np.random.default_rng(0)
    rows = []
    for w in CPU_WORKLOADS:
        spec = KernelSpec(w.kernel_kind, w.groups, w.group_size, w.dim, w.dtype, cpu_layout(w.kind, w.dim))
        entry = (knobs or {}).get(spec.key, {})
        tile = tiles_from_log(entry["cpu"]) if "cpu" in entry else None
        fn = build_cpu(spec, tile, target)
        wcat = (rng.standard_normal((w.n * w.weights, w.k)) / np.sqrt(w.k)).astype(w.dtype)
        wt = torch.from_numpy(wcat)
        wtvm = tvm.runtime.tensor(wcat)
        parts = [tvm.runtime.tensor(np.ascontiguousarray(wcat[:w.n])),
                 tvm.runtime.tensor(np.ascontiguousarray(wcat[w.n:] if w.swiglu else wcat))]
        if spec.layout in ("kn", "kp"):  # as wide-compile stores it for the CPU
            parts = [tvm.runtime.tensor(pack(wcat, spec.layout))] * 2
        for m in tokens:
            x = rng.standard_normal((m, w.k)).astype(w.dtype)
            xt, xtvm = torch.from_numpy(x), tvm.runtime.tensor(x)
            t_torch = time_call(lambda: torch.matmul(xt, wt.t()), [])
            t_tvm = time_call(lambda: dense_vm[w.dense](xtvm, wtvm), [])
            times = {}
            sparse_mask = make_mask("random", m, w.groups, rng, sparsity)
            limit = roofline_us(w, m, sparse_mask, limits)
            for label, mask in (("sparse", sparse_mask), ("dense", np.ones((m, w.groups), np.int32))):
                counts, order, used = (tvm.runtime.tensor(v) for v in ref_mask_reorder(mask))
                out = tvm.runtime.tensor(np.zeros((m, w.n), w.dtype))
                args = ([xtvm, parts[0], parts[1], tvm.runtime.tensor(mask), counts, order, used, out] if w.kind == "gemm_mn"
                        else [xtvm, parts[0], tvm.runtime.tensor(mask), counts, order, used, out])
                times[label] = time_call(fn, args)
            row = {"workload": w.name, "tokens": m, "sparsity": sparsity, "torch_us": t_torch, "tvm_dense_us": t_tvm,
                   "ours_us": times["sparse"], "ours_all_active_us": times["dense"],
                   "speedup_vs_same_kernel_dense": times["dense"] / times["sparse"],
                   "speedup_vs_torch": t_torch / times["sparse"], "limit_us": limit,
                   "limit_speedup_vs_torch": t_torch / limit, "tile": entry.get("cpu")}
            rows.append(row)
            progress(f"{w.name:13s} M={m:3d} torch {t_torch:9.0f} us  TVM dense {t_tvm:10.0f} us  ours "
                     f"{times['sparse']:9.0f} us  ours all-active {times['dense']:9.0f} us  "
                     f"x{row['speedup_vs_same_kernel_dense']:.2f} vs same kernel dense  x{row['speedup_vs_torch']:.2f} "
                     f"vs torch  limit {limit:9.0f} us ({limit / times['sparse']:.0%} of it)")
    return {"device": "CPU (this machine)", "target": str(tgt), "cpu": _cpu_name(), "limits": limits, "rows": rows}


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for the JSON."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"
