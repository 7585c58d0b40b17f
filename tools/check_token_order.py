"""The mask-pattern sort (schedules/token_order.py) alone on the GPU: every order checked against NumPy, and timed.

    python tools/check_token_order.py build sortlib [--source s.cu]      # here: sortlib/sort.so, G = 1 .. 8
    python3 tools/check_token_order.py run sortlib --json order.json     # GPU host (PYTHONPATH=$PWD, runtime bundle)

The kernels are built as wide-compile builds them (launch_bounds.as_built: programmatic dependent launch). `run`
checks perm and smask against `kernel_reference.ref_pattern_order` for every group count at token counts that fill no block, one block,
one more than a block and many blocks, under random, skewed, all-active and all-skipped masks, with back-to-back
calls on one stream (a wrong order anywhere is counted); then times the sort of 8 groups (O's) with CUDA events,
the median of `--reps` calls, each after an L2 flush. Exit status 1 if any order was wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

GROUPS = tuple(range(1, 9))
CHECK_TOKENS = (1, 2, 31, 255, 256, 257, 513, 1000, 4096, 9000)
TIME_TOKENS = (513, 1024, 2048, 4096, 16384)


def build(out: str, source: str | None = None) -> None:
    from wide_tvm.cuda_aot import cuda_codegen

    cuda_codegen()
    import tvm
    from tvm.script import tirx as T

    from wide_tvm.schedules.launch_bounds import as_built
    from wide_tvm.schedules.token_order import hist_size, pattern_order
    from wide_tvm.targets import parse_target

    funcs = {}
    for g in GROUPS:
        run = pattern_order(g)

        @T.prim_func(private=True)
        def sort_only(mask_h: T.handle, perm_h: T.handle, smask_h: T.handle, hist_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            mask = T.match_buffer(mask_h, (n, g), "int32")
            perm = T.match_buffer(perm_h, (n,), "int32")
            smask = T.match_buffer(smask_h, (n, g), "int32")
            hist = T.match_buffer(hist_h, (hist_size(g, n),), "int32")
            run(mask, perm, smask, hist, n)

        funcs[f"sort{g}"] = as_built(sort_only, True).with_attr("global_symbol", f"sort{g}")
    os.makedirs(out, exist_ok=True)
    with parse_target("cuda") as target:
        lib = tvm.compile(tvm.IRModule(funcs), target)
    lib.export_library(os.path.join(out, "sort.so"))
    if source:
        with open(source, "w") as fh:
            fh.write(lib.mod.imports[0].inspect_source())
    print("built", out)


def run(folder: str, out_json: str, reps: int) -> int:
    import numpy as np
    import torch
    import tvm

    from wide_tvm.kernel_reference import make_mask, ref_pattern_order
    from wide_tvm.runtime import ensure_cuda_runtime

    ensure_cuda_runtime(tvm)
    tv = tvm.runtime.from_dlpack
    lib = tvm.runtime.load_module(os.path.join(folder, "sort.so"))
    result = {"device": torch.cuda.get_device_name(), "checks": [], "timing": []}

    def buffers(n, g):
        blocks = (n + 255) // 256
        return (torch.empty(n, dtype=torch.int32, device="cuda"), torch.empty(n, g, dtype=torch.int32, device="cuda"),
                torch.empty(blocks * (1 << g), dtype=torch.int32, device="cuda"))

    wrong_total = 0
    for g in GROUPS:
        f = lib[f"sort{g}"]
        for n in CHECK_TOKENS:
            rng = np.random.default_rng(1000 * g + n)
            masks = [make_mask(kind, n, g, rng, 0.5) for kind in ("random", "skewed", "all_active", "all_skipped")]
            masks += [make_mask("random", n, g, rng, s) for s in (0.25, 0.75)]
            perm, smask, hist = buffers(n, g)
            wrong = 0
            for rep in range(3):  # back to back, each mask; compared after all calls of a round
                got = []
                for m in masks:
                    mt = torch.from_numpy(m).cuda()
                    perm.fill_(-1)
                    smask.fill_(-1)
                    f(tv(mt), tv(perm), tv(smask), tv(hist))
                    got.append((perm.cpu().numpy(), smask.cpu().numpy()))
                for m, (p, sm) in zip(masks, got):
                    want = ref_pattern_order(m)
                    wrong += int((p != want).sum()) + int((sm != m[want]).sum())
            result["checks"].append({"groups": g, "tokens": n, "masks": len(masks), "calls": 3 * len(masks),
                                     "wrong_entries": wrong})
            wrong_total += wrong
            if wrong:
                print(f"WRONG: G={g} n={n}: {wrong} entries")
    print(f"checked {len(result['checks'])} (G, n) cases, {wrong_total} wrong entries")

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    f = lib["sort8"]
    for n in TIME_TOKENS:
        for kind in ("random", "skewed"):
            m = torch.from_numpy(make_mask(kind, n, 8, np.random.default_rng(n), 0.5)).cuda()
            perm, smask, hist = buffers(n, 8)
            args = (tv(m), tv(perm), tv(smask), tv(hist))
            for _ in range(10):
                f(*args)
            times = []
            for _ in range(reps):
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                f(*args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000.0)
            med = float(np.median(times))
            result["timing"].append({"groups": 8, "tokens": n, "masks": kind, "median_us": med, "reps": reps})
            print(f"sort G=8 n={n:6d} {kind:7s} {med:7.2f} us (median of {reps}, L2 flushed)")
    result["wrong_entries"] = wrong_total
    with open(out_json, "w") as fh:
        json.dump(result, fh, indent=1)
    return 1 if wrong_total else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("folder")
    b.add_argument("--source", help="also write the kernels' CUDA source here")
    r = sub.add_parser("run")
    r.add_argument("folder")
    r.add_argument("--json", required=True)
    r.add_argument("--reps", type=int, default=200)
    a = p.parse_args(argv)
    if a.cmd == "build":
        build(a.folder, a.source)
        return 0
    return run(a.folder, a.json, a.reps)


if __name__ == "__main__":
    sys.exit(main())
