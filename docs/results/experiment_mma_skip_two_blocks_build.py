"""Bench build of gate/up g32 alone whose tile buckets run the database's picks with knob mma_skip on AND their
wgmma kernels launch-bounded to two resident blocks per SM (`__launch_bounds__(384, 2)`: at most 85 registers a
thread) instead of the library's one: does the bound win back the occupancy that mma_skip's extra registers cost
(docs/performance.md, sixteenth session)?

    python docs/results/experiment_mma_skip_two_blocks_build.py OUT [--blocks N] [--no-skip] [--records-of REV]
"""
import argparse
import dataclasses
import functools

import wide_tvm.bench.build as B  # first: it sets up the ahead-of-time CUDA build before TVM loads

from wide_tvm.bench.workloads import LLAMA_8B
from wide_tvm.schedules.launch_bounds import as_built

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("out")
p.add_argument("--blocks", type=int, default=2, help="resident blocks per SM the wgmma kernels are bounded to")
p.add_argument("--no-skip", action="store_true", help="the picks as they are (the bound alone)")
p.add_argument("--records-of", default="HEAD", help="the revision whose database records apply ('': today's)")
args = p.parse_args()
orig = B.gated_kernel


def patched(kind, *a, **kw):
    tk = kw.get("tile_knobs")
    if tk and kind.startswith("gemm_mn") and not args.no_skip:
        kw["tile_knobs"] = tuple(dataclasses.replace(k, mma_skip=1) if k.kernel == "wgmma" and not k.swap
                                 and not k.persistent else k for k in tk)
        print(kind, a[:2], [k.name() for k in kw["tile_knobs"]])
    return orig(kind, *a, **kw)


B.gated_kernel = patched
B.as_built = functools.partial(as_built, blocks=args.blocks)  # the library's build, `--blocks` per SM
B.build(args.out, workloads=[w for w in LLAMA_8B if w.name == "gate_up_g32"], records_of=args.records_of or None)
print("built", args.out)
