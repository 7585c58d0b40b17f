"""Time the built kernels on the GPU (TVM runtime only) next to torch.matmul, with their rooflines.

Every time is the median of CUDA-event-timed calls (warm-up excluded, the L2 flushed by a read before each
call; `timer="do_bench"` uses triton's do_bench instead); weights rotate over enough copies to exceed the L2.
The candidates of one comparison (cuBLAS, TVM dense, ours) are timed interleaved, call by call: under sustained
tensor-core load the H200's clock falls within seconds (the same kernel measured 885 and 1040 us a few seconds
apart), so timing them one after the other would credit whichever ran first with the cooler GPU.

Each row draws several masks (`draws`) and every timed call takes the next one: at a few tokens the number of
groups a single draw uses varies by about +-10 % (for Q/O's 8 groups far more), so one draw's speedup says more
about the draw than about the kernel; the median over calls cycling through the draws is the median draw's.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from ..kernel_reference import make_mask
from ..weight_layout import pack
from .report import times
from ..knobs import DECODE_BUCKETS
from .workloads import (MASKS, PREFILL_SWEEP_TOKENS, SPARSITIES, SWEEP_TOKENS, TOKENS, Workload,
                        swept_variants, tile_bucket, variant_name)


TIMERS = ("events", "do_bench")


def _timer(kind: str = "events"):
    """(time_us(*fns), description): the median microseconds of fn, or a list of them for several fns (timed
    interleaved with the events timer). "events": median of CUDA-event-timed calls, each after an L2 flush that
    *reads* a buffer four times the L2 size, so the L2 holds only clean lines when the timed call starts.
    "do_bench": triton.testing.do_bench, whose flush *writes* its buffer: the timed call then pays for
    writing those dirty lines back to DRAM (8-14 us more per call on the H200, docs/performance.md), which no
    model's kernel sees, since the kernel before it leaves only its small output dirty."""
    if kind == "do_bench":
        from triton.testing import do_bench

        def bench(*fns):
            t = [float(do_bench(fn, warmup=10, rep=40, return_mode="median")) * 1e3 for fn in fns]
            return t[0] if len(fns) == 1 else t

        return bench, "triton.do_bench median"
    if kind != "events":
        raise ValueError(f"unknown timer {kind!r}; one of {', '.join(TIMERS)}")
    flush = l2_flush_buffer()

    def events(*fns):
        # flush.sum() reads 4x the L2: weights and inputs leave it, and no dirty lines enter
        t = event_medians_us(list(fns), flush.sum)
        return t[0] if len(fns) == 1 else t

    return events, "CUDA events median, candidates interleaved (L2 flushed by a read)"


def l2_flush_buffer():
    """A float32 buffer of 4x the L2 size in bytes; summing it evicts everything and dirties nothing."""
    import torch

    return torch.ones(torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.float32, device="cuda")


def event_median_us(fn, before, reps: int = 50) -> float:
    """Median microseconds of `reps` CUDA-event-timed calls of fn, each after before() (3 warm-up calls)."""
    return event_medians_us([fn], before, reps)[0]


def event_medians_us(fns: list, before, reps: int = 50) -> list[float]:
    """Median microseconds of `reps` CUDA-event-timed calls of each of fns, interleaved (call r of every fn
    before call r + 1 of any), each after before() (3 warm-up calls each); all calls are queued before one
    synchronisation."""
    import torch

    for fn in fns:
        for _ in range(3):
            fn()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for _ in fns]
    for r in range(reps):
        for fn, ev in zip(fns, events):
            before()
            ev[r][0].record()
            fn()
            ev[r][1].record()
    torch.cuda.synchronize()
    return [float(np.median([s.elapsed_time(e) * 1e3 for s, e in ev])) for ev in events]


def _rotating(make, copies: int):
    """A callable cycling through `copies` argument sets, so weights come from DRAM, not L2."""
    sets = [make(i) for i in range(copies)]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % copies
        return sets[state["i"]]

    return nxt


def mask_pool(kind: str, m: int, groups: int, rng, sparsity: float, draws: int) -> list[np.ndarray]:
    """`draws` fresh [m, groups] masks of one row (each call of the row takes the next, see the module docstring)."""
    if draws < 1:
        raise ValueError(f"mask draws must be >= 1, got {draws}")
    return [make_mask(kind, m, groups, rng, sparsity) for _ in range(draws)]


def pool_limit_us(w: Workload, m: int, masks: list[np.ndarray], limits: dict) -> float:
    """Roofline time of a row whose calls cycle through `masks`: the median of the draws' limits (as the row's
    times are medians over those calls)."""
    return float(np.median([roofline_us(w, m, mk, limits) for mk in masks]))


def used_groups(mask: np.ndarray) -> int:
    """Groups that at least one token of `mask` runs (the weight slices a memory-bound kernel must read)."""
    return int((mask.sum(axis=0) > 0).sum())


def _rotating_weights(w: Workload, l2: int, tv, layout: str = "nk"):
    """Rotating weight sets of `w` (W [n * weights, k] in torch, [W_gate, W_up] or [W] as TVM tensors in our
    kernels' `layout`, W as a TVM tensor, and the dense fallback's weights as the model stores them: [W_gate,
    W_up], [W, W] (Q) or [W], [N, K]), enough copies to exceed the L2 cache three times. (A repacked layout's
    fallback copy is a second array, as a compiled model keeps it.)"""
    import torch

    copies = max(1, math.ceil(3 * l2 / (w.n * w.k * 2 * w.weights * (1 if layout == "nk" else 2))))

    def make(_i):
        wcat = (torch.randn(w.n * w.weights, w.k, device="cuda") / math.sqrt(w.k)).half()
        ours = [pack(v, layout) for v in (wcat[:w.n], wcat[w.n:] if w.swiglu else wcat)]
        dense = [wcat[:w.n], wcat[w.n:]] if w.swiglu else [wcat, wcat] if w.kind == "gemm_mn" else [wcat]
        return wcat, [tv(v) for v in ours], tv(wcat), [tv(v) for v in dense]

    return _rotating(make, copies)


def _reorder_args(w: Workload, mask, tv) -> list:
    """TVM views of (mask, counts, order, used): the mask reorder's input and outputs."""
    import torch

    m = mask.shape[0]
    return [tv(v) for v in (mask, torch.empty(w.groups, dtype=torch.int32, device="cuda"),
                            torch.empty(w.groups, m, dtype=torch.int32, device="cuda"),
                            torch.empty(w.groups + 1, dtype=torch.int32, device="cuda"))]


def _launch(fn, w: Workload, xt, wts, r_args, out, dense: bool = False) -> None:
    """One call of a gated kernel, (x or a, W_gate [, W_up], mask, counts, order, used, out); `dense`: of its
    dense fallback, which takes the weights as stored before `out` (schedules/dense_fallback.py)."""
    extra = wts[3] if dense else []
    if w.kind == "gemm_mn":
        fn(xt, wts[1][0], wts[1][1], r_args[0], r_args[1], r_args[2], r_args[3], *extra, out)
    else:
        fn(xt, wts[1][0], r_args[0], r_args[1], r_args[2], r_args[3], *extra, out)


def device_limits(timer) -> dict:
    """Measured DRAM bandwidth (device copy) and dense fp16 tensor-core throughput (cuBLAS 8192^3)."""
    import torch

    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = timer(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    t_mm = timer(lambda: torch.matmul(a, b))
    del src, dst
    return {"bandwidth_gbs": 2 * (2 << 30) / t_copy * 1e-3, "tensor_tflops": 2 * 8192 ** 3 / t_mm * 1e-6}


def roofline_us(w: Workload, m: int, mask: np.ndarray, limits: dict) -> float:
    """Roofline time of the gated work: used groups' weight bytes + activations, or active FLOPs (limits: the
    device's measured bandwidth in GB/s and dense throughput in TFLOP/s; CPU: bench/cpu.py cpu_limits)."""
    counts = mask.sum(axis=0)
    used = used_groups(mask)
    other = w.k if w.kind == "gemm_mn" else w.n  # the weight dimension that is not grouped
    size = np.dtype(w.dtype).itemsize
    w_bytes = used * w.group_size * other * size * w.weights
    io_bytes = size * m * (w.k + w.n)
    flops = 2 * int(counts.sum()) * w.group_size * other * w.weights
    return max((w_bytes + io_bytes) / (limits["bandwidth_gbs"] * 1e3), flops / (limits["tensor_tflops"] * 1e6))


def run(build_dir: str, tokens=TOKENS, sparsities=SPARSITIES, masks=MASKS, only: list[str] | None = None,
        progress=print, json_path: str | None = None, timer: str = "events", draws: int = 8) -> dict:
    """Measure every workload, each row over `draws` masks; with `json_path`, the result so far is rewritten
    after each workload."""
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from ..blas.libraries import load as load_blas
    from ..runtime import ensure_cuda_runtime

    ensure_cuda_runtime(tvm)
    dev = tvm.cuda(0)
    with open(os.path.join(build_dir, "bench.json")) as f:
        spec = json.load(f)
    ours = tvm.runtime.load_module(os.path.join(build_dir, "ours.so"))
    dense_vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(build_dir, "tvm_dense.so")), dev)
    load_blas([spec.get("blas", "cublasLt")])
    blas_vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(build_dir, "blas_dense.so")), dev)
    timer, how = _timer(timer)
    limits = device_limits(timer)
    progress(f"measured: DRAM {limits['bandwidth_gbs']:.0f} GB/s, dense fp16 tensor cores "
             f"{limits['tensor_tflops']:.0f} TFLOP/s")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    tv = tvm.runtime.from_dlpack
    rows = []
    result = {"device": torch.cuda.get_device_name(0), "timer": how, "limits": limits, "rows": rows}
    rng = np.random.default_rng(0)
    for wj in spec["workloads"]:
        w = Workload(**wj)
        if only and w.name not in only:
            continue
        weights = _rotating_weights(w, l2, tv, spec.get("layouts", {}).get(w.name, "nk"))
        kernel, reorder = ours[w.kernel], ours[w.reorder]
        fallback = ours[w.fallback]
        for m in tokens:
            x = torch.randn(m, w.k, device="cuda").half()
            xt = tv(x)
            for sp in sparsities:
                for mk in masks:
                    pool = mask_pool(mk, m, w.groups, rng, sp, draws)
                    mask_t = [torch.from_numpy(v).cuda() for v in pool]
                    out = torch.empty(m, w.n, dtype=torch.float16, device="cuda")
                    r_pool = [_reorder_args(w, v, tv) for v in mask_t]
                    next_args, next_reorder, next_kernel = (_rotating(lambda i: r_pool[i], draws) for _ in range(3))
                    for r_args in r_pool:  # every draw's counts and order exist before the kernel alone reads them
                        reorder(*r_args)

                    def call(wts, r_args, w=w, xt=xt, out=out):
                        _launch(kernel, w, xt, wts, r_args, tv(out))

                    def ours_call():  # reorder + kernel on the same draw, as a model runs them
                        r_args = next_args()
                        reorder(*r_args)
                        call(weights(), r_args)

                    def fallback_call():  # reorder (a model still runs it) + the dense fallback
                        r_args = next_args()
                        reorder(*r_args)
                        _launch(fallback, w, xt, weights(), r_args, tv(out), dense=True)

                    def dense_ffn():  # what a dense FFN runs for gate/up: the GEMM and its SwiGLU
                        h = torch.matmul(x, weights()[0].t())
                        return torch.nn.functional.silu(h[:, :w.n]) * h[:, w.n:]

                    t_cublas, t_tvm, t_blas, t_reorder, t_kernel, t_ours, t_fallback, *t_swiglu = timer(
                        lambda: torch.matmul(x, weights()[0].t()), lambda: dense_vm[w.dense](xt, weights()[2]),
                        lambda: blas_vm[w.dense](xt, weights()[2]),
                        lambda: reorder(*next_reorder()), lambda: call(weights(), next_kernel()), ours_call,
                        fallback_call, *([dense_ffn] if w.swiglu else []))
                    err = max(_check(w, x, weights(), mask, out, lambda wts, a=r_args: call(wts, a))
                              for mask, r_args in zip(mask_t, r_pool))
                    fb_err = max(_check_fallback(w, x, weights(), mask, out, fallback, r_args, tv)
                                 for mask, r_args in zip(mask_t, r_pool))
                    limit = pool_limit_us(w, m, pool, limits)
                    used = [used_groups(v) for v in pool]
                    row = {"workload": w.name, "key": w.spec("cuda").key, "kind": w.kind,
                           "group_size": w.group_size, "tokens": m,
                           "sparsity": sp, "mask": mk, "measured_sparsity": float(1 - np.mean(pool)),
                           "mask_draws": draws, "used_groups": used,
                           "cublas_us": t_cublas, "tvm_dense_us": t_tvm, "blas_dense_us": t_blas, "ours_us": t_ours,
                           "fallback_us": t_fallback, "fallback_rel_err": fb_err,
                           # gate/up: torch's GEMM then its SwiGLU (the dense FFN's work up to down's input)
                           **({"cublas_swiglu_us": t_swiglu[0]} if t_swiglu else {}),
                           "kernel_us": t_kernel, "reorder_us": t_reorder, "limit_us": limit,
                           "speedup_vs_cublas": t_cublas / t_ours,
                           # (an all-skipped row, s = 1, has no work: no limit ratio; its time is the fixed cost)
                           "limit_speedup_vs_cublas": t_cublas / limit if limit > 0 else None,
                           "dense_limit_speedup": 1 / (1 - sp) if sp < 1 else None,
                           "rel_err": err}
                    rows.append(row)
                    progress(f"{w.name:14s} M={m:5d} s={sp:.2f} {mk:7s} cuBLAS {t_cublas:9.1f} us  TVM dense "
                             f"{t_tvm:9.1f} us  our cuBLASLt {t_blas:9.1f} us  ours {t_ours:9.1f} us "
                             f"(reorder {t_reorder:6.1f})  fallback {t_fallback:9.1f} us  "
                             f"x{t_cublas / t_ours:5.2f}  limit {times(row['limit_speedup_vs_cublas'])}  err {err:.1e}  "
                             f"used groups {min(used)}-{max(used)} of {w.groups}")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=1)
    return result


def torch_reference(w: Workload, x, wcat, mask):
    """float32 torch reference of `w` on x [M, k], W [n * weights, k] (gate rows, then up rows) and mask [M, groups]
    (any torch device)."""
    import torch

    wcat = wcat.float()
    expand = torch.repeat_interleave(mask.float(), w.group_size, dim=1)
    if w.kind == "gemm_mn":
        h = x.float() @ wcat.t()
        if w.swiglu:
            h = torch.nn.functional.silu(h[:, :w.n]) * h[:, w.n:]
        return h * expand
    return (x.float() * expand) @ wcat.t()


def _check(w: Workload, x, wts, mask, out, call) -> float:
    """Relative error of our output against a float32 torch reference on the same weights."""
    import torch

    call(wts)
    torch.cuda.synchronize()
    return _rel_err(out.float(), torch_reference(w, x, wts[0], mask))


def _rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (max |got| where the reference is all zero), float32 torch tensors."""
    scale = ref.abs().max().item()
    return float((got - ref).abs().max().item() / scale) if scale > 0 else float(got.abs().max().item())



def _check_fallback(w: Workload, x, wts, mask, out, fn, r_args, tv) -> float:
    """Relative error of the dense fallback against the float32 torch reference, fed as a model feeds it: a
    gemm_k whose input a gemm_mn wrote gets it zero where skipped; an unmasked gemm_mn output is compared where
    active."""
    import torch

    expand = torch.repeat_interleave(mask.to(x.dtype), w.group_size, dim=1)
    xin = x * expand if w.input_masked else x
    _launch(fn, w, tv(xin), wts, r_args, tv(out), dense=True)
    torch.cuda.synchronize()
    got = out.float() if w.output_masked else out.float() * expand.float()
    return _rel_err(got, torch_reference(w, x, wts[0], mask))


def _bucket(w: Workload, m: int):
    """The kernel that runs m tokens: a direct-kernel bucket (schedules.gemv.DECODE_BUCKETS: 1, 8, 16, 32, 64
    tokens) up to the workload's direct bound, else a many-token bucket (tiles128, tiles512, tiles)."""
    return tile_bucket(m) if m > w.direct_tokens else next(b for b in DECODE_BUCKETS if m <= b)


def sweep(build_dir: str, tokens=SWEEP_TOKENS + PREFILL_SWEEP_TOKENS, sparsity: float = 0.5, progress=print,
          timer: str = "events") -> dict:
    """Time every knob candidate (built by `wide-bench build --sweep`) on random masks, checking each one's
    output against torch; pick per workload and kernel (direct-kernel token buckets 1, <= 8, <= 16, <= 32,
    <= 64; the tile kernel past them) the least summed time."""
    import torch
    import tvm

    from ..runtime import ensure_cuda_runtime

    ensure_cuda_runtime(tvm)
    with open(os.path.join(build_dir, "bench.json")) as f:
        spec = json.load(f)
    ours = tvm.runtime.load_module(os.path.join(build_dir, "ours.so"))
    timer, how = _timer(timer)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    tv = tvm.runtime.from_dlpack
    rng = np.random.default_rng(1)
    rows, best, totals = [], {}, {}
    for wj in spec["workloads"]:
        w = Workload(**wj)
        weights = _rotating_weights(w, l2, tv, spec.get("layouts", {}).get(w.name, "nk"))
        for m in tokens:
            cands = swept_variants(w, m, spec.get("wgmma", False), spec.get("sweep"))
            if not cands:  # a build of the tile (or wgmma) candidates alone
                continue
            mask = torch.from_numpy(make_mask("random", m, w.groups, rng, sparsity)).cuda()
            r_args = _reorder_args(w, mask, tv)
            ours[w.reorder_always](*r_args)
            xt_torch = torch.randn(m, w.k, device="cuda").half()
            out_torch = torch.empty(m, w.n, dtype=torch.float16, device="cuda")
            xt, out = tv(xt_torch), tv(out_torch)
            fns = [ours[f"{w.kernel}_{variant_name(w, m, v)}"] for v in cands]  # schedules is not importable here
            times = timer(*[lambda fn=fn: _launch(fn, w, xt, weights(), r_args, out) for fn in fns])
            for v, fn, t in zip(cands, fns, times if len(fns) > 1 else [times]):
                name = variant_name(w, m, v)
                err = _check(w, xt_torch, weights(), mask, out_torch, lambda wts, fn=fn: _launch(fn, w, xt, wts, r_args, out))
                if not err < 2e-3:
                    raise RuntimeError(f"{w.name} {name} at {m} tokens: relative error {err:.1e}")
                rows.append({"workload": w.name, "tokens": m, "knobs": name, "kernel_us": t, "rel_err": err})
                total = totals.setdefault(f"{w.name}/{_bucket(w, m)}", {}).setdefault(name, [v, 0.0, []])
                total[1] += t
                total[2].append(m)
            progress(f"{w.name:14s} M={m:3d} " + "  ".join(f"{r['knobs']} {r['kernel_us']:6.1f}"
                                                          for r in rows if r["workload"] == w.name and r["tokens"] == m))
        del weights
    for key, per_knob in totals.items():  # per token bucket, the knobs with the least summed time over its counts
        name, (v, t, ms) = min(per_knob.items(), key=lambda kv: kv[1][1])
        if "/tiles" in key:
            best[key] = {"knobs": name, "tile": list(v), "summed_us": t, "tokens": ms}
            continue
        best[key] = {"knobs": name, "warps": v[0], "unroll": v[1], "rows": v[2] if len(v) > 2 else 1,
                     "stages": v[3] if len(v) > 3 else 0, "row_warps": v[4] if len(v) > 4 else 1,
                     "ksplit": v[5] if len(v) > 5 else 1,
                     "summed_us": t, "tokens": ms}
    return {"device": torch.cuda.get_device_name(0), "timer": how, "sparsity": sparsity, "rows": rows, "best": best}
