"""torch.export (.pt2 or an ExportedProgram) -> Relax, weights kept as parameters."""

from __future__ import annotations

import numpy as np
import tvm

from ..errors import WideError


def load_exported_program(path: str):
    import torch

    try:
        return torch.export.load(path)
    except FileNotFoundError:
        raise WideError(f"{path}: no such model file") from None
    except Exception as err:
        raise WideError(f"{path}: not a readable torch.export program ({type(err).__name__}: {err})") from None


def import_exported_program(ep, origin: str = "<ExportedProgram>") -> tuple[tvm.IRModule, list, list[str]]:
    """(module whose main takes inputs then weights, weight arrays, weight names)."""
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    try:
        mod = from_exported_program(ep, keep_params_as_input=True)
    except Exception as err:
        msg = str(err).strip().splitlines()
        detail = msg[-1] if msg else type(err).__name__
        if "Unsupported function type" in str(err) or "not supported" in str(err).lower():
            raise WideError(f"{origin}: unsupported operator in the exported graph: {detail}") from None
        raise WideError(f"{origin}: TVM's torch.export importer failed: {detail}") from None
    mod, params = detach_params(mod)
    main = mod["main"]
    num_input = int(main.attrs["num_input"])
    names = [p.name for p in main.params[num_input:]]
    values = [np.asarray(t.numpy()) for t in params.get("main", [])]
    return mod, values, names
