"""Cluster-occupancy probe kernels: one per (cluster size, dynamic shared memory per block), for
docs/results/cluster_occupancy_h200.txt (ncu reports each launch's "Max Active Clusters")."""
import os

from wide_tvm.cuda_aot import prepare_cuda_aot
prepare_cuda_aot()
import tvm
from tvm.script import tirx as T

def probe(c: int, smem_kb: int):
    n_half = smem_kb * 1024 // 2

    @T.prim_func
    def k(a: T.Buffer((4096,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for bx in T.thread_binding(c * 64, thread="blockIdx.x"):
            for cx in T.thread_binding(c, thread="clusterCtaIdx.x"):
                xs = T.decl_buffer((n_half,), "float16", scope="shared.dyn")
                for tx in T.thread_binding(128, thread="threadIdx.x"):
                    xs[tx * (n_half // 128) + n_half // 128 - 1] = T.Cast("float16", tx)
                    T.tvm_storage_sync("shared")
                    if tx == 0:
                        a[bx % 4096] = T.Cast("float32", xs[n_half - 1])
    return k

funcs = {}
for c in (1, 2, 3, 4, 8, 16):
    for kb in (96, 197):
        funcs[f"probe_c{c}_s{kb}"] = probe(c, kb).with_attr("global_symbol", f"probe_c{c}_s{kb}")
t = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
with t:
    lib = tvm.compile(tvm.IRModule(funcs), t)
os.makedirs(".park/probe", exist_ok=True)
lib.export_library(".park/probe/probe.so")  # from the repository root; .park/ is git-ignored
print("ok", list(funcs))
