"""Build here (no GPU) the generation check's library: the fp16 example model compiled for CUDA with --generation,
into DIR/gen_fp16.so (+ weights); tools/gpu_generation_check.py runs it on the GPU host.
    python tools/build_gpu_generation.py DIR"""

from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    import wide_tvm
    from wide_tvm.frontends.export import export_model
    from wide_tvm.model import WideConfig, build_example, example_inputs

    out = argv[0]
    os.makedirs(out, exist_ok=True)
    cfg = WideConfig()
    onnx = os.path.join(out, "gen_fp16.onnx")
    export_model(build_example(cfg, seed=3).half(), example_inputs(cfg), onnx)
    compiled = wide_tvm.compile(onnx, "cuda", generation=True)
    compiled.export(os.path.join(out, "gen_fp16.so"))
    os.remove(onnx)
    print(f"wrote {out}/gen_fp16.so: {compiled.kv_cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
