"""Which part of the end-to-end benchmark's import path a CUDA library's `main` disagrees with PyTorch on: small
fp16 libraries built here through each path, then run on the GPU host against the PyTorch WIDE model whose weights
they are given (bench/e2e_weights.py), 16 random tokens each.

    python tools/gpu_main_bisect.py build DIR [VARIANT...]  # here: DIR/<variant>.so + DIR/bisect.json
    python tools/gpu_main_bisect.py run DIR       # on the GPU host: one line per variant

Variants: the benchmark's path (one layer exported N times, placeholder weights, untied: bench/e2e_model.py) with
SDPA attention, gated and dense; the whole model exported by torch.export (placeholder weights), SDPA and eager
attention; and the benchmark's path on 2 layers of Llama-3.1-8B's shapes."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace


def _variants():
    from wide_tvm.bench.e2e_model import E2E_MODELS  # (imports no tvm)

    tiny = replace(E2E_MODELS["tiny"], num_layers=2)
    return {"bench_sdpa": (tiny, "bench", {}), "bench_sdpa_dense": (tiny, "bench", {"dense": True}),
            "export_sdpa": (tiny, "export", {}), "export_eager": (replace(tiny, attention="eager"), "export", {}),
            "bench_llama8b_2": (replace(E2E_MODELS["llama8b"], num_layers=2), "bench", {})}


def build(out: str, only=()) -> None:
    from wide_tvm.cuda_aot import cuda_codegen

    cuda_codegen()  # (before the first import of tvm)
    import torch

    import wide_tvm
    from wide_tvm.bench.e2e_model import import_for_benchmark
    from wide_tvm.frontends.export import export_program
    from wide_tvm.frontends.loader import import_model
    from wide_tvm.model import build_example, example_inputs

    os.makedirs(out, exist_ok=True)
    spec = {}
    for name, (cfg, path, options) in _variants().items():
        if only and name not in only:
            continue
        if path == "bench":
            imported = import_for_benchmark(cfg, "float16")
        else:
            with torch.no_grad():
                program = export_program(build_example(cfg, seed=0).half().eval(), example_inputs(cfg, 8))
            imported = import_model(program, weights=False)
        compiled = wide_tvm.compile(imported, "cuda", **options)
        compiled.export_library(os.path.join(out, name + ".so"))
        spec[name] = {"config": json.loads(cfg.to_json()), "library": name + ".so",
                      "weights": [[list(w.shape), str(w.dtype)] for w in compiled.model.weights],
                      "weight_names": compiled.model.weight_names, "weight_origins": compiled.weight_origins,
                      "blas": compiled.meta()["blas"]}
        print(f"built {name}", flush=True)
    with open(os.path.join(out, "bisect.json"), "w") as f:
        json.dump(spec, f)


def run(out: str) -> None:
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from wide_tvm.bench.e2e_weights import calibrate, library_weights, main_against, reference_model
    from wide_tvm.blas.libraries import load as load_blas
    from wide_tvm.model.config import WideConfig
    from wide_tvm.runtime import ensure_cuda_runtime

    ensure_cuda_runtime(tvm)
    with open(os.path.join(out, "bisect.json")) as f:
        spec = json.load(f)
    for name, lib in spec.items():
        try:
            load_blas(lib["blas"])
            vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(out, lib["library"])), tvm.cuda(0))
            model = reference_model(WideConfig(**lib["config"]), torch.device("cuda"), seed=0, dtype=torch.float16)
            calibrate(model, 0.5)
            weights = [tvm.runtime.from_dlpack(w) for w in library_weights(lib, model.state_dict())]
            got, want = main_against(vm, weights, model)
            err = float((got - want).abs().max() / want.abs().max())
            print(f"{name}: error {err:.2e} of the largest logit; ours |max| {float(got.abs().max()):.3g} mean "
                  f"{float(got.abs().mean()):.3g} nan {bool(got.isnan().any())}; torch |max| "
                  f"{float(want.abs().max()):.3g} mean {float(want.abs().mean()):.3g}; per token "
                  f"{[round(float(e), 2) for e in ((got - want).abs().amax(-1) / want.abs().amax(-1))[0, :6]]}",
                  flush=True)
            del model, weights, want, got
            torch.cuda.empty_cache()
        except Exception as e:  # (one line per variant, whatever fails)
            print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "run"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    build(sys.argv[2], sys.argv[3:]) if sys.argv[1] == "build" else run(sys.argv[2])
