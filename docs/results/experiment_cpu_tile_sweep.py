"""CPU tile sweep of our kernels alone: gate/up g128 (mn) or down g128 (k), fp32, at given token counts, 50 % random
masks and every group active, each tile BMxBN built for this machine's CPU; median of 3 calls, ms.

    python docs/results/experiment_cpu_tile_sweep.py mn 1x1,2x2,4x2,3x4 1,16,64
    python docs/results/experiment_cpu_tile_sweep.py k 1x64,4x64,8x32 1,16,64
"""
import sys, time
import numpy as np, tvm
from wide_tvm.bench.cpu import time_call
from wide_tvm.kernel_reference import make_mask, ref_mask_reorder, ref_gemm_mn, ref_gemm_k, rel_err
from wide_tvm.schedules import gemm_mn, gemm_k
from wide_tvm.schedules.tiles import TileConfig
from wide_tvm.targets import parse_target
G, GS, D = 112, 128, 4096
kind = sys.argv[1]; tiles = [tuple(map(int, t.split('x'))) for t in sys.argv[2].split(',')]
tokens = [int(t) for t in sys.argv[3].split(',')]
rng = np.random.default_rng(0)
tgt = parse_target('llvm')
if kind == 'mn':
    wg = (rng.standard_normal((G*GS, D)) / 64).astype('float32'); wu = (rng.standard_normal((G*GS, D)) / 64).astype('float32')
    W = [tvm.runtime.tensor(wg), tvm.runtime.tensor(wu)]
else:
    w = (rng.standard_normal((G*GS, D)) / 100).astype('float32'); W = [tvm.runtime.tensor(w)]
for bm, bn in tiles:
    t0 = time.time()
    f = gemm_mn(G, GS, D, 'float32', 'nk', True, 'llvm', cpu_tile=TileConfig(bm, bn)) if kind == 'mn' else \
        gemm_k(G, GS, D, 'float32', 'kn', 'llvm', cpu_tile=TileConfig(bm, bn))
    fn = tvm.compile(f.with_attr('global_symbol', 'main'), target=tgt)['main']
    tb = time.time() - t0
    res = []
    for m in tokens:
        xk = D if kind == 'mn' else G*GS
        x = rng.standard_normal((m, xk)).astype('float32')
        row = []
        for label, mask in (('s', make_mask('random', m, G, rng, 0.5)), ('d', np.ones((m, G), np.int32))):
            counts, order, used = (tvm.runtime.tensor(v) for v in ref_mask_reorder(mask))
            out = tvm.runtime.tensor(np.zeros((m, G*GS if kind == 'mn' else D), 'float32'))
            args = [tvm.runtime.tensor(x), *W, tvm.runtime.tensor(mask), counts, order, used, out]
            t = time_call(fn, args, reps=3)
            if label == 's':
                ref = ref_gemm_mn(x, wg, wu, mask, GS, 'nk', True) if kind == 'mn' else ref_gemm_k(x, w, mask, GS, 'kn')
                err = rel_err(out.numpy(), ref)
            row.append(t / 1e3)
        res.append(f"M={m}: {row[0]:7.1f} / {row[1]:7.1f} ms (x{row[1]/row[0]:.2f}, err {err:.1e})")
    print(f"{kind} bm{bm} bn{bn} (build {tb:.0f}s): " + "  ".join(res), flush=True)
