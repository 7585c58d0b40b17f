"""Time the CPU down kernel (Llama-3.1-8B, fp32, [K, N] weight) at 50 % random masks and with every group active.

    python tools/cpu_kernel_ratio.py 1 16 64 [--bm 1 --bn 64]

Prints sparse / all-active milliseconds (median of 7, best of 3 rounds) and their ratio: the kernel alone, for
A/B comparisons of kernel changes (wide-bench cpu measures the tuned kernels next to torch and TVM dense).
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm

from wide_tvm.kernel_reference import make_mask, ref_gemm_k, ref_mask_reorder, rel_err
from wide_tvm.schedules import gemm_k
from wide_tvm.schedules.tiles import TileConfig
from wide_tvm.bench.cpu import time_call
from wide_tvm.targets import parse_target

G, GS, N = 112, 128, 4096


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tokens", type=int, nargs="+")
    p.add_argument("--bm", type=int, default=1)
    p.add_argument("--bn", type=int, default=64)
    p.add_argument("--target", default="llvm", help="llvm (this machine's CPU) or llvm:CPU (wide_tvm.targets)")
    args = p.parse_args()
    f = gemm_k(G, GS, N, "float32", "kn", "llvm", cpu_tile=TileConfig(args.bm, args.bn))
    fn = tvm.compile(f.with_attr("global_symbol", "main"), target=parse_target(args.target))["main"]
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((G * GS, N)) * 0.01).astype("float32")
    wt = tvm.runtime.tensor(w)
    for m in args.tokens:
        a = rng.standard_normal((m, G * GS)).astype("float32")
        ms_, err = {}, 0.0
        for label, mask in (("sparse", make_mask("random", m, G, rng, 0.5)), ("dense", np.ones((m, G), np.int32))):
            counts, order, used = (tvm.runtime.tensor(v) for v in ref_mask_reorder(mask))
            out = tvm.runtime.tensor(np.zeros((m, N), "float32"))
            call = [tvm.runtime.tensor(a), wt, tvm.runtime.tensor(mask), counts, order, used, out]
            ms_[label] = min(time_call(fn, call, reps=7) for _ in range(3)) / 1e3
            err = max(err, rel_err(out.numpy(), ref_gemm_k(a, w, mask, GS, "kn")))
        print(f"M={m} sparse {ms_['sparse']:.1f} ms dense {ms_['dense']:.1f} ms "
              f"ratio {ms_['dense'] / ms_['sparse']:.2f} rel err {err:.1e}")


if __name__ == "__main__":
    main()
