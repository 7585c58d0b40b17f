"""Where the BLAS libraries come from: their wheels' folders at build time (headers, linking) and at run time
(loaded before the compiled library, which names them as dependencies without a path).

Pure Python (no TVM): the runtime imports it on the GPU host.

Run-time search order for each library, first hit wins:
1. the environment variable named in `BlasLibrary.env` (a full path to the `.so`);
2. the installed wheel (`nvidia-cublas`: `site-packages/nvidia/cu13/lib/libcublasLt.so.13`, the same file a CUDA 13
   torch loads; `scipy-openblas32`: `site-packages/scipy_openblas32/lib/libscipy_openblas.so`);
3. the system's loader path (`LD_LIBRARY_PATH`, `ldconfig`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import WideError


@dataclass(frozen=True)
class BlasLibrary:
    """One vendor BLAS shared library: `name` as compiled libraries record it, its file name (the SONAME the
    library's DT_NEEDED names), the wheel that ships it and the folders inside the wheel's package."""

    name: str
    soname: str
    wheel: str
    package: str  # top-level import package of the wheel
    lib_dirs: tuple[str, ...]  # relative to the package's folder
    include_dirs: tuple[str, ...]
    env: str

    def _package_dirs(self) -> list[Path]:
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            return []
        if spec is None:
            return []
        return [Path(p) for p in (spec.submodule_search_locations or [])]

    def find(self) -> Path | None:
        """The library file from the environment variable or the installed wheel; None where neither has it."""
        explicit = os.environ.get(self.env)
        if explicit:
            return Path(explicit) if Path(explicit).is_file() else None
        for root in self._package_dirs():
            for sub in self.lib_dirs:
                path = root / sub / self.soname
                if path.is_file():
                    return path
        return None

    def include_dir(self) -> Path | None:
        for root in self._package_dirs():
            for sub in self.include_dirs:
                if (root / sub).is_dir():
                    return root / sub
        return None

    def missing(self) -> str:
        return (f"{self.soname} not found: install the `{self.wheel}` wheel (pip install '{self.wheel}'), "
                f"or set {self.env} to the library's path")


CUBLASLT = BlasLibrary("cublasLt", "libcublasLt.so.13", "nvidia-cublas>=13,<14", "nvidia",
                       ("cu13/lib", "cublas/lib"), ("cu13/include", "cublas/include"), "WIDE_TVM_CUBLASLT")
OPENBLAS = BlasLibrary("openblas", "libscipy_openblas.so", "scipy-openblas32", "scipy_openblas32",
                       ("lib",), ("include",), "WIDE_TVM_OPENBLAS")
LIBRARIES = {lib.name: lib for lib in (CUBLASLT, OPENBLAS)}
_loaded: dict[str, ctypes.CDLL] = {}


def load(names) -> None:
    """Load the named BLAS libraries into the process (RTLD_GLOBAL), so that a compiled library needing them opens.
    A WideError naming the library and its wheel where one cannot be found or opened."""
    for name in names:
        if name in _loaded:
            continue
        lib = LIBRARIES.get(name)
        if lib is None:
            raise WideError(f"the library needs an unknown BLAS {name!r} (built by a newer wide-tvm?)")
        path = lib.find()
        try:
            _loaded[name] = ctypes.CDLL(str(path) if path else lib.soname, mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise WideError(f"{lib.missing()} ({err})") from None
