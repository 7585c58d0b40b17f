"""Build here (no GPU) the generation check's libraries: the fp16 example model compiled for CUDA with --generation,
into DIR/gen_fp16.so (+ weights), and the same without CUDA graphs (DIR/gen_fp16_nograph.so);
tools/gpu_generation_check.py runs either on the GPU host.
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
    for name, graphs in (("gen_fp16.so", True), ("gen_fp16_nograph.so", False)):
        compiled = wide_tvm.compile(onnx, "cuda", generation=True, cuda_graph=graphs)
        compiled.export(os.path.join(out, name))
        print(f"wrote {out}/{name}: {compiled.kv_cache}, CUDA graphs {graphs}")
    os.remove(onnx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
