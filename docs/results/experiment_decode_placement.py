"""Decode (one token), our kernel's time for group sets of the same size placed differently in the grid:
contiguous (first / last groups), interleaved, random, and sets rotated call to call, 100 reps each with CUDA events after an L2 flush.
A gemm_mn block owns 16 rows of one group, block index order = group order, so which blocks have work (and so
which SMs they land on) follows the set.

    python3 THIS BUILD_DIR OUT_JSON      (on the GPU host, PYTHONPATH=the source tree)"""
import json, sys
import numpy as np, torch, tvm
sys.path.insert(0, '.')
from wide_tvm.runtime import _ensure_cuda_runtime
from wide_tvm.bench.workloads import Workload
from wide_tvm.bench import measure as M

_ensure_cuda_runtime(tvm)
build, out_json = sys.argv[1], sys.argv[2]
spec = json.load(open(f"{build}/bench.json"))
ours = tvm.runtime.load_module(f"{build}/ours.so")
tv = tvm.runtime.from_dlpack
l2 = torch.cuda.get_device_properties(0).L2_cache_size
flush = M.l2_flush_buffer()
rng = np.random.default_rng(5)


def sets(G):
    h = G // 2
    out = {"first half": [list(range(h))], "last half": [list(range(h, G))], "even": [list(range(0, G, 2))],
           "odd": [list(range(1, G, 2))], "random (4 draws)": [sorted(rng.permutation(G)[:h].tolist()) for _ in range(4)]}
    out["the 4 halves rotated"] = [out[k][0] for k in ("first half", "last half", "even", "odd")]
    for i, draw in enumerate(out["random (4 draws)"]):
        out[f"random draw {i} alone"] = [draw]
    q = G // 4
    out["first quarter"] = [list(range(q))]
    out["every 4th"] = [list(range(0, G, 4))]
    return out


rows = []
for wj in spec["workloads"]:
    w = Workload(**wj)
    weights = M._rotating_weights(w, l2, tv, spec.get("layouts", {}).get(w.name, "nk"))
    kernel = ours[w.kernel]
    G = w.groups
    x = torch.randn(1, w.k, device="cuda").half(); xt = tv(x)
    for label, group_sets in sets(G).items():
        masks = []
        for gs in group_sets:
            mk = np.zeros((1, G), np.int32); mk[0, gs] = 1; masks.append(mk)
        while len(masks) < 4:
            masks.append(masks[len(masks) % len(group_sets)])
        mt = [torch.from_numpy(v).cuda() for v in masks]
        out = torch.empty(1, w.n, dtype=torch.float16, device="cuda")
        rp = [M._reorder_args(w, v, tv) for v in mt]
        for r in rp:
            ours[w.reorder](*r)
        nxt = M._rotating(lambda i: rp[i], 4)
        def call(): M._launch(kernel, w, xt, weights(), nxt(), tv(out))
        t_cublas, t_kernel = M.event_medians_us([lambda: torch.matmul(x, weights()[0].t()), call], flush.sum, reps=100)
        err = max(M._check(w, x, weights(), mk, out, lambda wts, a=r: M._launch(kernel, w, xt, wts, a, tv(out)))
                  for mk, r in zip(mt, rp))
        k = len(group_sets[0])
        rows.append(dict(workload=w.name, groups=G, used=k, placement=label, kernel_us=t_kernel, cublas_us=t_cublas,
                         rel_err=err))
        print(f"{w.name:13s} {label:22s} used {k:3d}/{G:3d}  kernel {t_kernel:7.2f} us  cuBLAS {t_cublas:6.1f}  "
              f"x {t_cublas / t_kernel:4.2f}  err {err:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "tokens": 1, "rows": rows}, open(out_json, "w"), indent=1)
