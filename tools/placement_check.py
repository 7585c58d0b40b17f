"""Does it matter which groups are active? One-token gated kernels at exactly half their groups, placed differently.

    . .gpu/env.sh && PYTHONPATH=$PWD python3 tools/placement_check.py bench_build   (after `wide-bench build`)

For gate/up (groups of 128 and 32), Q and down, times our kernel (CUDA events after an L2 flush, 30 calls, twice)
with the first half of the groups active, the last half, every other group and four random halves. The blocks
of a group are consecutive in the grid, so if the spread of active blocks over the SMs limited the kernel, these
placements would differ.
"""

import json
import os
import sys

import numpy as np
import torch
import tvm

from wide_tvm.bench.measure import _launch, _reorder_args, _rotating_weights, event_median_us, l2_flush_buffer
from wide_tvm.bench.workloads import Workload
from wide_tvm.runtime import _ensure_cuda_runtime


def placements(groups: int) -> dict:
    """Half the groups active, placed first, last, every other one and at random (4 draws)."""
    g = np.arange(groups)
    pats = {"first half": g < groups // 2, "last half": g >= groups // 2, "even": g % 2 == 0}
    rng = np.random.default_rng(2)
    for d in range(4):
        m = np.zeros(groups, bool)
        m[rng.permutation(groups)[: groups // 2]] = True
        pats[f"random{d}"] = m
    return pats


def main() -> None:
    _ensure_cuda_runtime(tvm)
    build_dir = sys.argv[1]
    with open(os.path.join(build_dir, "bench.json")) as f:
        spec = json.load(f)
    ours = tvm.runtime.load_module(os.path.join(build_dir, "ours.so"))
    tv = tvm.runtime.from_dlpack
    flush = l2_flush_buffer()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for name in ("gate_up_g128", "gate_up_g32", "q_proj_h4", "down_g128"):
        w = Workload(**next(x for x in spec["workloads"] if x["name"] == name))
        weights = _rotating_weights(w, l2, tv, spec["layouts"][name])
        x = torch.randn(1, w.k, device="cuda").half()
        xt, out = tv(x), tv(torch.empty(1, w.n, dtype=torch.float16, device="cuda"))
        args = {k: _reorder_args(w, torch.from_numpy(v.astype(np.int32)[None]).cuda(), tv)
                for k, v in placements(w.groups).items()}
        res = {}
        for _ in range(2):
            for k, a in args.items():
                us = event_median_us(lambda: _launch(ours[w.kernel], w, xt, weights(), a, out), flush.sum, reps=30)
                res.setdefault(k, []).append(round(us, 1))
        print(name, res)


if __name__ == "__main__":
    main()
