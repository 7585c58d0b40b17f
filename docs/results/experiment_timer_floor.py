"""The event timer's floor beside our decode kernels' fixed cost: trivial torch kernels and our one-token kernels
with no group used (and with half of them), timed together as the benchmark times ours (L2 flush before each run).

    python3 THIS BUILD_DIR OUT_JSON      (on the GPU host, PYTHONPATH=the source tree)"""
import json, sys
import numpy as np, torch
from experiment_harness import M, Build, tv

B = Build(sys.argv[1])
out_json = sys.argv[2]
ours = B.ours
a = torch.zeros(1, device="cuda"); b = torch.zeros(4096, device="cuda", dtype=torch.float16)
xs = torch.randn(1, 4096, device="cuda").half(); ws = torch.randn(128, 4096, device="cuda").half()
fns = {"torch zero_ (1 element)": lambda: a.zero_(), "torch add_ (8 KB)": lambda: b.add_(1),
       "torch.matmul 1x4096 @ 4096x128": lambda: torch.matmul(xs, ws.t())}
keep = []
for w, weights in B.workloads(("q_proj_h4", "o_proj_h4", "gate_up_g128", "down_g128")):
    x = torch.randn(1, w.k, device="cuda").half(); xt = tv(x)
    out = torch.empty(1, w.n, dtype=torch.float16, device="cuda")
    for used in (0, w.groups // 2):
        mk = np.zeros((1, w.groups), np.int32); mk[0, :used] = 1
        r = M._reorder_args(w, torch.from_numpy(mk).cuda(), tv)
        ours[w.reorder](*r)
        keep.append((weights, x, xt, out, r))
        fns[f"{w.name}, {used} of {w.groups} groups"] = (
            lambda k=ours[w.kernel], w=w, xt=xt, wts=weights, r=r, o=tv(out): M._launch(k, w, xt, wts(), r, o))
ts = M.event_medians_us(list(fns.values()), B.flush.sum, reps=200)
rows = [{"what": k, "us": t} for k, t in zip(fns, ts)]
for r in rows:
    print(f"{r['what']:36s} {r['us']:6.2f} us")
json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, open(out_json, "w"), indent=1)
