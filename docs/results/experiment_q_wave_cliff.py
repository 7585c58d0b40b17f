"""Q / gate-up at 4096 tokens against the number of working 128-token tiles: masks with exact per-group counts."""
import json, sys, math
import numpy as np, torch
from experiment_harness import Build

B = Build(sys.argv[1])
out_json = sys.argv[2]; only = sys.argv[3:] or None
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
for w, weights in B.workloads([n for n in plans if not only or n in only]):
    x = torch.randn(m, w.k, device="cuda").half()
    for k, counts in plans[w.name]:
        bpg = 2 if w.name == "q_proj_h4" else 1
        tiles = sum(math.ceil(c / 128) for c in counts) * bpg
        masks = [mask_with(counts) for _ in range(4)]
        t_cublas, t_kernel, err = B.time_masks(w, weights, x, masks, reps=60)
        row = dict(workload=w.name, groups_over=k, tiles=tiles, waves=tiles / 132, cublas_us=t_cublas,
                   kernel_us=t_kernel, speedup=t_cublas / t_kernel, rel_err=err)
        rows.append(row)
        print(f"{w.name:13s} groups+1tile {k:3d} tiles {tiles:5d} ({tiles/132:6.3f} waves) kernel {t_kernel:8.1f} us  cuBLAS {t_cublas:8.1f}  x{t_cublas/t_kernel:5.2f} err {err:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "tokens": m, "rows": rows}, open(out_json, "w"), indent=1)
