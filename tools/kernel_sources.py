"""Write the TIR and generated code of every benchmark kernel into a folder, to prove a refactor changed no kernel.

    python tools/kernel_sources.py OUT [--sweep all|tiles|wgmma] [--cpu] [--records-of REV]   # today's tree
    PYTHONPATH=OLD_PKG python tools/kernel_sources.py OUT_OLD ...        # a laid-out older package (REV's)
    diff -r OUT_OLD OUT                                                    # nothing: the same kernels

`--records-of REV` applies the tuning records REV's kernel code stamped (schedules/code_version.py: records_of), so
that a tree whose kernel modules changed (its records not re-stamped yet) builds the same picks as REV.

CUDA: the kernels `wide-bench build` builds (the committed picks; with --sweep every knob candidate too), each as
DIR/cuda/NAME.tir (TVMScript, after the launch bounds wide-compile adds), and the generated CUDA of all of them in
DIR/cuda/ALL.cu (device code is not compiled: nvcc is replaced by a callback that returns the source, so this takes
about a minute for the default build on 2 cores). CPU (--cpu): the `wide-bench cpu` kernels with their tuned tiles,
as DIR/cpu/NAME.tir and DIR/cpu/NAME.ll (LLVM IR, compiled for x86-64-v3, with the object addresses LLVM's
type-based alias metadata names replaced by 0x?). Runs against the package layout before 2026-12-07 too (an older
revision laid out as tools/gpu_tune.sh does), so a change can be compared with the revision before it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re


def _tuning_root():
    """The committed tunings of the package under test (tuning/folders.py; a compiler constant before 2026-12-07)."""
    try:
        from wide_tvm.tuning.folders import shipped_root
    except ImportError:
        from wide_tvm.compiler import REPO_TUNING_LOGS

        return REPO_TUNING_LOGS
    return shipped_root()


def _cuda(out: str, sweep: str | None) -> int:
    import tvm
    import tvm_ffi

    from wide_tvm.bench import build as B
    from wide_tvm.schedules.launch_bounds import as_built
    from wide_tvm.targets import parse_target, target_folder

    try:
        from wide_tvm.tuning.database import load
    except ImportError:  # before the tuning subpackage
        from wide_tvm.kernel_knobs import load

    tgt = parse_target("cuda")

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _source(code):  # the CUDA source itself instead of a fatbin
        return code.encode()

    os.makedirs(os.path.join(out, "cuda"), exist_ok=True)
    with tgt:
        tuned = load(str(_tuning_root() / target_folder(tgt)))
        workloads = B.with_bounds(B.LLAMA_8B, "cuda", tuned, True)
        funcs = {name: as_built(f, True) for name, f in B.our_kernels(workloads, "cuda", sweep, tuned, True).items()}
        for name, func in sorted(funcs.items()):
            with open(os.path.join(out, "cuda", f"{name}.tir"), "w") as f:
                f.write(func.script())
        lib = tvm.compile(tvm.IRModule(funcs), tgt)
        with open(os.path.join(out, "cuda", "ALL.cu"), "w") as f:
            f.write(lib.mod.imports[0].inspect_source())
    return len(funcs)


def _cpu(out: str) -> int:
    import tvm

    from wide_tvm.bench.cpu import cpu_workloads
    from wide_tvm.schedules import gated_kernel
    from wide_tvm.schedules.tiles import tiles_from_log
    from wide_tvm.targets import parse_target

    try:
        from wide_tvm.tuning.database import load
    except ImportError:  # before the tuning subpackage
        from wide_tvm.kernel_knobs import load

    tuned = load(str(_tuning_root() / "llvm"))
    tgt = parse_target("llvm:x86-64-v3")  # a fixed CPU: the same code on any build host
    os.makedirs(os.path.join(out, "cpu"), exist_ok=True)
    workloads = cpu_workloads()
    for w in workloads:
        layout = w.spec("llvm").layout if hasattr(w, "spec") else ("kp" if w.kind == "gemm_k" else "nk")
        key = f"{w.kernel_kind}/g{w.groups}x{w.group_size}/d{w.dim}/{w.dtype}"
        entry = tuned.get(key, {})
        tile = tiles_from_log(entry["cpu"]) if "cpu" in entry else None
        func = gated_kernel(w.kernel_kind, w.groups, w.group_size, w.dim, w.dtype, layout, "llvm", cpu_tile=tile)
        func = func.with_attr("global_symbol", "main")
        with open(os.path.join(out, "cpu", f"{w.name}.tir"), "w") as f:
            f.write(func.script())
        with open(os.path.join(out, "cpu", f"{w.name}.ll"), "w") as f:
            f.write(re.sub(r'"0x[0-9a-f]+', '"0x?', tvm.compile(func, target=tgt).mod.inspect_source("ll")))
    return len(workloads)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--sweep", choices=("all", "tiles", "wgmma"), help="every knob candidate too (wide-bench build --sweep)")
    p.add_argument("--cpu", action="store_true", help="the CPU kernels too")
    p.add_argument("--records-of", metavar="REV", help="apply the tuning records REV's kernel code stamped")
    args = p.parse_args(argv)
    try:
        from wide_tvm.cuda_aot import cuda_codegen
    except ImportError:  # before 2026-12-07: the stand-in driver alone (the wgmma module registered sm_90a itself)
        from wide_tvm.cuda_aot import prepare_cuda_aot as cuda_codegen
    cuda_codegen()
    from wide_tvm.schedules.code_version import records_of

    with records_of(args.records_of) if args.records_of else contextlib.nullcontext():
        print(f"{args.out}: {_cuda(args.out, args.sweep)} CUDA kernels", flush=True)
        if args.cpu:
            print(f"{args.out}: {_cpu(args.out)} CPU kernels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
