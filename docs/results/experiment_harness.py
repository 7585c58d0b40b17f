"""What the GPU-host experiment scripts beside this file share: a `wide-bench build` folder's kernels and workloads,
the L2 flush, and one kernel timed over rotated masks beside cuBLAS on the dense shape (CUDA events, medians),
its output checked against the reference for every mask. Run the scripts from the source tree's root."""
import json
import sys

import torch
import tvm

sys.path.insert(0, '.')
from wide_tvm.bench import measure as M  # noqa: E402
from wide_tvm.bench.workloads import Workload  # noqa: E402
from wide_tvm.runtime import _ensure_cuda_runtime  # noqa: E402

_ensure_cuda_runtime(tvm)
tv = tvm.runtime.from_dlpack


class Build:
    """BUILD_DIR's bench.json, ours.so and L2 flush buffer."""

    def __init__(self, build_dir: str):
        self.spec = json.load(open(f"{build_dir}/bench.json"))
        self.ours = tvm.runtime.load_module(f"{build_dir}/ours.so")
        self.l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = M.l2_flush_buffer()

    def workloads(self, names=None):
        """(workload, rotating weights) of the build's workloads (those named in `names`, if given)."""
        for wj in self.spec["workloads"]:
            w = Workload(**wj)
            if names is None or w.name in names:
                yield w, M._rotating_weights(w, self.l2, tv, self.spec.get("layouts", {}).get(w.name, "nk"))

    def time_masks(self, w, weights, x, masks, reps: int):
        """(cuBLAS us, our kernel us, max rel err) of w's kernel on activations x over the masks (numpy [n, G]),
        rotated call to call, their reorders run once up front."""
        kernel, xt = self.ours[w.kernel], tv(x)
        mt = [torch.from_numpy(v).cuda() for v in masks]
        out = torch.empty(x.shape[0], w.n, dtype=torch.float16, device="cuda")
        rp = [M._reorder_args(w, v, tv) for v in mt]
        for r in rp:
            self.ours[w.reorder](*r)
        nxt = M._rotating(lambda i: rp[i], len(rp))

        def call():
            M._launch(kernel, w, xt, weights(), nxt(), tv(out))

        t_cublas, t_kernel = M.event_medians_us([lambda: torch.matmul(x, weights()[0].t()), call], self.flush.sum,
                                                reps=reps)
        err = max(M._check(w, x, weights(), mk, out, lambda wts, a=r: M._launch(kernel, w, xt, wts, a, tv(out)))
                  for mk, r in zip(mt, rp))
        return t_cublas, t_kernel, err
