"""Probe: can a TIR kernel call AVX512-BF16 vdpbf16ps (llvm.x86.avx512bf16.dpbf16ps.512) on bf16 data?

    python docs/results/experiment_cpu_dpbf16.py i32   # the bf16 pairs loaded as an int32 view
    python docs/results/experiment_cpu_dpbf16.py bf    # the int32 view reinterpreted as bfloat16x32

Both fail LLVM verification on TVM 0.27 (2026-12-06): the intrinsic wants <32 x bfloat>, TVM passes <16 x i32> or
(its bf16 legalization having widened bf16 vectors) <32 x float>. Checks the result against NumPy where it builds.
"""
import sys, tvm, numpy as np, ml_dtypes
from tvm.script import tirx as T
from wide_tvm.targets import parse_target
mode = sys.argv[1]
@T.prim_func
def f(a: T.Buffer((64,), "bfloat16"), b: T.Buffer((64,), "bfloat16"), c: T.Buffer((16,), "float32")):
    a32 = T.decl_buffer((32,), "int32", data=a.data)
    b32 = T.decl_buffer((32,), "int32", data=b.data)
    acc = T.decl_buffer((16,), "float32", scope="local")
    for v in T.vectorized(16):
        acc[v] = T.float32(0)
    for k in range(2):
        if mode == "i32":
            acc[T.ramp(0, 1, 16)] = T.call_llvm_pure_intrin("float32x16", "llvm.x86.avx512bf16.dpbf16ps.512",
                acc[T.ramp(0, 1, 16)], a32[T.ramp(k * 16, 1, 16)], b32[T.ramp(k * 16, 1, 16)])
        else:
            acc[T.ramp(0, 1, 16)] = T.call_llvm_pure_intrin("float32x16", "llvm.x86.avx512bf16.dpbf16ps.512",
                acc[T.ramp(0, 1, 16)], T.reinterpret("bfloat16x32", a32[T.ramp(k * 16, 1, 16)]),
                T.reinterpret("bfloat16x32", b32[T.ramp(k * 16, 1, 16)]))
    for v in T.vectorized(16):
        c[v] = acc[v]
try:
    lib = tvm.compile(f.with_attr("global_symbol","main"), target=parse_target("llvm"))
    a = (np.random.randn(64)).astype(ml_dtypes.bfloat16); b=(np.random.randn(64)).astype(ml_dtypes.bfloat16)
    c = tvm.runtime.tensor(np.zeros(16,"float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    ref = (a.astype("float32")*b.astype("float32")).reshape(2,16,2).sum(axis=(0,2))
    print("max err", np.abs(c.numpy()-ref).max())
except Exception as e:
    print("ERR", str(e)[-700:])
