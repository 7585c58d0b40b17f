"""Bench build of gate/up g128 / g32 whose 129-512-token bucket runs the database's pick with a split tail wave (knob
tail), or with --base the picks as they are (docs/performance.md, seventeenth session). Run it at commit 0110cd5, where
a tail kernel reads the reorder at every count (wgmma_gemm.TAIL_SORTS = 0; reverted by ef2a853): at later commits
such a kernel sorts its own tokens up to 512 and splits nothing there.

    python docs/results/experiment_tail_129_512_build.py OUT [--tail N] [--base] [--only WORKLOAD ...]
"""
import argparse
import dataclasses

import wide_tvm.bench.build as B  # first: AOT CUDA setup before TVM

from wide_tvm.bench.workloads import LLAMA_8B

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--tail", type=int, default=8)
p.add_argument("--base", action="store_true", help="the picks as they are")
p.add_argument("--only", nargs="+", default=["gate_up_g128", "gate_up_g32"])
args = p.parse_args()
orig = B.tile_knobs


def patched(entry, wgmma=True):
    knobs = orig(entry, wgmma)
    k = knobs[1]
    if not args.base and k.kernel == "wgmma" and not k.swap and not k.persistent and k.ksplit == 1:
        knobs = knobs[:1] + (dataclasses.replace(k, tail=args.tail),) + knobs[2:]
    print([k.name() for k in knobs])
    return knobs


B.tile_knobs = patched
B.build(args.out, workloads=[w for w in LLAMA_8B if w.name in args.only])
print("built", args.out)
