"""Ahead-of-time CUDA builds on machines with `nvcc` but no GPU driver.

TVM's CUDA runtime library links against the driver (`libcuda.so.1`). Without it TVM silently stores
CUDA *source* in the library, which then needs a compiler on the GPU host. `cuda_codegen()` loads a stand-in
`libcuda.so.1` (the nine driver entry points TVM links, each answering CUDA_ERROR_NO_DEVICE) before
TVM is imported, and has device code compiled with `nvcc`, so that the library embeds a real fatbin. Nothing
happens on import: `wide_tvm.compile`, `wide-bench build` and the tuner call it before they build for CUDA.
This module imports tvm only inside `cuda_codegen`, after the stand-in is loaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from pathlib import Path

from .errors import WideError

_STUB_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString",
                 "cuLaunchKernelEx", "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload",
                 "cuTensorMapEncodeTiled")
_NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE


def _stub_source() -> str:
    body = [f"int {name}(void) {{ return {_NO_DEVICE}; }}" for name in _STUB_SYMBOLS]
    return "/* stand-in libcuda.so.1 for ahead-of-time builds; every call reports no device */\n" + "\n".join(body) + "\n"


def real_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if os.path.exists(cand):
            return cand
    return None


def _build_stub() -> Path:
    cache = Path(os.environ.get("WIDE_TVM_CACHE", Path.home() / ".cache" / "wide-tvm")) / "cuda-stub"
    lib = cache / "libcuda.so.1"
    if lib.exists():
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / "libcuda_stub.c"
    src.write_text(_stub_source())
    tmp = cache / f"libcuda.so.1.{os.getpid()}"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("building the CUDA driver stand-in needs a C compiler (cc/gcc) on PATH")
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)], check=True,
                   capture_output=True)
    os.replace(tmp, lib)
    return lib


_prepared = False


def prepare_cuda_aot() -> bool:
    """Make TVM's CUDA codegen loadable without a GPU driver; call before the first `import tvm`.

    Returns True when the stand-in driver was loaded (no real driver on this machine).
    """
    global _prepared
    if _prepared or real_driver_present():
        _prepared = True
        return False
    if "tvm" in __import__("sys").modules:
        # Too late for this process: TVM already tried (and failed) to load its CUDA runtime.
        return False
    ctypes.CDLL(str(_build_stub()), mode=ctypes.RTLD_GLOBAL)
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    _prepared = True
    return True


def cuda_codegen() -> None:
    """Make this process able to build CUDA libraries with embedded device code: the stand-in driver where there
    is no real one (prepare_cuda_aot), then sm_90 device code compiled for sm_90a (targets.hopper_device_code).
    Raises WideError where TVM was imported before the stand-in could be loaded (its CUDA codegen would then
    silently store source instead of device code)."""
    prepare_cuda_aot()
    import tvm

    from .targets import hopper_device_code

    if not tvm.runtime.enabled("cuda"):
        raise WideError("CUDA device code cannot be built in this process: TVM was imported before wide_tvm could "
                        "load its stand-in CUDA driver; call wide_tvm.cuda_aot.cuda_codegen() (or wide_tvm.compile) "
                        "before the first `import tvm`")
    hopper_device_code()
