"""Bench builds of gate/up and Q with the > 512 bucket's committed pick plus a split tail (knob tail = argv[2])."""
import sys
import dataclasses
import wide_tvm.bench.build as B
from wide_tvm.bench.workloads import LLAMA_8B

out, tail = sys.argv[1], int(sys.argv[2])
orig = B.gated_kernel


def patched(kind, *args, **kw):
    tk = kw.get("tile_knobs")
    if kind.startswith("gemm_mn") and tk and tail:
        last = tk[-1]
        assert last.kernel == "wgmma" and not last.persistent and not last.swap and last.ksplit == 1, last
        kw["tile_knobs"] = tuple(tk[:-1]) + (dataclasses.replace(last, tail=tail),)
        print(kind, args[:2], "->", kw["tile_knobs"][-1].name())
    return orig(kind, *args, **kw)


B.gated_kernel = patched
B.build(out, workloads=[w for w in LLAMA_8B if w.kind == "gemm_mn"], records_of="HEAD")
print("built", out)
