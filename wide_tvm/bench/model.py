"""wide-bench model: a whole WIDE model compiled gated and dense (both with the BLAS dispatch), timed against the
same model in PyTorch (SDPA attention, cuBLAS / torch's CPU GEMMs) on the same device.

    wide-bench model-build DIR [--target cuda|llvm]   # here: export + compile; the libraries alone (no weights)
    wide-bench model-run DIR --json OUT.json           # where they run

The model (`MODELS`): "llama8b-2l" for CUDA, 2 decoder layers of Llama-3.1-8B shapes (hidden 4096, 32 query / 8 KV
heads of 128, intermediate 14336; FFN groups of 128, attention groups of 4 heads, router rank 128) in fp16 with a
small vocabulary (1024) so the LM head does not dominate; "cpu-2l" for the CPU, 2 layers of hidden 2048,
intermediate 5632 in fp32. Weights are made on the running device from a seed (random routers gate about half the
groups per token), so nothing big travels: DIR holds the libraries and model.json (config and weight shapes).
The PyTorch baseline is the same architecture without routers (the dense model a user would otherwise run).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from ..model.config import LLAMA_3_1_8B, WideConfig

MODELS = {
    "llama8b-2l": replace(LLAMA_3_1_8B, vocab_size=1024, num_layers=2),
    "cpu-2l": WideConfig(vocab_size=1024, hidden_size=2048, intermediate_size=5632, num_layers=2, num_heads=16,
                         num_kv_heads=4, head_dim=128, attn_group_size=4, ffn_group_size=128, router_rank=64,
                         attention="sdpa"),
}
TOKENS = {"cuda": (1, 16, 64, 128, 512, 2048, 4096), "cpu": (1, 16, 128)}


def build_model(out_dir: str, target: str = "cuda", name: str | None = None) -> str:
    """Export MODELS[name] and compile it gated (model_gated.so), gated without the dense fallback
    (model_gated_nofallback.so) and dense (model_dense.so); DIR/model.json."""
    import torch

    import wide_tvm

    from ..frontends.export import export_model
    from ..model import build_example, example_inputs

    kind = "cuda" if target.startswith("cuda") else "cpu"
    name = name or ("llama8b-2l" if kind == "cuda" else "cpu-2l")
    cfg = MODELS[name]
    os.makedirs(out_dir, exist_ok=True)
    model = build_example(cfg)
    if kind == "cuda":
        model = model.half()
    path = os.path.join(out_dir, "model.pt2")
    with torch.no_grad():
        export_model(model, example_inputs(cfg, 8), path)
    del model
    libs = {}
    for variant, options in (("gated", {}), ("gated_nofallback", {"fallback": "off"}), ("dense", {"dense": True})):
        compiled = wide_tvm.compile(path, target, **options)
        libs[variant] = {"library": f"model_{variant}.so", "layers": len(compiled.layers),
                         "dense_fallback": compiled.meta()["dense_fallback"],
                         "blas_matmuls": len(compiled.blas_matmuls), "blas": compiled.meta()["blas"],
                         "weights": [[list(w.shape), str(w.dtype)] for w in compiled.model.weights],
                         "weight_names": compiled.model.weight_names}
        compiled.export_library(os.path.join(out_dir, libs[variant]["library"]))
    os.remove(path)
    with open(os.path.join(out_dir, "model.json"), "w") as f:
        json.dump({"model": name, "config": json.loads(cfg.to_json()), "device": kind, "target": target,
                   "libraries": libs}, f, indent=1)
    return out_dir


def random_weights(spec: list, torch_device, seed: int) -> list:
    """Random weights of the recorded shapes: vectors (norm scales, biases) ones, matrices N(0, 0.02^2)."""
    import torch

    gen = torch.Generator(device=torch_device).manual_seed(seed)
    out = []
    for shape, dtype in spec:
        dt = getattr(torch, dtype)
        if len(shape) == 1:
            out.append(torch.ones(shape, dtype=dt, device=torch_device))
        else:
            out.append((torch.randn(shape, generator=gen, device=torch_device) * 0.02).to(dt))
    return out


def run_model(build_dir: str, tokens=None, json_path: str | None = None, progress=print) -> dict:
    from ..cpu_threads import use_physical_cores

    use_physical_cores()  # before TVM's CPU pool starts (it reads the count once)
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from ..blas.libraries import load as load_blas
    from ..model.modules import WideForCausalLM

    with open(os.path.join(build_dir, "model.json")) as f:
        spec = json.load(f)
    kind = spec["device"]
    cfg = WideConfig(**spec["config"])
    dense_cfg = WideConfig(**(spec["config"] | {"gated_layers": []}))
    for lib in spec["libraries"].values():
        load_blas(lib["blas"])
    if kind == "cuda":
        from ..runtime import ensure_cuda_runtime
        from .measure import _timer

        ensure_cuda_runtime(tvm)
        dev, tdev, dtype = tvm.cuda(0), torch.device("cuda"), torch.float16
        timer, how = _timer("events")
        device_name = torch.cuda.get_device_name(0)
    else:
        dev, tdev, dtype = tvm.cpu(0), torch.device("cpu"), torch.float32
        how, device_name = "wall clock median", "cpu"
        from .cpu import time_call

        def timer(*fns):
            return [time_call(fn, [[]], 10) for fn in fns]
    tv = tvm.runtime.from_dlpack
    ours = {}
    for variant, lib in spec["libraries"].items():
        vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(build_dir, lib["library"])), dev)
        ours[variant] = (vm, [tv(w) for w in random_weights(lib["weights"], tdev, seed=0)])
    with torch.device(tdev):
        torch.manual_seed(0)
        reference = WideForCausalLM(dense_cfg).to(dtype).eval()
    rows = []
    result = {"kind": "model", "model": spec["model"], "config": spec["config"], "device": device_name,
              "timer": how, "rows": rows}
    for t in tokens or TOKENS[kind]:
        ids = torch.randint(0, cfg.vocab_size, (1, t), device=tdev)
        idt = tv(ids)

        def call(variant):
            vm, weights = ours[variant]
            return lambda: vm["main"](idt, *weights)

        variants = list(ours)  # gated, dense and (libraries built since the dense fallback) gated_nofallback
        with torch.no_grad():
            t_torch, *t_ours = timer(lambda: reference(ids), *[call(v) for v in variants])
        got = dict(zip(variants, t_ours))
        t_gated, t_dense = got["gated"], got["dense"]
        row = {"tokens": t, "torch_us": t_torch, **{f"ours_{v}_us": got[v] for v in variants},
               "gated_vs_torch": t_torch / t_gated, "dense_vs_torch": t_torch / t_dense,
               "gated_vs_dense": t_dense / t_gated}
        rows.append(row)
        progress(f"T={t:5d} PyTorch {t_torch:10.1f} us  ours gated {t_gated:10.1f} us (x{t_torch / t_gated:4.2f})  "
                 f"ours dense {t_dense:10.1f} us (x{t_torch / t_dense:4.2f})")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=1)
    return result
