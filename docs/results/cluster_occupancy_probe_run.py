"""Launch every cluster-occupancy probe kernel once (for ncu's launch statistics)."""
import torch
import tvm
from wide_tvm.runtime import _ensure_cuda_runtime

_ensure_cuda_runtime(tvm)
lib = tvm.runtime.load_module(".park/probe/probe.so")  # cluster_occupancy_probe_build.py writes it
a = tvm.runtime.from_dlpack(torch.zeros(4096, device="cuda"))
for c in (1, 2, 3, 4, 8, 16):
    for kb in (96, 197):
        name = f"probe_c{c}_s{kb}"
        try:
            lib[name](a)
            torch.cuda.synchronize()
            print(name, "ran")
        except Exception as e:  # a cluster size the GPU refuses
            print(name, "failed:", str(e).splitlines()[-1][:200])
