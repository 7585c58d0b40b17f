"""Decode (one token): our kernel's time against the number of groups the token uses (exact counts, 4 draws
rotated), beside cuBLAS on the dense shape: bandwidth-bound kernels scale with the used groups' bytes.

    python3 THIS BUILD_DIR OUT_JSON      (on the GPU host, PYTHONPATH=the source tree; BUILD_DIR from wide-bench build)

weight_mb counts one weight matrix (gate/up read two)."""
import json, sys
import numpy as np, torch
from experiment_harness import Build

B = Build(sys.argv[1])
out_json = sys.argv[2]
rng = np.random.default_rng(11)
plans = {"q_proj_h4": range(0, 9), "o_proj_h4": range(0, 9),
         "gate_up_g128": (0, 14, 28, 42, 56, 70, 84, 98, 112), "down_g128": (0, 14, 28, 42, 56, 70, 84, 98, 112)}
rows = []
for w, weights in B.workloads(plans):
    G = w.groups
    x = torch.randn(1, w.k, device="cuda").half()
    for k in plans[w.name]:
        masks = []
        for _ in range(4):
            mk = np.zeros((1, G), np.int32); mk[0, rng.permutation(G)[:k]] = 1; masks.append(mk)
        t_cublas, t_kernel, err = B.time_masks(w, weights, x, masks, reps=100)
        mb = w.n * w.k * 2 * k / G / 1e6
        rows.append(dict(workload=w.name, used_groups=k, groups=G, weight_mb=mb, kernel_us=t_kernel, cublas_us=t_cublas, rel_err=err))
        print(f"{w.name:13s} used {k:3d}/{G:3d} {mb:7.1f} MB  kernel {t_kernel:7.2f} us ({mb / t_kernel if t_kernel else 0:5.2f} TB/s (gate/up: x2))  cuBLAS {t_cublas:6.1f}  err {err:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "tokens": 1, "rows": rows}, open(out_json, "w"), indent=1)
