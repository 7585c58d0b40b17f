"""Ahead-of-time CUDA builds on machines with `nvcc` but no GPU driver.

TVM's CUDA runtime library links against the driver (`libcuda.so.1`). Without it TVM silently stores
CUDA *source* in the library, which then needs a compiler on the GPU host. We load a stand-in
`libcuda.so.1` (the nine driver entry points TVM links, each answering CUDA_ERROR_NO_DEVICE) before
TVM is imported, and compile device code with `nvcc` so that the library embeds a real fatbin.
This module must not import tvm.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from pathlib import Path

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
