"""A hash of the kernel code behind each knob space, stamped on every MetaSchedule template.

A knob template holds only a kernel's signature and knobs, so a record timed before a kernel change would otherwise
still apply after it. The hash reads the kernel modules' syntax trees as a set of top-level definitions (functions,
classes, constants), so that moving code does not change it: which file a definition sits in, the order of
definitions, import statements (also those inside functions: only the names imported count), docstrings, comments,
formatting and type annotations of parameters and returns do not count; the body of every definition does. Renaming a
definition, or changing any statement of one, changes the hash; tools/restamp_records.py then re-stamps the records
whose kernels stayed the same TIR. Trees are written out by `_canonical` rather than `ast.dump`, whose output
differs between Python versions (3.12 added empty `type_params`): this machine runs 3.11, the GPU host 3.12.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import subprocess

# The kernel modules each space's kernels are built from: a record timed on other code than today's is stale
SPACE_SOURCES = {"cpu": ("gemm_mn", "gemm_k", "cpu_gemm", "tiles", "weights", "dispatch"),
                 "decode": ("gemm_mn", "gemm_k", "gemv", "weights", "dispatch", "warp_ops", "gemv_mn", "gemv_k"),
                 "tile": ("gemm_mn", "gemm_k", "gemv", "gemv_mn", "gemv_k", "tile_gemm", "wgmma_gemm", "mask_reorder",
                          "token_order", "weights", "dispatch", "warp_ops", "wgmma_ring", "wgmma_epilogue",
                          "wgmma_tiles", "wgmma_stream_k", "wgmma_mn", "wgmma_k")}
# ... and the package's own modules every space's kernels read: the knobs and their rules (token buckets, the bounds
# between kernels, the shape checks), which moved there from the kernel modules (wide_tvm/<name>.py)
PACKAGE_SOURCES = ("knobs",)


def source_paths(space: str) -> list[str]:
    """The files a space's code version hashes, in order: its kernel modules, then PACKAGE_SOURCES."""
    from .. import knobs

    here, package = os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(knobs.__file__))
    return ([os.path.join(here, f"{name}.py") for name in SPACE_SOURCES[space]]
            + [os.path.join(package, f"{name}.py") for name in PACKAGE_SOURCES])


# space -> the code version that counts as today's inside `records_of` (an A/B build against the committed records)
_PINNED: dict[str, str] = {}


def code_version(space: str) -> str:
    """16 hex digits of a hash of the kernel modules behind a space (module docstring); inside `records_of(REV)`,
    REV's."""
    return _PINNED.get(space) or _tree_version(space)


@functools.cache
def _tree_version(space: str) -> str:
    sources = []
    for path in source_paths(space):
        with open(path, encoding="utf-8") as f:
            sources.append(f.read())
    return _digest(sources)


def _digest(sources: list[str]) -> str:
    units = []
    for text in sources:
        for stmt in ast.parse(text).body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)) or _is_docstring(stmt):
                continue
            units.append(_canonical(_normalised(stmt)))
    digest = hashlib.sha256()
    for unit in sorted(units):  # a set of definitions: neither their file nor their order counts
        digest.update(unit.encode() + b"\n")
    return digest.hexdigest()[:16]


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _normalised(tree):
    """`tree` without what a move of code changes: docstrings, the annotations of parameters and returns, and the
    module paths of function-local imports (only the names imported stay)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
        if isinstance(node, ast.arg):
            node.annotation = None
        if isinstance(node, ast.ImportFrom):
            node.module, node.level = None, 0
    return tree


def code_version_at(rev: str, space: str) -> str:
    """The code version of a space's kernel modules as of git revision `rev` of the checkout this package is in."""
    from ..errors import WideError

    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args, cwd=None):
        return subprocess.run(["git", "-C", cwd or root, *args], capture_output=True, text=True, check=True).stdout

    try:
        root = git("rev-parse", "--show-toplevel", cwd=here).strip()
        git("rev-parse", "--verify", f"{rev}^{{commit}}")  # (an unknown revision: git says so)
        paths = [os.path.relpath(path, root) for path in source_paths(space)]
        # a module the revision does not have yet was not part of its hash either (its SPACE_SOURCES had no such name)
        present = set(git("ls-tree", "--name-only", rev, "--", *paths).split())
        sources = [git("show", f"{rev}:{path}") for path in paths if path in present]
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise WideError(f"cannot read the kernel modules of revision {rev!r} (a git checkout is needed): "
                        f"{detail.strip()}") from None
    return _digest(sources)


@contextlib.contextmanager
def records_of(rev: str):
    """Within: tuning records stamped by revision `rev`'s kernel code count as today's, so a build of today's
    kernels applies the picks the database made for `rev` (the A/B of a kernel edit before its records are
    re-stamped or re-tuned). For benchmarks only: a record's timing is `rev`'s kernel's, not today's."""
    saved = dict(_PINNED)
    _PINNED.update({space: code_version_at(rev, space) for space in SPACE_SOURCES})
    try:
        yield dict(_PINNED)
    finally:
        _PINNED.clear()
        _PINNED.update(saved)


def _canonical(node) -> str:
    """A syntax tree as text: node types and their non-empty fields (no positions)."""
    if isinstance(node, ast.AST):
        fields = ((f, getattr(node, f, None)) for f in node._fields)
        return f"{type(node).__name__}(" + ",".join(f"{f}={_canonical(v)}" for f, v in fields
                                                     if v is not None and v != []) + ")"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)
