"""Call a benchmark build's gated kernel back to back on the GPU, every output checked against torch on the device.

    python3 tools/stress_bench_kernel.py BUILD_DIR o_proj_h4 --tokens 4096 2048 --masks skewed random \
        --calls 10000 --between flush matmul

A race between the threads of a kernel or between its launches can show only when calls run back to back, never in
tools/gpu_check.py's calls checked one at a time: the O projection over mask-ordered tokens, whose TMA mbarriers one
thread initialised without a block barrier before the others' first wait, crashed ("unspecified launch failure")
within 2000 back-to-back calls on the H200 and passed gpu_check (docs/performance.md, 2026-12-04, ninth session).
Each (tokens, mask kind) runs `--calls` calls in a process of its own (a crash ends its CUDA context), each call on
the next of 8 masks at --sparsity, with no synchronisation but one every 2000 calls (to report progress); the
worst relative error against the float32 torch reference (bench.measure.torch_reference) accumulates on the
device. `--between` puts an L2 flush (a read of 4x the L2) and / or a cuBLAS GEMM before each call, as the
benchmark's timing loop does. Exit status 0 only if every run finished with no output past --tol.
Runs on the GPU host from the source tree: `. .gpu/env.sh && PYTHONPATH=$PWD python3 tools/stress_bench_kernel.py ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MASK_DRAWS = 8
PROGRESS_EVERY = 2000


def stress_one(build_dir: str, name: str, tokens: int, kind: str, calls: int, sparsity: float, between: list[str],
               seed: int) -> dict:
    """`calls` back-to-back calls of workload `name`'s kernel at `tokens` tokens; its worst error and time."""
    import numpy as np
    import torch
    import tvm

    from wide_tvm.bench import measure
    from wide_tvm.bench.workloads import Workload
    from wide_tvm.runtime import ensure_cuda_runtime

    spec_path = os.path.join(build_dir, "bench.json")
    if not os.path.exists(spec_path):
        raise SystemExit(f"error: {spec_path} does not exist: BUILD_DIR must be a `wide-bench build` folder")
    with open(spec_path) as f:
        spec = json.load(f)
    ensure_cuda_runtime(tvm)
    tv = tvm.runtime.from_dlpack
    found = [Workload(**v) for v in spec["workloads"] if v["name"] == name]
    if not found:
        raise SystemExit(f"error: {spec_path} has no workload {name!r} "
                         f"(it has {', '.join(v['name'] for v in spec['workloads'])})")
    w = found[0]
    ours = tvm.runtime.load_module(os.path.join(build_dir, "ours.so"))
    kernel, reorder = ours[w.kernel], ours[w.reorder]
    masks = [torch.from_numpy(m).cuda()
             for m in measure.mask_pool(kind, tokens, w.groups, np.random.default_rng(seed), sparsity, MASK_DRAWS)]
    # one weight set (the benchmark's rotating sets with an L2 size of 0: W [n * weights, k] and ours packed)
    wts = measure._rotating_weights(w, 0, tv, spec.get("layouts", {}).get(w.name, "nk"))()
    wcat = wts[0]
    x = torch.randn(tokens, w.k, device="cuda").half()
    refs = [measure.torch_reference(w, x, wcat, m) for m in masks]
    scales = [r.abs().max().clamp_min(1e-30) for r in refs]
    r_args = [measure._reorder_args(w, m, tv) for m in masks]
    out = torch.empty(tokens, w.n, dtype=torch.float16, device="cuda")
    flush = measure.l2_flush_buffer() if "flush" in between else None
    worst = torch.zeros((), device="cuda")
    t0 = time.time()
    for i in range(calls):
        j = i % MASK_DRAWS
        if flush is not None:
            flush.sum()
        if "matmul" in between:
            torch.matmul(x, wcat.t())
        out.fill_(float("nan"))  # a row the kernel leaves unwritten shows
        reorder(*r_args[j])
        measure._launch(kernel, w, tv(x), wts, r_args[j], tv(out))
        err = torch.nan_to_num((out.float() - refs[j]).abs().max() / scales[j], nan=float("inf"))
        worst = torch.maximum(worst, err)
        if (i + 1) % PROGRESS_EVERY == 0:
            torch.cuda.synchronize()
            print(f"  {i + 1} calls, worst rel err {float(worst):.2e}", flush=True)
    torch.cuda.synchronize()
    return {"workload": name, "tokens": tokens, "mask": kind, "calls": calls, "between": between,
            "worst_rel_err": float(worst), "seconds": time.time() - t0, "device": torch.cuda.get_device_name(0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build_dir", help="a `wide-bench build` folder")
    p.add_argument("workload", help="a workload of its bench.json, e.g. o_proj_h4")
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 2048])
    p.add_argument("--masks", nargs="+", default=["skewed", "random"])
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--between", nargs="*", default=[], choices=["flush", "matmul"])
    p.add_argument("--tol", type=float, default=1e-2, help="largest relative error that passes (fp16 output)")
    p.add_argument("--json", help="write the runs' results here")
    p.add_argument("--one", nargs=2, metavar=("TOKENS", "MASK"), help=argparse.SUPPRESS)  # a child run
    args = p.parse_args(argv)
    if args.one:
        res = stress_one(args.build_dir, args.workload, int(args.one[0]), args.one[1], args.calls, args.sparsity,
                         args.between, seed=int(args.one[0]))
        print("RESULT " + json.dumps(res))
        return 0
    results, ok = [], True
    for tokens in args.tokens:
        for kind in args.masks:
            cmd = [sys.executable, os.path.abspath(__file__), args.build_dir, args.workload, "--one", str(tokens),
                   kind, "--calls", str(args.calls), "--sparsity", str(args.sparsity)]
            cmd += ["--between", *args.between] if args.between else []
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
                why = next((ln.strip() for ln in reversed(lines) if "error" in ln.lower()), lines[-1])  # the CUDA error
                res = {"workload": args.workload, "tokens": tokens, "mask": kind, "calls": args.calls,
                       "crashed": f"exit status {proc.returncode}: {why}"}
                ok = False
            else:
                res = json.loads(line[0][len("RESULT "):])
                ok = ok and res["worst_rel_err"] <= args.tol
            results.append(res)
            print(f"{args.workload} {tokens:6d} tokens {kind:7s} {args.calls} calls: "
                  + (res["crashed"] if "crashed" in res else
                     f"worst rel err {res['worst_rel_err']:.2e} ({res['seconds']:.1f} s)"), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"build": args.build_dir, "between": args.between, "tol": args.tol, "runs": results}, f,
                      indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
