"""Time a CPU gated kernel (Llama-3.1-8B's down or gate/up, weights stored as wide-compile stores them: down in
"kp" panels, gate/up [N, K]) at 50 % random masks and with every group active.

    python tools/cpu_kernel_ratio.py 1 16 64 [--kernel down|gate_up] [--bm 1 --bn 64] [--dtype float16]

Prints sparse / all-active milliseconds (median of 9 calls timed in turns over weight copies that fill four times
the last-level cache, bench.cpu.time_interleaved / weight_copies), their
ratio and the larger relative error against kernel_reference: the kernel alone, for A/B comparisons of kernel
changes (wide-bench cpu measures the tuned kernels next to torch and TVM dense).
"""

from __future__ import annotations

import argparse

import ml_dtypes  # noqa: F401  (numpy learns the name bfloat16)
import numpy as np
import tvm

from wide_tvm.bench.cpu import time_interleaved, weight_copies
from wide_tvm.kernel_reference import make_mask, ref_gemm_k, ref_gemm_mn, ref_mask_reorder, rel_err
from wide_tvm.schedules import gemm_k, gemm_mn
from wide_tvm.schedules.tiles import TileConfig
from wide_tvm.targets import parse_target
from wide_tvm.weight_layout import cpu_k_layout, pack

G, GS, D = 112, 128, 4096  # groups, group size, hidden


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tokens", type=int, nargs="+")
    p.add_argument("--kernel", choices=("down", "gate_up"), default="down")
    p.add_argument("--bm", type=int, default=1)
    p.add_argument("--bn", type=int, default=64)
    p.add_argument("--dtype", default="float32", help="weights and activations (accumulation is fp32)")
    p.add_argument("--target", default="llvm", help="llvm (this machine's CPU) or llvm:CPU (wide_tvm.targets)")
    args = p.parse_args()
    down, dt, tile = args.kernel == "down", args.dtype, TileConfig(args.bm, args.bn)
    layout = cpu_k_layout(D) if down else "nk"
    f = (gemm_k(G, GS, D, dt, layout, "llvm", cpu_tile=tile) if down
         else gemm_mn(G, GS, D, dt, layout, True, "llvm", cpu_tile=tile))
    fn = tvm.compile(f.with_attr("global_symbol", "main"), target=parse_target(args.target))["main"]
    rng = np.random.default_rng(0)
    n_out = D if down else G * GS
    ws = [(rng.standard_normal((n_out, G * GS if down else D)) * 0.01).astype(dt) for _ in range(1 if down else 2)]
    copies = weight_copies(sum(w.nbytes for w in ws))  # calls rotate through them: weights come from DRAM
    wt = [[tvm.runtime.tensor(pack(w, layout) if down else w) for w in ws] for _ in range(copies)]
    for m in args.tokens:
        x = rng.standard_normal((m, G * GS if down else D)).astype(dt)
        calls, outs = {}, {}
        for label, mask in (("sparse", make_mask("random", m, G, rng, 0.5)), ("dense", np.ones((m, G), np.int32))):
            counts, order, used = (tvm.runtime.tensor(v) for v in ref_mask_reorder(mask))
            outs[label] = (tvm.runtime.tensor(np.zeros((m, n_out), dt)), mask)
            tail = [tvm.runtime.tensor(mask), counts, order, used, outs[label][0]]
            calls[label] = (fn, [[tvm.runtime.tensor(x), *w, *tail] for w in wt])
        us = time_interleaved(calls)
        x32, w32 = x.astype("float32"), [w.astype("float32") for w in ws]
        err = max(rel_err(out.numpy().astype("float32"),
                          ref_gemm_k(x32, w32[0], mask, GS, "nk") if down
                          else ref_gemm_mn(x32, w32[0], w32[1], mask, GS, "nk", True))
                  for out, mask in outs.values())
        print(f"{args.kernel} {dt} bm {args.bm} bn {args.bn} M={m} sparse {us['sparse'] / 1e3:.1f} ms dense "
              f"{us['dense'] / 1e3:.1f} ms ratio {us['dense'] / us['sparse']:.2f} rel err {err:.1e}")


if __name__ == "__main__":
    main()
