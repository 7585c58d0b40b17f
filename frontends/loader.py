"""Pick the importer by file type; one result type for both."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import tvm

from ..errors import WideError
from .onnx_import import import_onnx
from .torch_import import import_exported_program, load_exported_program


@dataclass
class ImportedModel:
    """A Relax module whose `main` takes `num_inputs` model inputs followed by the weights."""

    mod: tvm.IRModule
    weights: list[np.ndarray]
    weight_names: list[str]
    input_names: list[str]
    source: str


def import_model(model, origin: str | None = None) -> ImportedModel:
    """Import a .onnx / .pt2 path or an in-memory torch.export.ExportedProgram."""
    if not isinstance(model, (str, os.PathLike)):
        mod, values, names = import_exported_program(model, origin or "<ExportedProgram>")
        src = origin or "<ExportedProgram>"
    else:
        path = os.fspath(model)
        if not os.path.exists(path):
            raise WideError(f"{path}: no such model file")
        if path.endswith(".onnx"):
            mod, values, names = import_onnx(path)
        elif path.endswith((".pt2", ".pt", ".ep")):
            mod, values, names = import_exported_program(load_exported_program(path), path)
        else:
            raise WideError(f"{path}: unknown model format; expected a .onnx or .pt2 (torch.export) file")
        src = path
    main = mod["main"]
    num_input = len(main.params) - len(names)
    inputs = [p.name for p in main.params[:num_input]]
    return ImportedModel(mod, values, names, inputs, src)
