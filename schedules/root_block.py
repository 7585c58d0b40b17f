"""Wrap a hand-scheduled kernel body in a root SBlock.

Relax's RewriteDataflowReshape (and other analyses of call_tir callees) expect every PrimFunc body to
be an SBlockRealize, as TVM's own legalized kernels are; our kernels are written with explicit thread
bindings, so they get an empty root block around them.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize


def with_root_block(func: tirx.PrimFunc) -> tirx.PrimFunc:
    if isinstance(func.body, SBlockRealize):
        return func
    root = SBlock(iter_vars=[], reads=[], writes=[], name_hint="root", body=func.body)
    return func.with_body(SBlockRealize([], True, root))
