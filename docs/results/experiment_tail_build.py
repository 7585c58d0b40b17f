"""Bench builds whose gemm_mn kernels run the > 512 bucket's pick with a split tail (knob tail = TAIL; 0: as picked).

    python docs/results/experiment_tail_build.py bt_w8 8                 # gate/up and Q, this tree's records
    python docs/results/experiment_tail_build.py bk_s5 8 --kind gemm_mn --exact --records-of 0f6b628 --all-workloads
(the second, with 0f6b628's database in place: `git checkout 0f6b628 -- tuning_logs/cuda-sm90`, restored after, is
the fourth session's predicted-picks build: all six kernels, only Q's > 512 pick given the tail)."""
import argparse
import dataclasses

import wide_tvm.bench.build as B
from wide_tvm.bench.workloads import LLAMA_8B

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("out")
p.add_argument("tail", type=int)
p.add_argument("--kind", default="gemm_mn", help="the kernels patched: every kind starting with this (default: "
               "gate/up and Q); give 'gemm_mn' with --exact for Q alone")
p.add_argument("--exact", action="store_true", help="patch the kind given, not every kind starting with it")
p.add_argument("--records-of", default="HEAD", help="the revision whose database records apply")
p.add_argument("--all-workloads", action="store_true", help="build all six kernels (default: the gemm_mn ones)")
args = p.parse_args()
orig = B.gated_kernel


def patched(kind, *a, **kw):
    tk = kw.get("tile_knobs")
    if (kind == args.kind if args.exact else kind.startswith(args.kind)) and tk and args.tail:
        last = tk[-1]
        assert last.kernel == "wgmma" and not last.persistent and not last.swap and last.ksplit == 1, last
        kw["tile_knobs"] = tuple(tk[:-1]) + (dataclasses.replace(last, tail=args.tail),)
        print(kind, a[:2], "->", kw["tile_knobs"][-1].name())
    return orig(kind, *a, **kw)


B.gated_kernel = patched
B.build(args.out, workloads=None if args.all_workloads else [w for w in LLAMA_8B if w.kind == "gemm_mn"],
        records_of=args.records_of)
print("built", args.out)
