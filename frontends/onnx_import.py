"""ONNX -> Relax, with the graph fixes TVM 0.27's importer needs for exported LLMs.

Seen on the ONNX that `torch.onnx.export(dynamo=True)` writes for a GQA model with RoPE:
- `Range(0.0, Cast(float, tokens), 1.0)` (RoPE positions) gets a fresh length variable in TVM's
  converter, so every tensor broadcast against it loses its shape and a later `Expand` fails with
  `'NoneType' object is not iterable`. Our `Range` keeps the symbolic length (`arange(0, tokens)`).
- `Expand` with a constant target shape crashes on symbolic input dims (`'Var' object has no attribute
  'value'`); ours hands the shape to the converter's ShapeExpr path.
- `Unsqueeze` whose axes are a scalar (the exporter writes one for scaled_dot_product_attention) fails with
  `'int' object is not iterable`; ours makes the axes a vector.
- `Tile` with constant repeats becomes an opaque TE kernel, which hides a gate's expansion chain from the
  lowering; ours emits `relax.tile`.
- With `keep_params_in_input`, every initializer becomes a function parameter, scalars and shape
  vectors included, which hides constants from the converters. Scalars and integer tensors are turned
  into Constant nodes first, so only weights become parameters.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _onnx

from ..errors import WideError


def inline_constant_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Move scalar and integer initializers into Constant nodes; floating-point tensors stay weights."""
    keep, constants = [], []
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.size <= 1 or arr.dtype.kind in "iub":
            constants.append(helper.make_node("Constant", [], [init.name], value=init, name=f"const_{init.name}"))
        else:
            keep.append(init)
    nodes = constants + list(model.graph.node)
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def weights_as_rows(model: onnx.ModelProto) -> onnx.ModelProto:
    """Store every 2-D MatMul weight as [N, K] (torch's Linear layout) behind a Transpose node.

    The dynamo exporter pre-transposes Linear weights to [K, N]; transposing the initializer back
    gives ONNX models the layout the torch.export path has, which the decode kernels stream row by row
    and FuseTransposeMatmul turns into NT matmuls, with no transpose at run time.
    """
    inits = {init.name: init for init in model.graph.initializer}
    consumers: dict = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    nodes = []
    for name, init in inits.items():
        uses = consumers.get(name, [])
        if len(init.dims) != 2 or not uses or any(n.op_type != "MatMul" or i != 1 for n, i in uses):
            continue
        rows = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(init).T), name)
        init.CopyFrom(rows)
        kn = f"{name}__kn"
        nodes.append(helper.make_node("Transpose", [name], [kn], perm=[1, 0], name=f"transpose_{name}"))
        for node, i in uses:
            node.input[i] = kn
    if nodes:
        rest = list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes + rest)
    return model


class _Range(_onnx.Range):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        start, limit, delta = (_onnx.get_constant(i, params) for i in inputs)

        def scalar(x):
            return x.value.numpy().item() if isinstance(x, tvm.ir.GenericConst) else None

        s, d = scalar(start), scalar(delta)
        length = limit.value if isinstance(limit, tirx.Cast) else limit
        if (s is not None and d is not None and tvm.ir.is_prim_expr(length) and "int" in str(length.ty)
                and float(s).is_integer() and float(d).is_integer() and d != 0):
            return relax.op.arange(int(s), length, int(d), dtype=str(start.ty.dtype))
        return super()._impl_v12(bb, inputs, attr, params)


class _Expand(_onnx.Expand):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, shape = inputs
        if isinstance(shape, tvm.ir.GenericConst) and data.ty.shape is not None:
            shape = relax.ShapeExpr([int(v) for v in np.asarray(shape.value.numpy()).reshape(-1).tolist()])
        return super()._impl_v13(bb, [data, shape], attr, params)


class _Unsqueeze(_onnx.Unsqueeze):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, axes = inputs[0], _onnx.get_constant(inputs[1], params)
        if isinstance(axes, tvm.ir.GenericConst) and axes.value.numpy().ndim == 0:  # a scalar axis
            axes = relax.const(axes.value.numpy().reshape(1), str(axes.ty.dtype))
        if isinstance(data, relax.Call):  # an expression the converter cannot read a rank off yet
            data = bb.normalize(data)
        return super()._impl_v13(bb, [data, axes], attr, params)


class _Tile(_onnx.Tile):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        reps = _onnx.get_constant(inputs[1], params)
        if isinstance(reps, tvm.ir.GenericConst):  # relax.tile (TVM's converter emits an opaque TE kernel)
            return relax.op.tile(inputs[0], [int(r) for r in np.asarray(reps.value.numpy()).reshape(-1)])
        return super()._impl_v13(bb, inputs, attr, params)


_OVERRIDES = {"Range": _Range, "Expand": _Expand, "Unsqueeze": _Unsqueeze, "Tile": _Tile}


@contextlib.contextmanager
def _converters():
    original = _onnx._get_convert_map
    _onnx._get_convert_map = lambda: {**original(), **_OVERRIDES}
    try:
        yield
    finally:
        _onnx._get_convert_map = original


def _check_supported(model: onnx.ModelProto, path: str) -> None:
    supported = _onnx._get_convert_map()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise WideError(f"{path}: node {node.name!r} uses operator {node.domain}::{node.op_type}, "
                            "which is not supported (only the default ONNX domain is)")
        if node.op_type not in supported and node.op_type not in _OVERRIDES:
            raise WideError(f"{path}: node {node.name!r} uses unsupported ONNX operator {node.op_type!r}")


def load_onnx(path: str) -> onnx.ModelProto:
    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise WideError(f"{path}: no such model file") from None
    except Exception as err:  # protobuf DecodeError and friends
        raise WideError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from None
    if not model.graph.node:
        raise WideError(f"{path}: not a readable ONNX model (empty graph)")
    return model


def import_onnx(path: str) -> tuple[tvm.IRModule, list, list[str]]:
    """(module whose main takes inputs then weights, weight arrays, weight names)."""
    model = weights_as_rows(inline_constant_initializers(load_onnx(path)))
    _check_supported(model, path)
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    try:
        # (TVM's converter prints "Error converting operator ..." to stdout before it raises: the error says it)
        with _converters(), contextlib.redirect_stdout(io.StringIO()):
            mod = _onnx.from_onnx(model, keep_params_in_input=True)
    except WideError:
        raise
    except Exception as err:
        first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise WideError(f"{path}: TVM's ONNX importer failed: {first}") from None
    main = mod["main"]
    num_input = int(main.attrs["num_input"]) if main.attrs and "num_input" in main.attrs else len(model.graph.input)
    names = [p.name for p in main.params[num_input:]]
    values = []
    for name in names:
        key = name if name in weights else next((k for k in weights if _sanitize(k) == name), None)
        if key is None:
            raise WideError(f"{path}: weight {name!r} of the imported graph has no initializer")
        values.append(weights[key])
    return mod, values, names


def _sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
