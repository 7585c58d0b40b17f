"""Programmatic dependent launch (sm_90 on): each of our kernels may start as the kernel before it drains.

A split kernel is two launches, the GEMM and the sum of its partials, and a model runs the mask reorder before
its gated kernels. Launched normally, a kernel starts only after the one before it has completed and its writes
have been flushed. With CUDA's programmatic stream serialisation on every kernel of a PrimFunc, the next kernel
may be scheduled as soon as all blocks of the one before have exited, so every kernel here first executes

    griddepcontrol.wait   (the kernel before it has completed and its writes are visible)

before it reads anything. The kernels never trigger their dependents early (`launch_dependents`): on the H200
an early trigger at each kernel's start made the split down projection for groups of 32 2-3 us slower at 48-64
tokens (not profiled), where the wait alone took 1-3 us off the split kernels (docs/performance.md).
A kernel launched without the attribute (another library's, TVM's own) is never started early.

The tuning runner times kernels without it (a launch mode of the built library, not a knob): records stay valid.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

LAUNCH_PARAMS = "tirx.kernel_launch_params"  # PrimFunc attribute: flags for every kernel split from it
PDL = "tirx.use_programtic_dependent_launch"  # (TVM's spelling)


@T.prim_func(private=True)
def _prologue():
    T.ptx["griddepcontrol.wait"]()


def _binds_thread(stmt) -> bool:
    return isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.THREAD_BINDING


def _with_body(loop: tirx.For, body) -> tirx.For:
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations,
                    loop.step, loop.span)


def wrap_kernel_body(loop: tirx.For, wrap) -> tirx.For:
    """A kernel's nest of thread bindings with the body inside its innermost directly nested one replaced by
    wrap(body)."""
    if _binds_thread(loop.body):
        return _with_body(loop, wrap_kernel_body(loop.body, wrap))
    return _with_body(loop, wrap(loop.body))


def _kernel_start(loop: tirx.For) -> tirx.For:
    """A kernel with the wait first inside its thread bindings."""
    return wrap_kernel_body(loop, lambda body: tirx.SeqStmt([_prologue.body, body]))


def map_kernels(stmt, kernel_fn):
    """`stmt` (host code) with every kernel, the outermost thread binding of a nest, replaced by kernel_fn(kernel)."""
    if _binds_thread(stmt):
        return kernel_fn(stmt)
    if isinstance(stmt, tirx.For):
        return _with_body(stmt, map_kernels(stmt.body, kernel_fn))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([map_kernels(s, kernel_fn) for s in stmt.seq])
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, map_kernels(stmt.then_case, kernel_fn),
                               None if stmt.else_case is None else map_kernels(stmt.else_case, kernel_fn))
    if isinstance(stmt, tirx.AttrStmt):
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, map_kernels(stmt.body, kernel_fn))
    if isinstance(stmt, tirx.While):
        return tirx.While(stmt.condition, map_kernels(stmt.body, kernel_fn))
    return stmt


def dependent_launch(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` (CUDA, sm_90 on: targets.launches_dependents) with every kernel launched as a programmatic dependent of
    the kernel before it in the stream, and waiting for it before its first read."""
    flags = [str(f) for f in (func.attrs.get(LAUNCH_PARAMS, []) if func.attrs is not None else [])]
    return func.with_body(map_kernels(func.body, _kernel_start)).with_attr(
        LAUNCH_PARAMS, flags if PDL in flags else flags + [PDL])
