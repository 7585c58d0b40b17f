"""CPU down over weights packed in P-column panels [N/P, K, P] with BN = a multiple of P (no block copy)."""
import sys, time, os
import numpy as np
import tvm
from tvm.script import tirx as T
from wide_tvm.targets import parse_target
from wide_tvm.kernel_reference import ref_mask_reorder

G, gs, N = 112, 128, 4096
K = G * gs
BM, BN, n_tok, P = (int(v) for v in sys.argv[1:5])
NP = BN // P
PF = bool(int(os.environ.get('PF', '0')))

@T.prim_func(private=True)
def f(a_h: T.handle, w_h: T.handle, counts_h: T.handle, order_h: T.handle, used_h: T.handle, out_h: T.handle):
    T.func_attr({"tirx.noalias": True})
    n = T.int64()
    a = T.match_buffer(a_h, (n, K), "float32")
    w = T.match_buffer(w_h, (N // P, K, P), "float32")
    counts = T.match_buffer(counts_h, (G,), "int32")
    order = T.match_buffer(order_h, (G, n), "int32")
    used = T.match_buffer(used_h, (G + 1,), "int32")
    out = T.match_buffer(out_h, (n, N), "float32")
    for task in T.parallel(N // BN):
        acc = T.decl_buffer((n, BN), "float32")
        tile = T.decl_buffer((BM, BN), "float32", scope="local")
        tok = T.decl_buffer((BM,), "int64", scope="local")
        for t in range(n):
            for c in T.vectorized(BN):
                acc[t, c] = T.float32(0)
        for j in range(used[G]):
            g = used[j]
            cnt = T.Cast("int64", counts[g])
            if PF:
                if j + 1 < used[G]:
                    for cp in range(NP):
                        for k in range(gs):
                            T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(
                                w[task * NP + cp, used[j + 1] * gs + k, 0]), 0, 2, 1))
            for i0 in range((cnt + BM - 1) // BM):
                for r in T.unroll(BM):
                    tok[r] = T.Cast("int64", order[g, T.min(i0 * BM + r, cnt - 1)])
                    for c in T.vectorized(BN):
                        tile[r, c] = acc[tok[r], c]
                for k in range(gs):
                    for r in T.unroll(BM):
                        for cp in T.unroll(NP):
                            for cv in T.vectorized(P):
                                tile[r, cp * P + cv] = tile[r, cp * P + cv] + a[tok[r], g * gs + k] * w[task * NP + cp, g * gs + k, cv]
                for r in T.unroll(BM):
                    if i0 * BM + r < cnt:
                        for c in T.vectorized(BN):
                            acc[tok[r], c] = tile[r, c]
        for t in range(n):
            for c in T.vectorized(BN):
                out[t, task * BN + c] = acc[t, c]

fn = tvm.compile(f.with_attr("global_symbol", "main"), target=parse_target(os.environ.get("TGT", "llvm")))["main"]
rng = np.random.default_rng(0)
a = rng.standard_normal((n_tok, K)).astype("float32")
w = (rng.standard_normal((K, N)) / 64).astype("float32")
mask = (rng.random((n_tok, G)) < float(os.environ.get("DENSITY", "0.5"))).astype("int32")
counts, order, used = ref_mask_reorder(mask)
ref = (a * np.repeat(mask, gs, axis=1)) @ w
wp = w.reshape(K, N // P, P).transpose(1, 0, 2).copy()
args = [tvm.runtime.tensor(x) for x in (a, wp, counts.astype("int32"), order.astype("int32"), used.astype("int32"))]
out = tvm.runtime.tensor(np.zeros((n_tok, N), "float32"))
fn(*args, out)
err = np.abs(out.numpy() - ref).max() / max(np.abs(ref).max(), 1e-30)
ts = []
for _ in range(7):
    t0 = time.perf_counter(); fn(*args, out); ts.append(time.perf_counter() - t0)
print(f"P{P} bm{BM} bn{BN} tokens {n_tok}: {np.median(ts)*1e3:.1f} ms (min {min(ts)*1e3:.1f}) err {err:.1e}")
