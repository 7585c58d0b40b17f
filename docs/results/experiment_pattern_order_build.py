"""Bench builds whose O projection (gemm_k of 8 head groups) runs the > 512 bucket with a given wgmma tile knob entry,
e.g. one with its tokens ordered by mask pattern (the eleventh entry, knob order), instead of the database's pick.

    python docs/results/experiment_pattern_order_build.py bk_base                      # the picks, for the A/B
    python docs/results/experiment_pattern_order_build.py bk_o1 wgmma 128 4 4 1 0 0 0 0 0 1
(the database's records of --records-of apply: a build of this tree before its records are re-stamped)."""
import argparse

import wide_tvm.bench.build as B
from wide_tvm.bench.workloads import LLAMA_8B
from wide_tvm.schedules.tile_gemm import tile_knob

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("out")
p.add_argument("entry", nargs="*", help="the > 512 bucket's tile knob entry (none: the database's pick)")
p.add_argument("--records-of", default="HEAD", help="the revision whose database records apply ('': today's)")
p.add_argument("--workloads", nargs="+", default=["o_proj_h4"], help="benchmark workloads built")
args = p.parse_args()
orig = B.gated_kernel
entry = [args.entry[0]] + [int(v) for v in args.entry[1:]] if args.entry else None


def patched(kind, *a, **kw):
    tk = kw.get("tile_knobs")
    if kind == "gemm_k" and a[0] <= 8 and tk and entry:
        kw["tile_knobs"] = tuple(tk[:-1]) + (tile_knob(entry),)
        print(kind, a[:2], [k.name() for k in kw["tile_knobs"]])
    return orig(kind, *a, **kw)


B.gated_kernel = patched
B.build(args.out, workloads=[w for w in LLAMA_8B if w.name in args.workloads], records_of=args.records_of or None)
print("built", args.out)
