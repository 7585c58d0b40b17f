"""Bench build whose gemm_mn kernels past the direct bound (the tile buckets, 65-512 and past 512 tokens) run the
database's picks with knob mma_skip on (a warpgroup whose 64 rows are all past the group's active count skips its
wgmmas), for the A/B against a plain `wide-bench build` of the same tree (same picks, knob off).

    python docs/results/experiment_mma_skip_build.py OUT [--records-of REV]
(the database's records of --records-of apply, as in experiment_last_bucket_build.py; '' for today's)."""
import argparse
import dataclasses

import wide_tvm.bench.build as B
from wide_tvm.bench.workloads import LLAMA_8B

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("out")
p.add_argument("--records-of", default="HEAD", help="the revision whose database records apply ('': today's)")
args = p.parse_args()
orig = B.gated_kernel


def skipping(k):
    """The pick with mma_skip where the knob applies (a per-tile, unswapped wgmma GEMM)."""
    if k.kernel == "wgmma" and not k.swap and not k.persistent:
        return dataclasses.replace(k, mma_skip=1)
    return k


def patched(kind, *a, **kw):
    tk = kw.get("tile_knobs")
    if tk and kind.startswith("gemm_mn"):
        kw["tile_knobs"] = tuple(skipping(k) for k in tk)
        print(kind, a[:2], [k.name() for k in kw["tile_knobs"]])
    return orig(kind, *a, **kw)


B.gated_kernel = patched
B.build(args.out, workloads=LLAMA_8B, records_of=args.records_of or None)
print("built", args.out)
