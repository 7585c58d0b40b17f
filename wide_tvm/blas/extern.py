"""Build the BLAS externs (`cublaslt_matmul.cc`, `cblas_matmul.cc`) into objects that a compiled library links.

`extern_for(kind)` compiles the target's extern once (cached under `$WIDE_TVM_CACHE/extern`, default
`~/.cache/wide-tvm/extern`, keyed by the source, the flags and the compiler) and returns a `BlasExtern`: the object as
a TVM static-library module (attached to the IRModule as `external_mods`, so `tvm.compile` links it into the
library) and the options that link the vendor library when the library is exported. nvcc builds the CUDA extern
on a machine without a GPU: it is host code only and needs the CUDA headers and the wheel's cuBLASLt headers.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import WideError
from .libraries import CUBLASLT, OPENBLAS, BlasLibrary

_SOURCES = {"cuda": ("cublaslt_matmul.cc", "wide_cublaslt_matmul", CUBLASLT),
            "llvm": ("cblas_matmul.cc", "wide_cblas_matmul", OPENBLAS)}


@dataclass(frozen=True)
class BlasExtern:
    """A built extern: its function name, its object file, and the vendor library it links."""

    function: str
    object_path: Path
    library: BlasLibrary
    library_path: Path

    def module(self):
        """The object as a static-library module for the IRModule's `external_mods`."""
        import tvm

        return tvm.runtime.load_static_library(str(self.object_path), [self.function])

    def link_options(self) -> list[str]:
        """Options for `export_library`: link the vendor library by its SONAME (found at run time by
        libraries.load). TVM puts options before the objects, so `--no-as-needed` keeps the dependency recorded."""
        return [f"-L{self.library_path.parent}", "-Wl,--no-as-needed", f"-l:{self.library.soname}"]


def _cache_dir() -> Path:
    return Path(os.environ.get("WIDE_TVM_CACHE", Path.home() / ".cache" / "wide-tvm")) / "extern"


def _compiler(kind: str) -> list[str]:
    if kind == "cuda":
        from ..cuda_aot import nvcc_path

        nvcc = nvcc_path()
        if nvcc is None:
            raise WideError("the cuBLASLt extern needs nvcc, and none was found on PATH")
        return [nvcc, "-std=c++17", "-O2", "-Xcompiler", "-fPIC", "-c"]
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        raise WideError("the OpenBLAS extern needs a C++ compiler (g++), and none was found on PATH")
    return [cxx, "-std=c++17", "-O2", "-fPIC", "-c"]


def _include_flags(library: BlasLibrary) -> list[str]:
    import tvm
    import tvm_ffi.libinfo

    include = library.include_dir()
    if include is None:
        raise WideError(f"{library.wheel}: headers not found ({library.missing()})")
    dirs = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path(),
            str(Path(tvm.__file__).parent / "include"), str(include)]  # TVM's: its thread pool (c_backend_api.h)
    return [f"-I{d}" for d in dict.fromkeys(dirs)]


@functools.lru_cache(maxsize=None)
def _version(compiler: str) -> str:
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return out.stdout


def extern_for(kind: str) -> BlasExtern:
    """The BLAS extern of target kind `kind` ("cuda" or "llvm"), built where not cached. WideError where the vendor
    library's wheel or the compiler is missing, or the build fails."""
    source_name, function, library = _SOURCES[kind]
    library_path = library.find()
    if library_path is None:
        raise WideError(f"dense matmuls go to {library.name} on {kind}: {library.missing()}; "
                        "or compile with --no-blas (TVM's own kernels)")
    source = Path(__file__).with_name(source_name)
    command = _compiler(kind) + _include_flags(library) + [f"-I{source.parent}"]  # dltensor.h beside the sources
    text = source.read_bytes() + source.with_name("dltensor.h").read_bytes()
    key = hashlib.sha256(text + "\0".join(command).encode() + _version(command[0]).encode())
    obj = _cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.o"
    if not obj.is_file():
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = obj.with_name(f"{obj.name}.{os.getpid()}.tmp.o")
        result = subprocess.run(command + [str(source), "-o", str(tmp)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            lines = [ln for ln in (result.stderr or result.stdout).splitlines() if "error" in ln.lower()]
            raise WideError(f"building the {library.name} extern ({source.name}) failed: "
                            f"{(lines or ['(no message)'])[0].strip()}")
        os.replace(tmp, obj)
    return BlasExtern(function, obj, library, library_path)
