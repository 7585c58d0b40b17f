"""torch.export (.pt2 or an ExportedProgram) -> Relax, weights kept as parameters."""

from __future__ import annotations

import numpy as np
import tvm

from ..errors import WideError


def load_exported_program(path: str):
    """The ExportedProgram of a .pt2, read without running code from it (pt2_archive.safe_archive) and without
    torch's own log lines (its error becomes one WideError)."""
    import logging

    import torch

    from .pt2_archive import safe_archive

    archive = safe_archive(path)
    loggers = [logging.getLogger(name) for name in ("torch.export", "torch._export.serde.serialize")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        return torch.export.load(archive)
    except Exception as err:  # noqa: BLE001 - torch's deserialization errors vary; one line names the file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WideError(f"{path}: not a readable torch.export program ({type(err).__name__}: {first})") from None
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _matmul(node, importer):
    """aten.matmul / mm / bmm in the inputs' dtype (TVM 0.27's importer makes every product fp32, which an fp16 /
    bf16 model's next op, e.g. a bias add, then refuses: "Binary operators must have the same datatype")."""
    from tvm import relax

    a, b = importer.retrieve_args(node)[:2]
    return importer.block_builder.emit(relax.op.matmul(a, b))


def _linear(node, importer):
    """aten.linear in the input's dtype (see _matmul)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    return importer.block_builder.emit(relax.op.linear(args[0], args[1], args[2] if len(args) > 2 else None))


def _addmm(node, importer):
    """aten.addmm (beta * bias + alpha * m1 @ m2) in the inputs' dtype (see _matmul)."""
    from tvm import relax

    bias, m1, m2 = (importer.env[a] for a in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    dtype = m1.ty.dtype
    res = None
    if alpha != 0:
        res = importer.block_builder.emit(relax.op.matmul(m1, m2))
        if alpha != 1:
            res = importer.block_builder.emit(relax.op.multiply(res, relax.const(alpha, dtype)))
    if beta != 0:
        if beta != 1:
            bias = importer.block_builder.emit(relax.op.multiply(bias, relax.const(beta, dtype)))
        res = bias if res is None else importer.block_builder.emit(relax.op.add(bias, res))
    return res


# products in the model's own dtype, as the ONNX importer makes them (the gated kernels accumulate in fp32 anyway)
SAME_DTYPE_PRODUCTS = {"matmul.default": _matmul, "mm.default": _matmul, "bmm.default": _matmul,
                       "linear.default": _linear, "addmm.default": _addmm}


def import_exported_program(ep, origin: str = "<ExportedProgram>",
                            weights: bool = True) -> tuple[tvm.IRModule, list, list[str]]:
    """(module whose main takes inputs then weights, weight arrays, weight names). `weights=False`: each weight a
    zero-stride placeholder of its shape and dtype (no memory; for a library whose weights are made elsewhere)."""
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    try:
        mod = from_exported_program(ep, keep_params_as_input=True, custom_convert_map=SAME_DTYPE_PRODUCTS)
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
    if weights:
        values = [np.asarray(t.numpy()) for t in params.get("main", [])]
    else:
        values = [np.broadcast_to(np.zeros((), str(t.dtype)), tuple(t.shape)) for t in params.get("main", [])]
    return mod, values, names
