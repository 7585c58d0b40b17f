"""Pick the importer by file type; one result type for both."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

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

    def input_specs(self) -> list[dict]:
        """Per model input: name, dtype, shape (None for a symbolic dimension) and `index_bound`: the length of the
        table it indexes (a take of a weight: the vocabulary for token ids), None where it indexes none. The runtime
        checks calls against them (runtime.py)."""
        main = self.mod["main"]
        var2val = relax.analysis.get_var2val(main)
        params = list(main.params[:len(self.input_names)])
        bounds: dict = {}
        for value in var2val.values():
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.take"):
                continue
            table, index = value.args
            shape = table.ty.shape.values if isinstance(table.ty, relax.TensorType) and table.ty.shape else None
            sources = _index_sources(index, var2val)  # (ONNX's Gather wraps negative ids: where(ids < 0, ids + V, ids))
            for p in params:
                if any(x.same_as(p) for x in sources) and shape \
                        and isinstance(shape[int(value.attrs.axis or 0)], tvm.tirx.IntImm):
                    bound = int(shape[int(value.attrs.axis or 0)])
                    bounds[p.name] = min(bound, bounds.get(p.name, bound))
        return [{"name": p.name, "dtype": str(p.ty.dtype),
                 "shape": [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in p.ty.shape.values],
                 "index_bound": bounds.get(p.name)} for p in params]


def _index_sources(index, var2val, depth: int = 4) -> list:
    """The variables an index tensor is computed from through a few elementwise or layout ops."""
    out, frontier = [], [index]
    for _ in range(depth):
        nxt = []
        for expr in frontier:
            out.append(expr)
            value = var2val.get(expr) if isinstance(expr, relax.Var) else expr
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in (
                    "relax.reshape", "relax.astype", "relax.squeeze", "relax.expand_dims", "relax.where", "relax.add",
                    "relax.less", "relax.greater_equal"):
                nxt += [a for a in value.args if isinstance(a, relax.Var)]
        frontier = nxt
    return out + frontier


def import_model(model, origin: str | None = None, weights: bool = True) -> ImportedModel:
    """Import a .onnx / .pt2 path or an in-memory torch.export.ExportedProgram. A file that is not a model the
    importers can read is one WideError naming it, whatever failed inside them (tests/test_fuzz.py). `weights=False`
    (an ExportedProgram): the weights as zero-stride placeholders of their shapes, never copied."""
    try:
        return _import_model(model, origin, weights)
    except WideError:
        raise
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file: one line, never a traceback
        where = os.fspath(model) if isinstance(model, (str, os.PathLike)) else origin or "<ExportedProgram>"
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise WideError(f"{where}: not a model the importers can read ({type(err).__name__}: {detail})") from None


def _import_model(model, origin: str | None, weights: bool = True) -> ImportedModel:
    if not isinstance(model, (str, os.PathLike)):
        mod, values, names = import_exported_program(model, origin or "<ExportedProgram>", weights)
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
