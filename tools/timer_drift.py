"""How much the H200's clock drift moves sequential timings: cuBLAS, our kernel, reorder + kernel, the reorder and
the kernel again, each timed on its own (not interleaved) three times in one process, for gate/up and down
(group 128) at 4096 tokens and 50 % random masks. Why `wide-bench` times a row's candidates interleaved.

    python3 tools/timer_drift.py BUILD_DIR OUT.json      # on the GPU host, BUILD_DIR from `wide-bench build`
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import tvm

from wide_tvm.bench.measure import _launch, _reorder_args, _rotating_weights, _timer
from wide_tvm.bench.workloads import LLAMA_8B
from wide_tvm.kernel_reference import make_mask
from wide_tvm.runtime import _ensure_cuda_runtime

_ensure_cuda_runtime(tvm)
ours = tvm.runtime.load_module(f"{sys.argv[1]}/ours.so")
timer, _ = _timer("events")
tv = tvm.runtime.from_dlpack
l2 = torch.cuda.get_device_properties(0).L2_cache_size
rng = np.random.default_rng(0)
res = []
for w in LLAMA_8B[:2]:
    weights = _rotating_weights(w, l2, tv, "tc")
    m = 4096
    x = torch.randn(m, w.k, device="cuda").half()
    xt = tv(x)
    mask = torch.from_numpy(make_mask("random", m, w.groups, rng, 0.5)).cuda()
    r = _reorder_args(w, mask, tv)
    out = tv(torch.empty(m, w.n, dtype=torch.float16, device="cuda"))
    k, ro = ours[w.kernel], ours[w.reorder]
    ro(*r)
    for rep in range(3):
        row = {"w": w.name, "rep": rep,
               "cublas": timer(lambda: torch.matmul(x, weights()[0].t())),
               "kernel": timer(lambda: _launch(k, w, xt, weights(), r, out)),
               "both": timer(lambda: (ro(*r), _launch(k, w, xt, weights(), r, out))),
               "reorder": timer(lambda: ro(*r)),
               "kernel2": timer(lambda: _launch(k, w, xt, weights(), r, out))}
        print(json.dumps({a: (round(b, 1) if isinstance(b, float) else b) for a, b in row.items()}), flush=True)
        res.append(row)
json.dump(res, open(sys.argv[2], "w"))
