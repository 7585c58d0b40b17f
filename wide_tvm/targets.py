"""Parse the user's --target into a TVM Target, with one clear error for anything else.

Hopper targets stay `sm_90` for TVM (its dlight schedules read the arch as a number and would take `sm_90a` for
no tensor cores at all), while their device code is compiled for `sm_90a`, the arch-specific variant every
sm_90 GPU runs, whose wgmma instructions our many-token kernels use (`hopper_device_code`).

`llvm` is this machine's CPU (LLVM's name for it, e.g. `znver3`, `rocketlake`), as `-march=native` would be: a
TVM llvm target without an `mcpu` compiles for generic x86-64, i.e. 4-wide SSE2 without FMA, and LLVM rejects
`mcpu=native` under the conda triple this TVM reports. `llvm:CPU` compiles for another CPU (a library to deploy
elsewhere: `llvm:x86-64-v3` runs on any AVX2 + FMA machine, `llvm:generic` on any x86-64).
"""

from __future__ import annotations

import json
import os
import re

from .errors import WideError

_CUDA_LIMITS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def parse_target(spec: str):
    """`llvm`, `cuda` (sm_90: Hopper, device code for sm_90a), `cuda:sm_80`, a TVM tag (`nvidia/nvidia-h100`)
    or a target JSON dict."""
    import tvm

    spec = spec.strip()
    try:
        if spec == "llvm" or spec.startswith("llvm:"):
            return llvm_target(spec.partition(":")[2] or host_cpu())
        if spec == "cuda":
            return tvm.target.Target({"kind": "cuda", "arch": "sm_90", **_CUDA_LIMITS})
        match = re.fullmatch(r"cuda:(sm_\d+)a?", spec)  # sm_90a is sm_90 here: see the module docstring
        if match:
            return tvm.target.Target({"kind": "cuda", "arch": match.group(1), **_CUDA_LIMITS})
        if spec.startswith("{"):
            return tvm.target.Target(json.loads(spec))
        if "/" in spec:
            return tvm.target.Target(spec)
    except WideError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM raises many types for bad targets
        raise WideError(f"unknown target {spec!r}: {str(err).strip().splitlines()[-1]}") from None
    raise WideError(f"unknown target {spec!r}; use llvm, llvm:CPU, cuda, cuda:sm_XX, a TVM tag such as "
                    "nvidia/nvidia-h100, or a target JSON dict")


def host_cpu() -> str:
    """LLVM's name for this machine's CPU ("generic" where LLVM does not know it)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu()) or "generic"


def llvm_target(cpu: str):
    """The llvm target compiling for `cpu` (an LLVM CPU name), checked: TVM would fall back to generic x86-64
    for an unknown one with only a log line."""
    import tvm
    from tvm.target import codegen

    triple = str(codegen.llvm_get_system_triple())
    if cpu != "generic" and not codegen.llvm_is_valid_cpu(cpu, triple):
        raise WideError(f"unknown CPU {cpu!r} for target llvm:{cpu} (LLVM's CPU names for {triple}, e.g. "
                        f"{host_cpu()} for this machine, x86-64-v3, znver3, or generic)")
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu})


def target_folder(target) -> str:
    """Folder name under tuning_logs/ for a target: `llvm`, `cuda-sm90`, ..."""
    if target.kind.name == "cuda":
        arch = str(target.attrs.get("arch", "sm_90")).replace("_", "").rstrip("a")
        return f"cuda-{arch}"
    return target.kind.name


def launches_dependents(target) -> bool:
    """Whether `target`'s GPUs launch kernels as programmatic dependents (sm_90 on; schedules/dependent_launch.py)."""
    match = re.fullmatch(r"sm_(\d+)a?", str(target.attrs.get("arch", ""))) if target.kind.name == "cuda" else None
    return match is not None and int(match.group(1)) >= 90


def has_wgmma(target) -> bool:
    """Whether `target`'s device code gets Hopper's wgmma instructions (sm_90, compiled for sm_90a)."""
    return target.kind.name == "cuda" and str(target.attrs.get("arch", "")) in ("sm_90", "sm_90a")


_registered = False


def hopper_device_code() -> None:
    """Compile device code of sm_90 targets for sm_90a (TVM compiles for the target's arch as written), through
    TVM's own nvcc/nvrtc driver; other targets are compiled as TVM would. Installed by what builds CUDA code
    (cuda_aot.cuda_codegen: wide_tvm.compile, wide-bench build; the tuner's builder), never on import."""
    global _registered
    if _registered:
        return
    import tvm_ffi
    from tvm.support import nvcc
    from tvm.target import Target

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code):
        target = Target.current(allow_none=True)
        if target is None or str(target.attrs.get("arch", "")) != "sm_90":
            return nvcc.tvm_callback_cuda_compile(code)
        if os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower() == "nvcc":
            return nvcc.compile_cuda(code, target_format="fatbin", compiler="nvcc",
                                     arch=["-gencode", "arch=compute_90a,code=sm_90a"])
        return nvcc.compile_cuda(code, target_format="cubin", compiler="nvrtc", arch="sm_90a")

    _registered = True
