"""Decode (one token), our kernel's time for group sets of the same size placed differently in the grid:
contiguous (first / last groups), interleaved, random, and sets rotated call to call, 100 reps each with CUDA events after an L2 flush.
A gemm_mn block owns 16 rows of one group, block index order = group order, so which blocks have work (and so
which SMs they land on) follows the set.

    python3 THIS BUILD_DIR OUT_JSON      (on the GPU host, PYTHONPATH=the source tree)"""
import json, sys
import numpy as np, torch
from experiment_harness import Build

B = Build(sys.argv[1])
out_json = sys.argv[2]
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
for w, weights in B.workloads():
    G = w.groups
    x = torch.randn(1, w.k, device="cuda").half()
    for label, group_sets in sets(G).items():
        masks = []
        for gs in group_sets:
            mk = np.zeros((1, G), np.int32); mk[0, gs] = 1; masks.append(mk)
        while len(masks) < 4:
            masks.append(masks[len(masks) % len(group_sets)])
        t_cublas, t_kernel, err = B.time_masks(w, weights, x, masks, reps=100)
        k = len(group_sets[0])
        rows.append(dict(workload=w.name, groups=G, used=k, placement=label, kernel_us=t_kernel, cublas_us=t_cublas,
                         rel_err=err))
        print(f"{w.name:13s} {label:22s} used {k:3d}/{G:3d}  kernel {t_kernel:7.2f} us  cuBLAS {t_cublas:6.1f}  "
              f"x {t_cublas / t_kernel:4.2f}  err {err:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "tokens": 1, "rows": rows}, open(out_json, "w"), indent=1)
