"""A hash of the kernel code behind each knob space, stamped on every MetaSchedule template.

A knob template holds only a kernel's signature and knobs, so a record timed before a kernel change would otherwise
still apply after it. The hash reads the kernel modules' syntax trees (docstrings and positions dropped, so comments,
formatting and docs do not count), written out by `_canonical` rather than `ast.dump`, whose output differs between
Python versions (3.12 added empty `type_params`): this machine runs 3.11, the GPU host 3.12.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os

# The kernel modules each space's kernels are built from: a record timed on other code than today's is stale
SPACE_SOURCES = {"cpu": ("gemm_mn", "gemm_k", "tiles", "weights", "dispatch"),
                 "decode": ("gemm_mn", "gemm_k", "gemv", "weights", "dispatch"),
                 "tile": ("gemm_mn", "gemm_k", "gemv", "tile_gemm", "wgmma_gemm", "mask_reorder", "weights",
                          "dispatch")}


@functools.cache
def code_version(space: str) -> str:
    """16 hex digits of a hash of the kernel modules behind a space (module docstring)."""
    digest = hashlib.sha256()
    for name in SPACE_SOURCES[space]:
        with open(os.path.join(os.path.dirname(__file__), f"{name}.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        digest.update(_canonical(tree).encode())
    return digest.hexdigest()[:16]


def _canonical(node) -> str:
    """A syntax tree as text: node types and their non-empty fields (no positions)."""
    if isinstance(node, ast.AST):
        fields = ((f, getattr(node, f, None)) for f in node._fields)
        return f"{type(node).__name__}(" + ",".join(f"{f}={_canonical(v)}" for f, v in fields
                                                     if v is not None and v != []) + ")"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)
