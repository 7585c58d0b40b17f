"""Correctness on a real GPU with the TVM runtime alone: run what tools/build_gpu_check.py built.

    python tools/gpu_check.py BUILD_DIR [--json OUT.json]

Prints, for the bundled example and for each kernel and mask kind, the max relative error against a
PyTorch/NumPy reference, and whether two runs gave bit-identical results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import numpy as np
import torch

import wide_tvm
from wide_tvm.kernel_reference import (MASK_KINDS, make_mask, ref_gemm_k, ref_gemm_mn, ref_mask_reorder,
                                       rel_err)
from wide_tvm.model import WideConfig, build_example, example_inputs
from wide_tvm.runtime import _ensure_cuda_runtime

TOKENS = (1, 5, 16, 33, 100)


def check_example(build_dir: str, rows: list, name: str = "example") -> None:
    model = wide_tvm.load(os.path.join(build_dir, f"{name}.so"), "cuda")
    with open(os.path.join(build_dir, "kernels.json")) as f:
        cfg = WideConfig(**json.load(f)["config"])
    ref_model = build_example(cfg).cuda()
    for t in TOKENS:
        x = example_inputs(cfg, t)
        with torch.no_grad():
            ref = ref_model(x.cuda()).double().cpu().numpy()
        out1, out2 = model(x.numpy()), model(x.numpy())
        rows.append({"what": f"{name} (tiny WIDE LM, fp32)", "tokens": t, "mask": "router",
                     "rel_err": rel_err(out1, ref), "deterministic": bool(np.array_equal(out1, out2))})


def _tensor(tvm, a, dev):
    return tvm.runtime.tensor(np.ascontiguousarray(a), dev)


def check_kernels(build_dir: str, rows: list) -> None:
    import tvm

    dev = tvm.cuda(0)
    lib = tvm.runtime.load_module(os.path.join(build_dir, "kernels.so"))
    with open(os.path.join(build_dir, "kernels.json")) as f:
        specs = json.load(f)["kernels"]
    rng = np.random.default_rng(0)
    for spec in specs:
        g, gs, dim, dtype, layout = spec["groups"], spec["group_size"], spec["dim"], spec["dtype"], spec["layout"]
        fn = lib[spec["name"]]
        for t in TOKENS:
            for kind in MASK_KINDS:
                mask = make_mask(kind, t, g, rng)
                if spec["kind"] == "mask_reorder":
                    counts = tvm.runtime.empty((g,), "int32", dev)
                    order = tvm.runtime.empty((g, t), "int32", dev)
                    fn(_tensor(tvm, mask, dev), counts, order)
                    rc, ro = ref_mask_reorder(mask)
                    ok = np.array_equal(counts.numpy(), rc) and np.array_equal(order.numpy(), ro)
                    rows.append({"what": spec["name"], "tokens": t, "mask": kind, "rel_err": 0.0 if ok else 1.0,
                                 "deterministic": True})
                    continue
                scale = 1.0 / np.sqrt(dim if spec["kind"] != "gemm_k" else g * gs)
                outs = []
                if spec["kind"] == "gemm_k":
                    a = rng.standard_normal((t, g * gs)).astype(dtype)
                    w = (rng.standard_normal((dim, g * gs) if layout == "nk" else (g * gs, dim)) * scale).astype(dtype)
                    ref = ref_gemm_k(a, w, mask, gs, layout)
                    for _ in range(2):
                        out = tvm.runtime.empty((t, dim), dtype, dev)
                        fn(_tensor(tvm, a, dev), _tensor(tvm, w, dev), _tensor(tvm, mask, dev), out)
                        outs.append(out.numpy())
                else:
                    n = g * gs
                    x = rng.standard_normal((t, dim)).astype(dtype)
                    wshape = (n, dim) if layout == "nk" else (dim, n)
                    wg = (rng.standard_normal(wshape) * scale).astype(dtype)
                    wu = (rng.standard_normal(wshape) * scale).astype(dtype)
                    ref = ref_gemm_mn(x, wg, wu, mask, gs, layout, spec["kind"] == "gemm_mn_swiglu")
                    rc, ro = ref_mask_reorder(mask)
                    for _ in range(2):
                        out = tvm.runtime.empty((t, n), dtype, dev)
                        fn(*(_tensor(tvm, v, dev) for v in (x, wg, wu, rc, ro)), out)
                        outs.append(out.numpy())
                rows.append({"what": f"{spec['name']} g{g}x{gs} {dtype} {layout}", "tokens": t, "mask": kind,
                             "rel_err": rel_err(outs[0], ref), "deterministic": bool(np.array_equal(*outs))})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("build_dir")
    p.add_argument("--json")
    args = p.parse_args()
    import tvm

    _ensure_cuda_runtime(tvm)
    rows: list = []
    check_example(args.build_dir, rows)
    check_example(args.build_dir, rows, "example_dense")
    check_kernels(args.build_dir, rows)
    worst: dict = {}
    for r in rows:
        w = worst.setdefault(r["what"], {"rel_err": 0.0, "deterministic": True, "cases": 0})
        w["rel_err"] = max(w["rel_err"], r["rel_err"])
        w["deterministic"] &= r["deterministic"]
        w["cases"] += 1
    print(f"device: {torch.cuda.get_device_name(0)}; host {platform.node()}; TVM runtime-only="
          f"{os.environ.get('TVM_USE_RUNTIME_LIB', '0')}")
    print(f"{'what':48s} {'cases':>5s} {'max rel err':>12s} {'deterministic':>13s}")
    for what, w in worst.items():
        print(f"{what:48s} {w['cases']:5d} {w['rel_err']:12.3e} {str(w['deterministic']):>13s}")
    for r in rows:
        if r["what"].startswith("example"):
            print(f"  {r['what']:40s} tokens={r['tokens']:4d} rel_err={r['rel_err']:.3e} deterministic={r['deterministic']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows, "summary": worst}, f, indent=1)


if __name__ == "__main__":
    main()
