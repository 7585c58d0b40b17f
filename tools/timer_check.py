"""Check the benchmark timer on the GPU host: does host launch time leak into the event-timed interval?

    . .gpu/env.sh && PYTHONPATH=$PWD python3 tools/timer_check.py bench_build   (after `wide-bench build`)

Times our one-token kernel and cuBLAS (gate/up and down, group 128) after one L2 flush by a read, after three,
and after a flush plus a 1 ms GPU sleep (the host is then far ahead of the GPU), and prints the host time per
call. If the three agree, the single flush already keeps the GPU busy while the host launches.

Two more placements of the time that Nsight Compute does not see: "flush + idle launch" launches our kernel
once with an all-skip mask (every block exits at once, nothing is read) between the flush and the timed call,
so a cost of switching from the flush kernel to ours (e.g. the SMs' shared-memory carveout) is paid before the
timer starts; "back-to-back" times 20 calls in one event pair (weights rotating, no flush between them) and
gives the mean per call.

Then, for each one-token workload, the fixed cost of a launch: an empty event pair, a one-element torch kernel and
our kernel with an all-skip mask (each after a flush), against our kernel with every group active (beside cuBLAS)
and with exactly half the groups active (8 draws: the spread that placement alone causes).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import tvm

from wide_tvm.bench.measure import _launch, _reorder_args, _rotating_weights, event_median_us, l2_flush_buffer
from wide_tvm.bench.workloads import Workload
from wide_tvm.kernel_reference import make_mask
from wide_tvm.runtime import _ensure_cuda_runtime


def host_us(fn, reps: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def back_to_back_us(fn, flush, calls: int = 20, reps: int = 10) -> float:
    """Median over `reps` of the mean microseconds per call of `calls` calls timed in one event pair."""
    times = []
    for _ in range(reps + 1):
        flush.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return float(np.median(times[1:]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("build_dir")
    args = p.parse_args()
    _ensure_cuda_runtime(tvm)
    with open(os.path.join(args.build_dir, "bench.json")) as f:
        spec = json.load(f)
    ours = tvm.runtime.load_module(os.path.join(args.build_dir, "ours.so"))
    tv = tvm.runtime.from_dlpack
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = l2_flush_buffer()
    befores = {"flush x1": lambda: flush.sum(),
               "flush x3": lambda: (flush.sum(), flush.sum(), flush.sum()),
               "flush + 1 ms sleep": lambda: (flush.sum(), torch.cuda._sleep(2_000_000))}
    rng = np.random.default_rng(0)
    for name in ("gate_up_g128", "down_g128"):
        w = Workload(**next(x for x in spec["workloads"] if x["name"] == name))
        weights = _rotating_weights(w, l2, tv, spec["layouts"][name])
        r_args = _reorder_args(w, torch.from_numpy(make_mask("random", 1, w.groups, rng, 0.5)).cuda(), tv)
        x = torch.randn(1, w.k, device="cuda").half()
        xt, out = tv(x), tv(torch.empty(1, w.n, dtype=torch.float16, device="cuda"))
        kernel, w_dense = ours[w.kernel], weights()[0]

        def call():
            _launch(kernel, w, xt, weights(), r_args, out)

        def cublas():
            torch.matmul(x, w_dense.t())

        idle_args = _reorder_args(w, torch.zeros(1, w.groups, dtype=torch.int32, device="cuda"), tv)

        def idle():
            _launch(kernel, w, xt, weights(), idle_args, out)

        for label, before in befores.items():
            print(f"{name} {label:20s} ours {event_median_us(call, before):7.1f} us   "
                  f"cuBLAS {event_median_us(cublas, before):7.1f} us")
        print(f"{name} {'flush + idle launch':20s} ours {event_median_us(call, lambda: (flush.sum(), idle())):7.1f} us")
        print(f"{name} {'back-to-back x20':20s} ours {back_to_back_us(call, flush):7.1f} us   "
              f"cuBLAS {back_to_back_us(lambda: torch.matmul(x, weights()[0].t()), flush):7.1f} us")
        print(f"{name} host time per call: ours {host_us(call):.1f} us, cuBLAS {host_us(cublas):.1f} us")
    launch_floor(spec, ours, flush, l2)


def launch_floor(spec: dict, ours, flush, l2: int) -> None:
    """The fixed cost of one launch against the time of the work (module docstring)."""
    tv = tvm.runtime.from_dlpack
    tiny = torch.zeros(1, device="cuda")
    print(f"empty event pair {event_median_us(lambda: None, flush.sum):.1f} us, one-element torch kernel "
          f"{event_median_us(lambda: tiny.add_(1), flush.sum):.1f} us")
    rng = np.random.default_rng(1)
    for wj in spec["workloads"]:
        w = Workload(**wj)
        weights = _rotating_weights(w, l2, tv, spec["layouts"][w.name])
        x = torch.randn(1, w.k, device="cuda").half()
        xt, out = tv(x), tv(torch.empty(1, w.n, dtype=torch.float16, device="cuda"))

        def timed(mask, reps=50):
            args = _reorder_args(w, torch.from_numpy(mask).cuda(), tv)
            return event_median_us(lambda: _launch(ours[w.kernel], w, xt, weights(), args, out), flush.sum, reps)

        half = []
        for _ in range(8):
            m = np.zeros((1, w.groups), np.int32)
            m[0, rng.permutation(w.groups)[: w.groups // 2]] = 1
            half.append(timed(m, 20))
        print(f"{w.name:13s} idle launch {timed(np.zeros((1, w.groups), np.int32)):5.1f} us  every group "
              f"{timed(np.ones((1, w.groups), np.int32)):6.1f} us (cuBLAS "
              f"{event_median_us(lambda: torch.matmul(x, weights()[0].t()), flush.sum):6.1f} us)  half the groups "
              f"{min(half):6.1f}-{max(half):6.1f} us")


if __name__ == "__main__":
    main()
