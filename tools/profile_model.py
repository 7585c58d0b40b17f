"""Per-kernel profile of one forward of the libraries `wide-bench model-build` wrote (GPU host, runtime bundle):
    python3 tools/profile_model.py BUILD_DIR [--tokens 1 16] [--json OUT]
For each library and token count: the kernels one forward launches (CUPTI, through torch.profiler), their summed
device time, and the forward's wall time between CUDA events; the rest is launch and host overhead."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import torch
    import tvm
    from torch.profiler import ProfilerActivity, profile
    from tvm.runtime import vm as rvm

    from wide_tvm.bench.model import random_weights
    from wide_tvm.blas.libraries import load as load_blas
    from wide_tvm.runtime import ensure_cuda_runtime

    spec = json.load(open(os.path.join(args.build_dir, "model.json")))
    ensure_cuda_runtime(tvm)
    dev = tvm.cuda(0)
    tv = tvm.runtime.from_dlpack
    result = {}
    for variant, lib in spec["libraries"].items():
        load_blas(lib["blas"])
        vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(args.build_dir, lib["library"])), dev)
        weights = [tv(w) for w in random_weights(lib["weights"], torch.device("cuda"), seed=0)]
        for t in args.tokens:
            ids = tv(torch.randint(0, spec["config"]["vocab_size"], (1, t), device="cuda"))
            for _ in range(5):
                vm["main"](ids, *weights)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start.record()
                for _ in range(args.iters):
                    vm["main"](ids, *weights)
                end.record()
                torch.cuda.synchronize()
            wall = start.elapsed_time(end) * 1000 / args.iters
            kernels = collections.defaultdict(lambda: [0, 0.0])
            for e in prof.events():
                if e.device_type.name == "CUDA" and e.device_time_total > 0:
                    k = kernels[e.name]
                    k[0] += 1
                    k[1] += e.device_time_total
            launches = sum(c for c, _ in kernels.values()) / args.iters
            busy = sum(us for _, us in kernels.values()) / args.iters
            top = sorted(((us / args.iters, c / args.iters, name) for name, (c, us) in kernels.items()), reverse=True)
            result[f"{variant}@{t}"] = {"wall_us": wall, "kernel_us": busy, "launches": launches,
                                        "kernels": [[n[:90], c, us] for us, c, n in top]}
            print(f"{variant:18s} T={t:5d} wall {wall:8.1f} us  kernels {busy:8.1f} us  launches {launches:5.0f}  "
                  f"idle {wall - busy:8.1f} us")
            for us, c, n in top[:12]:
                print(f"      {us:8.1f} us  x{c:3.0f}  {n[:100]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
