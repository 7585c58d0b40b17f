"""What MetaSchedule's builder and runner call for a knob task (tuning/space.py).

The builder instantiates the real kernel from a scheduled template's knob annotations and compiles it; the runner
allocates valid inputs (a 50 % random mask and its reorder, not random integers), times the candidate (on a GPU
with an L2 flush before every call, as wide-bench does; with the mask reorder a model runs in front of it), then
checks its output rows against NumPy, so a knob
combination that computes garbage is recorded as a failed run and can never be the database's pick.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import tirx

from ..weight_layout import pack
from .space import instantiate, knob_values, tag_task, task_of, task_reorder

CHECK_TOKENS = 8  # output rows (tokens) the runner checks against NumPy after timing a candidate
CHECK_TOLERANCE = 2e-2  # max |out - ref| / max |ref| a candidate may reach (fp16 kernels: ~3e-4)
REORDER = "reorder"  # a candidate module's mask reorder, when a model runs one in front of the kernel
# Each many-token bucket (timed at TILE_TOKENS: <= 128, <= 512 tokens, and more at 4096) is also timed at smaller
# counts in it, a candidate's time being the mean over the counts of each count's median
# (tuning/database.py: record_seconds): a bucket's pick serves every count in it. gate/up g32's
# pick timed at 128 tokens alone ran 88 us at 33-65 tokens where the runner-up ran 72-74; past 512 tokens the
# candidates differ in how they fill the last wave (split tail, stream-K), which one draw at one count decides by
# its luck (Q at 4096: 264 tiles, two full waves), so that bucket is timed at four (docs/performance.md)
ALSO_TIMED = {128: (64,), 512: (256,), 4096: (2048, 1536, 1024)}


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params=None) -> tvm.runtime.Module:
    """MetaSchedule builder function: the kernel a scheduled template selects ("main"), and the mask reorder a
    model runs in front of it ("reorder", space.task_reorder; timed with it), compiled for `target`."""
    from ..targets import hopper_device_code

    hopper_device_code()  # (a builder worker process: sm_90 device code compiled for sm_90a, as wide-compile does)
    task = task_of(mod)
    values = knob_values(mod)
    funcs = {"main": with_tag(instantiate(task, values), mod["main"]).with_attr("global_symbol", "main")}
    reorder = task_reorder(task, values)
    if reorder is not None:
        funcs[REORDER] = reorder.with_attr("global_symbol", REORDER)
    with target:
        return tvm.compile(tvm.IRModule(funcs), target).mod


def with_tag(func: tirx.PrimFunc, template_func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The kernel with the template's trailing `task` tag parameter added (unused)."""
    return tirx.PrimFunc([*func.params, template_func.params[-1]], func.body, func.ret_type, func.attrs)


_ARGS_CACHE: dict = {}  # runner worker: the last few argument sets, reused by the candidates of a task


def alloc_args(device, args_info, alloc_repeat: int) -> list:
    """MetaSchedule runner allocator: random activations and weights, and a 50 % random mask with its reorder
    (counts, order, used) instead of random integers, which would index out of bounds. Seeded, and cached per
    signature, so every candidate of a task is timed on the same inputs. Tasks at a count of ALSO_TIMED get
    argument sets at its smaller counts too (the kernels take any token count). Each argument set's expected output
    rows (CHECK_TOKENS tokens, NumPy) are kept for run_evaluator's check."""
    from ..kernel_reference import make_mask, ref_mask_reorder

    key = (str(device), repr(args_info), alloc_repeat)
    if key in _ARGS_CACHE:
        return _ARGS_CACHE[key]
    shapes = [tuple(info[2]) for info in args_info]
    dtypes = [info[1] for info in args_info]
    kind, layout = tag_task(shapes[-1][0])
    tokens, groups = shapes[-6]  # x, weights..., mask [tokens, G], counts, order, used, out, task
    (n, k), dtype = ((shapes[-2][1], shapes[0][1]), dtypes[0])
    rng = np.random.default_rng(0)
    repeated = []
    counts = (tokens, *ALSO_TIMED.get(tokens, ()))
    for m in [m for m in counts for _ in range(alloc_repeat)]:
        mask = make_mask("random", m, groups, rng, 0.5)
        x = (rng.random((m, k), dtype=np.float32) - 0.5).astype(dtype)
        weights = [((rng.random((n, k), dtype=np.float32) - 0.5) / 8).astype(dtype) for _ in shapes[1:-6]]
        host = [x, *(pack(w, layout) for w in weights), mask, *ref_mask_reorder(mask),
                np.zeros((m, shapes[-2][1]), dtype), np.zeros(shapes[-1], np.int8)]
        args = [tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in host]
        rows = np.unique(np.concatenate([[0, m - 1], rng.integers(0, m, CHECK_TOKENS - 2)]))
        _EXPECTED[id(args[-2])] = (rows, _expected(kind, x[rows], weights, mask[rows], n, groups))
        repeated.append(args)
    while len(_ARGS_CACHE) >= 4:
        for args in _ARGS_CACHE.pop(next(iter(_ARGS_CACHE))):
            _EXPECTED.pop(id(args[-2]), None)
    _ARGS_CACHE[key] = repeated
    return repeated


_EXPECTED: dict = {}  # id(out tensor of an argument set) -> (checked token rows, their expected output)


def _expected(kind: str, x, weights, mask, n: int, groups: int) -> np.ndarray:
    """NumPy reference of a few tokens' outputs (weights as [N, K])."""
    from ..kernel_reference import ref_gemm_k, ref_gemm_mn

    if kind == "gemm_k":
        return ref_gemm_k(x, weights[0], mask, x.shape[1] // groups, "nk")
    return ref_gemm_mn(x, weights[0], weights[1], mask, n // groups, "nk", kind == "gemm_mn_swiglu")


def check_output(args) -> None:
    """Raise when a candidate's output rows differ from the reference (the runner then records it as failed,
    so a knob combination that computes garbage can never be the database's pick)."""
    from ..kernel_reference import rel_err

    rows, ref = _EXPECTED[id(args[-2])]
    err = rel_err(args[-2].numpy()[rows], ref)
    if not err < CHECK_TOLERANCE:
        raise RuntimeError(f"wrong output: relative error {err:.2e} against NumPy (tolerance {CHECK_TOLERANCE})")


def run_evaluator(rt_mod, device, evaluator_config, repeated_args) -> list[float]:
    """MetaSchedule runner evaluator. On a GPU each timed call follows an L2 flush (a read of 4x the L2, as
    wide-bench times them), so weights come from DRAM as in a model, not from an L2 that holds them after the
    previous call (Q/O's 32 MB fit the H200's L2 and ranked candidates differently unflushed); seconds per call,
    repeat x number calls, each with the candidate's mask reorder where a model runs one (_timed_call). On the CPU,
    MetaSchedule's own evaluator (caches flushed by the config). Then every
    argument set's output is checked against NumPy (check_output)."""
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    if device.dlpack_device_type() != 2:  # not kDLCUDA
        costs = run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)
    else:
        costs = _cuda_events(_timed_call(rt_mod), evaluator_config, repeated_args)
    for args in repeated_args:
        check_output(args)
    return costs


def _timed_call(rt_mod):
    """What one timed call runs: the candidate's mask reorder (on the argument set's mask, counts, order and
    used: args[-6:-2]) where its module has one, then the kernel."""
    kernel = rt_mod["main"]
    if not rt_mod.implements_function(REORDER):
        return kernel
    reorder = rt_mod[REORDER]

    def call(*args):
        reorder(*args[-6:-2])
        kernel(*args)

    return call


def _cuda_events(fn, evaluator_config, repeated_args) -> list[float]:
    """Seconds per call, each timed with CUDA events after an L2 flush."""
    import torch

    from ..bench.measure import l2_flush_buffer

    flush = l2_flush_buffer()
    costs = []
    for args in repeated_args:
        for _ in range(3):  # warm-up
            fn(*args)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(evaluator_config.repeat * evaluator_config.number)]
        for start, end in events:
            flush.sum()
            start.record()
            fn(*args)
            end.record()
        torch.cuda.synchronize()
        costs += [start.elapsed_time(end) * 1e-3 for start, end in events]
    return costs
