"""Import exported WIDE models (ONNX, torch.export .pt2) into Relax with weights kept as parameters.

Imported lazily: the runtime side of wide_tvm (which needs no TVM compiler) never loads this package.
"""

from __future__ import annotations


MODEL_SUFFIXES = (".onnx", ".pt2", ".pt", ".ep")


def check_model_file(path) -> None:
    """WideError unless `path` is a readable file of a known model format (cheap: before TVM or torch load, so a
    wrong path fails at once)."""
    import os

    from ..errors import WideError

    path = os.fspath(path)
    if not os.path.exists(path):
        raise WideError(f"{path}: no such model file")
    if os.path.isdir(path):
        raise WideError(f"{path}: a folder, not a model file")
    if not path.endswith(MODEL_SUFFIXES):
        raise WideError(f"{path}: unknown model format; expected a .onnx or .pt2 (torch.export) file")
    if not os.access(path, os.R_OK):
        raise WideError(f"{path}: cannot read the model file (permission denied)")
    import zipfile

    if not path.endswith(".onnx") and not zipfile.is_zipfile(path):
        raise WideError(f"{path}: not a readable torch.export program (not a zip archive)")


def __getattr__(name):
    if name in ("ImportedModel", "import_model"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(name)


__all__ = ["ImportedModel", "import_model"]
