"""Decode (one token): our kernel's time against the number of groups the token uses (exact counts, 4 draws
rotated), beside cuBLAS on the dense shape: bandwidth-bound kernels scale with the used groups' bytes.

    python3 THIS BUILD_DIR OUT_JSON      (on the GPU host, PYTHONPATH=the source tree; BUILD_DIR from wide-bench build)

weight_mb counts one weight matrix (gate/up read two)."""
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
rng = np.random.default_rng(11)
plans = {"q_proj_h4": range(0, 9), "o_proj_h4": range(0, 9),
         "gate_up_g128": (0, 14, 28, 42, 56, 70, 84, 98, 112), "down_g128": (0, 14, 28, 42, 56, 70, 84, 98, 112)}
rows = []
for wj in spec["workloads"]:
    w = Workload(**wj)
    if w.name not in plans:
        continue
    weights = M._rotating_weights(w, l2, tv, spec.get("layouts", {}).get(w.name, "nk"))
    kernel = ours[w.kernel]
    G = w.groups
    x = torch.randn(1, w.k, device="cuda").half(); xt = tv(x)
    for k in plans[w.name]:
        masks = []
        for _ in range(4):
            mk = np.zeros((1, G), np.int32); mk[0, rng.permutation(G)[:k]] = 1; masks.append(mk)
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
        mb = w.n * w.k * 2 * k / G / 1e6
        rows.append(dict(workload=w.name, used_groups=k, groups=G, weight_mb=mb, kernel_us=t_kernel, cublas_us=t_cublas, rel_err=err))
        print(f"{w.name:13s} used {k:3d}/{G:3d} {mb:7.1f} MB  kernel {t_kernel:7.2f} us ({mb / t_kernel if t_kernel else 0:5.2f} TB/s (gate/up: x2))  cuBLAS {t_cublas:6.1f}  err {err:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "tokens": 1, "rows": rows}, open(out_json, "w"), indent=1)
