"""Q / gate-up at 4096 tokens against the number of working 128-token tiles: masks with exact per-group counts."""
import json, sys, math
import numpy as np, torch, tvm
sys.path.insert(0, '.')
from wide_tvm.runtime import _ensure_cuda_runtime
from wide_tvm.bench.workloads import Workload
from wide_tvm.bench import measure as M

_ensure_cuda_runtime(tvm)
build = sys.argv[1]; out_json = sys.argv[2]; only = sys.argv[3:] or None
spec = json.load(open(f"{build}/bench.json"))
ours = tvm.runtime.load_module(f"{build}/ours.so")
tv = tvm.runtime.from_dlpack
l2 = torch.cuda.get_device_properties(0).L2_cache_size
flush = M.l2_flush_buffer()
rng = np.random.default_rng(7)
m = 4096
rows = []

def mask_with(counts):
    mk = np.zeros((m, len(counts)), np.int32)
    for g, c in enumerate(counts):
        mk[rng.permutation(m)[:c], g] = 1
    return mk

plans = {"q_proj_h4": [(k, [2048 + 20] * k + [2040] * (8 - k)) for k in range(0, 9)],
         "gate_up_g128": [(k, [2048 + 20] * k + [2040] * (112 - k)) for k in (40, 48, 52, 54, 56, 58, 60, 64, 72)]}
for wj in spec["workloads"]:
    w = Workload(**wj)
    if w.name not in plans or (only and w.name not in only):
        continue
    weights = M._rotating_weights(w, l2, tv, spec.get("layouts", {}).get(w.name, "nk"))
    kernel, reorder = ours[w.kernel], ours[w.reorder]
    x = torch.randn(m, w.k, device="cuda").half(); xt = tv(x)
    for k, counts in plans[w.name]:
        bpg = 2 if w.name == "q_proj_h4" else 1
        tiles = sum(math.ceil(c / 128) for c in counts) * bpg
        masks = [mask_with(counts) for _ in range(4)]
        mt = [torch.from_numpy(v).cuda() for v in masks]
        out = torch.empty(m, w.n, dtype=torch.float16, device="cuda")
        rp = [M._reorder_args(w, v, tv) for v in mt]
        for r in rp:
            reorder(*r)
        nxt = M._rotating(lambda i: rp[i], 4)
        def call(): M._launch(kernel, w, xt, weights(), nxt(), tv(out))
        t_cublas, t_kernel = M.event_medians_us([lambda: torch.matmul(x, weights()[0].t()), call], flush.sum, reps=60)
        err = max(M._check(w, x, weights(), mk, out, lambda wts, a=r: M._launch(kernel, w, xt, wts, a, tv(out)))
                  for mk, r in zip(mt, rp))
        row = dict(workload=w.name, groups_over=k, tiles=tiles, waves=tiles / 132, cublas_us=t_cublas,
                   kernel_us=t_kernel, speedup=t_cublas / t_kernel, rel_err=err)
        rows.append(row)
        print(f"{w.name:13s} groups+1tile {k:3d} tiles {tiles:5d} ({tiles/132:6.3f} waves) kernel {t_kernel:8.1f} us  cuBLAS {t_cublas:8.1f}  x{t_cublas/t_kernel:5.2f} err {err:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "tokens": m, "rows": rows}, open(out_json, "w"), indent=1)
