"""Bench builds whose > 512-token bucket runs the <= 512 bucket's tile knobs (every workload), to time the smaller
bucket's kernel just past 512 tokens against the > 512 pick (tuned at 1024-4096 tokens): what a bucket boundary
above 512 would gain at 513-2048 tokens.

    python docs/results/experiment_last_bucket_build.py bk_mid           # then bench bk_mid and a `wide-bench build`
(the database's records of --records-of apply, as in experiment_pattern_order_build.py)."""
import argparse

import wide_tvm.bench.build as B
from wide_tvm.bench.workloads import LLAMA_8B

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("out")
p.add_argument("--records-of", default="HEAD", help="the revision whose database records apply ('': today's)")
args = p.parse_args()
orig = B.gated_kernel


def patched(kind, *a, **kw):
    tk = kw.get("tile_knobs")
    if tk:
        kw["tile_knobs"] = tuple(tk[:-1]) + (tk[-2],)
        print(kind, a[:2], [k.name() for k in kw["tile_knobs"]])
    return orig(kind, *a, **kw)


B.gated_kernel = patched
B.build(args.out, workloads=LLAMA_8B, records_of=args.records_of or None)
print("built", args.out)
