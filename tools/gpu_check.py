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
from wide_tvm.kernel_reference import MASK_KINDS, make_mask, ref_mask_reorder, rel_err
from wide_tvm.model import WideConfig, WideForCausalLM, build_example, example_inputs
from wide_tvm.runtime import ensure_cuda_runtime
from wide_tvm.weight_layout import pack

TOKENS = (1, 5, 8, 9, 16, 17, 32, 33, 63, 64, 65, 100, 700)


def check_example(build_dir: str, rows: list, name: str = "example") -> None:
    model = wide_tvm.load(os.path.join(build_dir, f"{name}.so"), "cuda")
    if name == "hf_llama":  # tiny Llama + WIDE routers + LoRA, built from a Hugging Face folder
        with open(os.path.join(build_dir, "hf_llama_config.json")) as f:
            cfg = WideConfig.from_json(f.read())
        ref_model = WideForCausalLM(cfg)
        ref_model.load_state_dict(torch.load(os.path.join(build_dir, "hf_llama_state.pt")))
        ref_model = ref_model.eval().cuda()
    else:
        with open(os.path.join(build_dir, "example_config.json")) as f:
            cfg = WideConfig.from_json(f.read())
        ref_model = build_example(cfg).cuda()
        if name.startswith("example_fp16"):  # PyTorch in fp16 on the GPU as the reference
            ref_model = ref_model.half()
    dtype = "fp16" if name.startswith("example_fp16") else "fp32"
    for t in TOKENS:
        x = example_inputs(cfg, t)
        with torch.no_grad():
            ref = ref_model(x.cuda()).double().cpu().numpy()
        out1, out2 = model(x.numpy()), model(x.numpy())
        rows.append({"what": f"{name} (tiny WIDE LM, {dtype})", "tokens": t, "mask": "router",
                     "rel_err": rel_err(out1, ref), "deterministic": bool(np.array_equal(out1, out2))})


def _ref_mn(x, wg, wu, mask, gs, layout, swiglu):
    """float64 reference on the GPU (numpy is too slow for Llama shapes); "tc" weights are made as [N, K]."""
    kn = (lambda w: w) if layout == "kn" else (lambda w: w.t())
    a = x.double() @ kn(wg).double()
    if swiglu:
        a = torch.nn.functional.silu(a) * (x.double() @ kn(wu).double())
    return a * torch.repeat_interleave(mask.double(), gs, dim=1)


def _ref_k(a, w, mask, gs, layout):
    kn = w if layout == "kn" else w.t()
    return (a.double() * torch.repeat_interleave(mask.double(), gs, dim=1)) @ kn.double()


def _rel(out, ref) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    scale = ref.abs().max().item()
    diff = (out - ref).abs().max().item() if out.numel() else 0.0
    return diff / scale if scale > 0 else diff


def check_kernels(build_dir: str, rows: list, token_counts: tuple | None = None) -> None:
    """Every kernel case of BUILD_DIR/kernels.so against torch, twice each (determinism), at its token counts (or
    `token_counts`, for every GEMM case: e.g. many-token counts, past where the defaults stop for Llama shapes)."""
    import tvm

    lib = tvm.runtime.load_module(os.path.join(build_dir, "kernels.so"))
    with open(os.path.join(build_dir, "kernels.json")) as f:
        specs = json.load(f)["kernels"]
    rng = np.random.default_rng(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tv = tvm.runtime.from_dlpack

    def randn(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(getattr(torch, dtype))

    for spec in specs:
        g, gs, dim, dtype, layout = spec["groups"], spec["group_size"], spec["dim"], spec["dtype"], spec["layout"]

        def stored(w, layout=layout):  # the kernel's weight layout ("tc" tiles are packed from [N, K])
            return pack(w, "tc") if layout == "tc" else w

        fn = lib[spec["name"]]
        big = max(dim, g * gs) >= 4096
        if spec["kind"] == "gemm_k":
            k = g * gs
            w = randn(*((k, dim) if layout == "kn" else (dim, k)), dtype=dtype, scale=1 / np.sqrt(k))
        elif spec["kind"] != "mask_reorder":
            n = g * gs
            wshape = (dim, n) if layout == "kn" else (n, dim)
            wg, wu = (randn(*wshape, dtype=dtype, scale=1 / np.sqrt(dim)) for _ in range(2))
        if spec["kind"] == "mask_reorder":  # also past one 4096-token round of the parallel partition
            counts_to_check = TOKENS + (4095, 4096, 4097, 9000)
        elif token_counts:  # (not `counts`: the reorder cases below name their output so)
            counts_to_check = token_counts
        else:
            counts_to_check = TOKENS if not big else (1, 4, 8, 9, 16, 17, 31, 32, 33, 47, 64, 65, 130, 300) + (
                (511, 512, 513) if spec.get("reorder_free", 0) > 64 else ())  # both sides of the kernels' sorting
        for t in counts_to_check:
            for kind in MASK_KINDS:
                mask_np = make_mask(kind, t, g, rng)
                mask = torch.from_numpy(mask_np).cuda()
                rc, ro, ru = (torch.from_numpy(v).cuda() for v in ref_mask_reorder(mask_np))
                if spec["kind"] == "mask_reorder":
                    counts = torch.empty(g, dtype=torch.int32, device="cuda")
                    order = torch.empty(g, t, dtype=torch.int32, device="cuda")
                    used = torch.full((g + 1,), -1, dtype=torch.int32, device="cuda")
                    fn(tv(mask), tv(counts), tv(order), tv(used))
                    # the used-group list is written up to SERIAL_TOKENS (16) tokens: past that, the CUDA kernels
                    # take the groups in natural order (schedules/mask_reorder.py; not importable here)
                    ok = torch.equal(counts, rc) and torch.equal(order, ro) and (t > 16 or torch.equal(used, ru))
                    rows.append({"what": spec["name"], "tokens": t, "mask": kind, "rel_err": 0.0 if ok else 1.0,
                                 "deterministic": True})
                    continue
                outs = []
                if spec["kind"] == "gemm_k":
                    a = randn(t, g * gs, dtype=dtype)
                    ref = _ref_k(a, w, mask, gs, layout)
                    for _ in range(2):
                        out = torch.full((t, dim), float("nan"), dtype=getattr(torch, dtype), device="cuda")
                        fn(tv(a), tv(stored(w)), tv(mask), tv(rc), tv(ro), tv(ru), tv(out))
                        outs.append(out)
                else:
                    x = randn(t, dim, dtype=dtype)
                    ref = _ref_mn(x, wg, wu, mask, gs, layout, spec["kind"] == "gemm_mn_swiglu")
                    if t <= spec.get("reorder_free", 0):  # the kernel reads no reorder: hand it a wrong one
                        rc, ro, ru = torch.zeros_like(rc), torch.zeros_like(ro), torch.zeros_like(ru)
                    for _ in range(2):
                        out = torch.full((t, g * gs), float("nan"), dtype=getattr(torch, dtype), device="cuda")
                        fn(tv(x), tv(stored(wg)), tv(stored(wu)), tv(mask), tv(rc), tv(ro), tv(ru), tv(out))
                        outs.append(out)
                rows.append({"what": f"{spec['name']} g{g}x{gs} {dtype} {layout} {spec.get('knobs', '')}".rstrip(),
                             "tokens": t, "mask": kind,
                             "rel_err": _rel(outs[0], ref), "deterministic": bool(torch.equal(*outs))})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("build_dir")
    p.add_argument("--json")
    p.add_argument("--counts", type=int, nargs="+", help="token counts for every GEMM case instead of its own")
    args = p.parse_args()
    import tvm

    ensure_cuda_runtime(tvm)
    rows: list = []
    if os.path.exists(os.path.join(args.build_dir, "example.so")):  # not in a `build_gpu_check.py --only` build
        check_example(args.build_dir, rows)
        check_example(args.build_dir, rows, "example_dense")
        check_example(args.build_dir, rows, "hf_llama")
        check_example(args.build_dir, rows, "example_fp16")
        check_example(args.build_dir, rows, "example_fp16_wgmma")  # its gate/up on the wgmma GEMM past 32 tokens
        if os.path.exists(os.path.join(args.build_dir, "example_fp16_fallback.so")):
            check_example(args.build_dir, rows, "example_fp16_fallback")  # every gated kernel on cuBLASLt
    if os.path.exists(os.path.join(args.build_dir, "kernels.so")):  # not in a `build_gpu_check.py --examples` build
        check_kernels(args.build_dir, rows, tuple(args.counts) if args.counts else None)
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
