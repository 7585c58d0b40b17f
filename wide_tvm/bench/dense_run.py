"""Run `wide-bench dense-build`'s libraries where they execute (TVM runtime only) and time them next to
torch.matmul: `wide-bench dense-run DIR --json OUT.json`.

Each row: one shape at one token count; torch.matmul (cuBLAS / torch's CPU BLAS), our library's BLAS dispatch, TVM's
own kernels, and the roofline limit (operand bytes at the measured bandwidth or the FLOPs at the measured dense
throughput). GPU times: CUDA events, candidates interleaved, the L2 flushed by a read (bench/measure.py); weights
rotate over enough copies to exceed the L2. CPU times: the median of wall-clock calls. Every BLAS result is checked
against torch (max error relative to the largest reference value) and run twice for determinism.
"""

from __future__ import annotations

import json
import math
import os

from .dense import CPU_TOKENS, TOKENS, DenseShape

TVM_CPU_FLOP_LIMIT = 2e8  # TVM's unscheduled CPU loops run at ~0.4 GFLOP/s here: larger ones are not timed


def _inputs(shape: DenseShape, tokens: int, dtype, device: str, copies: int):
    """(x, [b copies]) as torch tensors, scaled so products stay O(1)."""
    import torch

    xs, bs, _ = shape.operands(tokens)
    x = torch.randn(*xs, device=device).to(dtype)
    scale = 1 / math.sqrt(xs[-1])
    return x, [(torch.randn(*bs, device=device) * scale).to(dtype) for _ in range(copies)]


def _torch_fn(shape: DenseShape):
    import torch

    if shape.form == "scores":
        return lambda x, b: torch.matmul(x, b.transpose(-1, -2))
    if shape.form == "values":
        return torch.matmul
    return lambda x, b: torch.matmul(x, b.t())


def _rel_err(out, ref) -> float:
    ref = ref.double()
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def run_dense(build_dir: str, tokens=None, json_path: str | None = None, progress=print) -> dict:
    from ..cpu_threads import use_physical_cores

    use_physical_cores()  # before TVM's CPU pool starts (it reads the count once)
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from ..blas.libraries import load as load_blas

    with open(os.path.join(build_dir, "dense.json")) as f:
        spec = json.load(f)
    device = spec["device"]
    dtype = getattr(torch, spec["dtype"])
    load_blas([spec["blas"]])
    if device == "cuda":
        from ..runtime import ensure_cuda_runtime
        from .measure import _timer, device_limits

        ensure_cuda_runtime(tvm)
        dev = tvm.cuda(0)
        timer, how = _timer("events")
        limits = device_limits(timer)
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        name = torch.cuda.get_device_name(0)
    else:
        dev = tvm.cpu(0)
        how = "wall clock median"
        from .cpu import cpu_limits, time_call

        limits = cpu_limits()
        l2 = 0
        name = "cpu"
    vms = {kind: rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(build_dir, f"dense_{kind}.so")), dev)
           for kind in ("blas", "tvm")}
    tv = tvm.runtime.from_dlpack
    rows = []
    result = {"kind": "dense", "device": name, "dtype": spec["dtype"], "timer": how, "limits": limits,
              "blas": spec["blas"], "rows": rows}
    itemsize = torch.empty((), dtype=dtype).element_size()
    for sj in spec["shapes"]:
        shape = DenseShape(**sj)
        ref_fn = _torch_fn(shape)
        for t in tokens or (TOKENS if device == "cuda" else CPU_TOKENS):
            _, bshape, _ = shape.operands(t)
            copies = max(1, min(16, math.ceil(3 * l2 / (itemsize * math.prod(bshape))))) if l2 else 1
            x, bs = _inputs(shape, t, dtype, device, copies)
            state = {"i": 0}

            def nxt():
                state["i"] = (state["i"] + 1) % copies
                return bs[state["i"]]

            xt, bts = tv(x), [tv(b) for b in bs]
            ours = lambda: vms["blas"][shape.name](xt, bts[state["i"]])  # noqa: E731
            theirs = lambda: ref_fn(x, bs[state["i"]])  # noqa: E731
            out1, out2 = (vms["blas"][shape.name](xt, bts[0]) for _ in range(2))
            out1, out2 = torch.from_dlpack(out1), torch.from_dlpack(out2)
            ref = ref_fn(x, bs[0])
            err, same = _rel_err(out1, ref), bool(torch.equal(out1, out2))
            flops = shape.flops(t)
            if device == "cuda":
                def step(fn):
                    def call():
                        nxt()
                        fn()
                    return call
                tvm_fn = lambda: vms["tvm"][shape.name](xt, bts[state["i"]])  # noqa: E731
                t_torch, t_blas, t_tvm = timer(step(theirs), step(ours), step(tvm_fn))
            else:
                reps = 20 if flops < 1e9 else 5
                t_torch, t_blas = time_call(theirs, [[]], reps), time_call(ours, [[]], reps)
                t_tvm = (time_call(lambda: vms["tvm"][shape.name](xt, bts[0]), [[]], 3)
                         if flops <= TVM_CPU_FLOP_LIMIT else None)
            limit = max(shape.bytes(t, itemsize) / (limits["bandwidth_gbs"] * 1e3),
                        flops / (limits["tensor_tflops"] * 1e6))
            row = {"shape": shape.name, "n": shape.n, "k": shape.k, "form": shape.form, "tokens": t,
                   "torch_us": t_torch, "blas_us": t_blas, "tvm_us": t_tvm, "limit_us": limit,
                   "blas_vs_torch": t_torch / t_blas, "tvm_vs_torch": t_torch / t_tvm if t_tvm else None,
                   "rel_err": err, "deterministic": same}
            rows.append(row)
            progress(f"{shape.name:18s} T={t:5d} torch {t_torch:10.1f} us  ours {t_blas:10.1f} us "
                     f"(x{t_torch / t_blas:4.2f})  TVM {t_tvm if t_tvm else float('nan'):10.1f} us  "
                     f"limit {limit:9.1f} us  err {err:.1e}{'' if same else '  NONDETERMINISTIC'}")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=1)
    return result
