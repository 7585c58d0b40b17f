"""The bundled example: build a tiny WIDE model, export to ONNX, compile for the host CPU, run it through
the TVM runtime and check it against PyTorch.  `python -m wide_tvm.example [--out DIR]`
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time

import numpy as np
import torch

import wide_tvm
from wide_tvm.frontends.export import export_model
from wide_tvm.model import WideConfig, build_example, example_inputs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="out/example", help="folder for model.onnx, model.so, model.weights.npz")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    cfg = WideConfig()
    model = build_example(cfg)
    onnx_path, lib = os.path.join(args.out, "model.onnx"), os.path.join(args.out, "model.so")
    with contextlib.redirect_stdout(io.StringIO()):
        export_model(model, example_inputs(cfg), onnx_path)
    print(f"exported {onnx_path}")
    start = time.perf_counter()
    compiled = wide_tvm.compile(onnx_path, "llvm")
    compiled.export(lib)
    print(compiled.summary())
    print(f"compiled {lib} in {time.perf_counter() - start:.1f} s")
    runner = wide_tvm.load(lib, "cpu")
    print(f"\n{'tokens':>6} {'max rel err vs PyTorch':>24} {'FFN groups active':>18} {'attn groups active':>19}")
    worst = 0.0
    for tokens in (1, 7, 33, 128):
        x = example_inputs(cfg, tokens, seed=tokens)
        with torch.no_grad():
            ref = model(x).numpy()
            masks = model.router_masks(x)
        out = runner(x.numpy())
        err = float(np.abs(out - ref).max() / np.abs(ref).max())
        worst = max(worst, err)
        ffn = np.mean([m[1].mean().item() for m in masks])
        attn = np.mean([m[0].mean().item() for m in masks])
        print(f"{tokens:6d} {err:24.3e} {ffn:17.0%} {attn:18.0%}")
    ok = worst < 1e-5
    print(f"\n{'OK' if ok else 'MISMATCH'}: compiled model matches PyTorch (worst relative error {worst:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
