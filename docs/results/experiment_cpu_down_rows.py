"""Experiment: CPU down (gemm_k over [K, N]) reading weights packed in panels [N/P, K, P] vs the row-major [K, N]."""
import sys, time
import numpy as np
import tvm
from tvm.script import tirx as T
from wide_tvm.targets import parse_target
from wide_tvm.kernel_reference import make_mask, ref_mask_reorder

G, gs, N = 112, 128, 4096
K = G * gs
BM, BN = int(sys.argv[1]), int(sys.argv[2])
P = BN
n_tok = int(sys.argv[3]) if len(sys.argv) > 3 else 64
import os
HOTA = bool(int(os.environ.get("HOTA", "0")))
HOT = bool(int(os.environ.get("HOT", "0")))
copy = bool(int(sys.argv[4])) if len(sys.argv) > 4 else True

def make(panel: bool):
    wshape = (N // P, K, P) if panel else (K, N)
    def W(w, k, task, c):
        return (w[task, k, c] if panel else w[k, task * BN + c]) if not HOT else (w[0, k % (2 * gs), c] if panel else w[k % (2 * gs), c])

    @T.prim_func(private=True)
    def f(a_h: T.handle, w_h: T.handle, counts_h: T.handle, order_h: T.handle, used_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        a = T.match_buffer(a_h, (n, K), "float32")
        w = T.match_buffer(w_h, wshape, "float32")
        counts = T.match_buffer(counts_h, (G,), "int32")
        order = T.match_buffer(order_h, (G, n), "int32")
        used = T.match_buffer(used_h, (G + 1,), "int32")
        out = T.match_buffer(out_h, (n, N), "float32")
        for task in T.parallel(N // BN):
            acc = T.decl_buffer((n, BN), "float32")
            blk = T.decl_buffer((gs, BN), "float32", scope="local")
            tile = T.decl_buffer((BM, BN), "float32", scope="local")
            tok = T.decl_buffer((BM,), "int64", scope="local")
            for t in range(n):
                for c in T.vectorized(BN):
                    acc[t, c] = T.float32(0)
            for j in range(used[G]):
                g = used[j]
                cnt = T.Cast("int64", counts[g])
                if copy:
                    for k in range(gs):
                        for c in T.vectorized(BN):
                            blk[k, c] = W(w, g * gs + k, task, c)
                for i0 in range((cnt + BM - 1) // BM):
                    for r in T.unroll(BM):
                        tok[r] = T.Cast("int64", order[g, T.min(i0 * BM + r, cnt - 1)])
                        for c in T.vectorized(BN):
                            tile[r, c] = acc[tok[r], c]
                    for k in range(gs):
                        for r in T.unroll(BM):
                            for c in T.vectorized(BN):
                                tile[r, c] = tile[r, c] + (a[tok[r], g * gs + k] if not HOTA else a[tok[r] % 4, (g % 2) * gs + k]) * (
                                    blk[k, c] if copy else W(w, g * gs + k, task, c))
                    for r in T.unroll(BM):
                        if i0 * BM + r < cnt:
                            for c in T.vectorized(BN):
                                acc[tok[r], c] = tile[r, c]
            for t in range(n):
                for c in T.vectorized(BN):
                    out[t, task * BN + c] = acc[t, c]
    if os.environ.get('ASM'):
        lib = tvm.compile(f.with_attr('global_symbol', 'main'), target=parse_target('llvm'))
        asm = lib.mod.inspect_source('asm') if not lib.mod.imports else lib.mod.imports[0].inspect_source('asm')
        lines = asm.split('\n'); idx = [i for i, l in enumerate(lines) if 'vfmadd' in l]
        print('\n'.join(lines[idx[0]-12:idx[-1]+8]))
    return tvm.compile(f.with_attr("global_symbol", "main"), target=parse_target("llvm"))["main"]

rng = np.random.default_rng(0)
a = rng.standard_normal((n_tok, K)).astype("float32")
w = (rng.standard_normal((K, N)) / 64).astype("float32")
mask = make_mask("random", n_tok, G, rng, 0.5) if False else (rng.random((n_tok, G)) < 0.5).astype("int32")
counts, order, used = ref_mask_reorder(mask)
am = a * np.repeat(mask, gs, axis=1)
ref = am @ w
dev = tvm.cpu()
for panel in (False, True):
    fn = make(panel)
    wp = w.reshape(K, N // P, P).transpose(1, 0, 2).copy() if panel else w
    args = [tvm.runtime.tensor(x, dev) for x in (a, wp, counts.astype("int32"), order.astype("int32"), used.astype("int32"))]
    out = tvm.runtime.tensor(np.zeros((n_tok, N), "float32"), dev)
    fn(*args, out)
    err = np.abs(out.numpy() - ref).max() / np.abs(ref).max()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter(); fn(*args, out); ts.append(time.perf_counter() - t0)
    print(f"panel={panel} bm{BM} bn{BN} copy{copy} tokens {n_tok}: {np.median(ts)*1e3:.1f} ms (min {min(ts)*1e3:.1f}) err {err:.1e}")
