"""Launch chosen benchmark kernels a few times each, for Nsight Compute (`ncu`) to profile on the GPU host.

    ncu --clock-control none -k regex:bench_ --section SpeedOfLight ... \
        python3 tools/profile_kernels.py BUILD_DIR gate_up_g128:1 down_g128:1 [--cublas]

Each WORKLOAD:TOKENS runs the mask reorder and our kernel (50 % random mask) `--reps` times; `--cublas` adds
torch.matmul on the same shape, for a side-by-side profile of the dense baseline.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
import tvm

from wide_tvm.bench.measure import _launch, _reorder_args, _rotating_weights
from wide_tvm.bench.workloads import Workload
from wide_tvm.kernel_reference import make_mask
from wide_tvm.runtime import ensure_cuda_runtime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("build_dir")
    p.add_argument("cases", nargs="+", help="WORKLOAD:TOKENS, e.g. gate_up_g128:1")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--cublas", action="store_true")
    args = p.parse_args()
    ensure_cuda_runtime(tvm)
    with open(os.path.join(args.build_dir, "bench.json")) as f:
        spec = json.load(f)
    ours = tvm.runtime.load_module(os.path.join(args.build_dir, "ours.so"))
    workloads = {w["name"]: Workload(**w) for w in spec["workloads"]}
    tv = tvm.runtime.from_dlpack
    rng = np.random.default_rng(0)
    for case in args.cases:
        name, tokens = case.split(":")
        w, m = workloads[name], int(tokens)
        wts = _rotating_weights(w, 0, tv, spec.get("layouts", {}).get(name, "nk"))()
        x = torch.randn(m, w.k, device="cuda").half()
        mask = torch.from_numpy(make_mask("random", m, w.groups, rng, args.sparsity)).cuda()
        r_args = _reorder_args(w, mask, tv)
        out = tv(torch.empty(m, w.n, dtype=torch.float16, device="cuda"))
        for _ in range(args.reps):
            ours[w.reorder](*r_args)
            _launch(ours[w.kernel], w, tv(x), wts, r_args, out)
            if args.cublas:
                torch.matmul(x, wts[0].t())
        torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
