"""Import exported WIDE models (ONNX, torch.export .pt2) into Relax with weights kept as parameters.

Imported lazily: the runtime side of wide_tvm (which needs no TVM compiler) never loads this package.
"""

from __future__ import annotations


def __getattr__(name):
    if name in ("ImportedModel", "import_model"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(name)


__all__ = ["ImportedModel", "import_model"]
