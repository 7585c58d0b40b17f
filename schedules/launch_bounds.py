"""One block per SM for the wgmma kernels: `__launch_bounds__(threads, 1)`, so ptxas may give every thread all the
registers it needs, whatever order the kernel's parameters come in.

TVM passes the values a kernel's host code computes (CSE's `cse_v*`) as kernel parameters sorted by name, and the
numbers in those names count over the whole host function, so a kernel's parameter order changes with the other
kernels of its dispatch. With `__launch_bounds__(threads)` alone, ptxas's register budget for the wgmma kernels
follows that order: the down projection for groups of 32 at <= 128 tokens (`wg64n128s4k4`) compiled to 255
registers in one build and 202 registers (1664 bytes more code, 18-40 % slower at 33-128 tokens on the H200) in a
build whose larger buckets had other knobs, with an identical kernel body. A minimum of one block per SM makes
ptxas allocate as for one resident block: the same kernel then compiles to 255 registers in both orders
(docs/performance.md, "Latest run (2026-12-03, second session)").

Like programmatic dependent launch (dependent_launch.py) this is how the library is built, not a knob: the tuning
runner builds its candidates without it.
"""

from __future__ import annotations

from tvm import tirx

from .dependent_launch import dependent_launch, map_kernels, wrap_kernel_body

MIN_BLOCKS = "tirx.launch_bounds_min_blocks_per_sm"  # (TVM: an AttrStmt in a kernel becomes its launch bound)


def _uses_wgmma(kernel: tirx.For) -> bool:
    """Whether the kernel issues warpgroup MMAs (the printed kernel names the wgmma intrinsics)."""
    return "wgmma" in kernel.script()


def _bounded_if_wgmma(kernel: tirx.For, blocks: int) -> tirx.For:
    """The kernel with a `blocks`-per-SM bound inside its thread bindings if it issues wgmma, else as it is."""
    if not _uses_wgmma(kernel):
        return kernel
    return wrap_kernel_body(kernel, lambda body: tirx.AttrStmt(tirx.const(0, "int32"), MIN_BLOCKS,
                                                                tirx.const(blocks, "int32"), body))


def one_block_per_sm(func: tirx.PrimFunc, blocks: int = 1) -> tirx.PrimFunc:
    """`func` with every kernel that issues wgmma launch-bounded to one resident block per SM (every other kernel
    as it was); `blocks`: that many instead (an experiment's bound: docs/decisions.md, `mma_skip`)."""
    return func.with_body(map_kernels(func.body, lambda kernel: _bounded_if_wgmma(kernel, blocks)))


def as_built(func: tirx.PrimFunc, dependent: bool, blocks: int = 1) -> tirx.PrimFunc:
    """`func` as the library builds it: one block per SM (`blocks`) for its wgmma kernels and, where `dependent`
    (sm_90 on: targets.launches_dependents), every kernel a programmatic dependent launch (dependent_launch.py)."""
    return one_block_per_sm(dependent_launch(func) if dependent else func, blocks)
