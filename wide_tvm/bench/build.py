"""Compile the benchmark's kernels on this machine (CUDA ahead of time; no GPU needed).

DIR/ours.so: our gated kernels and mask reorders as plain TVM functions;
DIR/tvm_dense.so: TVM's own dense matmul for every shape (wide-compile's pipeline without gating, --no-blas: dlight);
DIR/blas_dense.so: the same shapes as wide-compile builds them by default (the vendor BLAS: passes/blas_dispatch.py),
the dense path a gated layer falls back to;
DIR/bench.json: the workloads.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import replace

import tvm

from ..cuda_aot import cuda_codegen
from ..knobs import (DECODE_BUCKETS, DEFAULT_TILES, GemvKnobs, decode_knobs, direct_bound, reorder_free_bound,
                     tile_knob, tile_knobs)
from ..schedules import gated_kernel, mask_reorder
from ..schedules.code_version import records_of as code_records_of
from ..schedules.dense_fallback import BLAS_HELPER, blas_helper, with_dense_fallback
from ..weight_layout import stored_shape
from ..schedules.launch_bounds import as_built
from ..targets import has_wgmma, launches_dependents, parse_target, target_folder
from ..tuning.database import load as load_knobs
from ..tuning.folders import shipped_root
from ..tuning.nearest import knobs_entry
from .dense import DenseShape, dense_shape_module, export_dense
from .workloads import LLAMA_8B, SWEEPS, Workload, swept_variants, tile_name, variants


def _kernel(w: Workload, target_kind: str, knobs=None, tuned: dict | None = None, tile=None, wgmma: bool = False):
    """Our kernel for `w`: with `knobs` for every decode bucket, else the tuned entry (or the nearest tuned
    shape's), else defaults; with `tile`, those many-token tile knobs instead of the tuned ones (tuned wgmma picks
    only where `wgmma`)."""
    spec = w.spec(target_kind)
    entry = knobs_entry(tuned or {}, spec, wgmma)[0]  # as a compile gives it (its own, or the nearest tuned shape's)
    extra = {}
    if knobs is not None:
        extra = {"decode_knobs": (knobs,) * len(DECODE_BUCKETS)}
    elif "decode" in entry:
        extra = {"decode_knobs": decode_knobs(entry["decode"])}
    if target_kind == "cuda":
        extra["tile_knobs"] = ((tile_knob(tile, spec.kind),) * len(DEFAULT_TILES) if tile
                               else tile_knobs(entry.get("tiles"), wgmma, spec.kind))
    return gated_kernel(spec.kind, spec.groups, spec.group_size, spec.dim, spec.dtype, spec.layout, target_kind,
                        **extra)


def built_bounds(w: Workload, target_kind: str, tuned: dict | None, wgmma: bool) -> tuple[int, int]:
    """(direct-kernel bound, reorder-free bound) of w's benchmark kernel from its tuned tile knobs: gemm_k's
    direct bound depends on them, and a gemm_mn whose leading buckets sort their own tokens reads no reorder up
    to the second (knobs.reorder_free_bound; 0 for gemm_k). Both 0 off tensor cores."""
    spec = w.spec(target_kind)
    if target_kind != "cuda" or spec.layout != "tc":
        return 0, 0
    entry = knobs_entry(tuned or {}, spec, wgmma)[0]
    tiles = tile_knobs(entry.get("tiles"), wgmma, spec.kind)
    return direct_bound(w.kind, tiles, w.group_size), 0 if w.kind == "gemm_k" else reorder_free_bound(tiles)


def with_bounds(workloads: list[Workload], target_kind: str, tuned: dict | None, wgmma: bool) -> list[Workload]:
    """The workloads with their built kernels' direct and reorder-free bounds, which the GPU host reads from
    bench.json (it picks each row's kernel bucket by them, and gemm_mn's mask reorder; gemm_k's never runs)."""
    out = []
    for w in workloads:
        direct, sorts = built_bounds(w, target_kind, tuned, wgmma)
        out.append(replace(w, direct=direct, sorts=sorts))
    return out


def our_kernels(workloads: list[Workload], target_kind: str, sweep: str | None = None, tuned: dict | None = None,
                wgmma: bool = False) -> dict:
    """Our kernels (tuned knobs where `tuned` has them), their mask reorders and, with `sweep` (one of SWEEPS),
    one kernel per knob candidate (wgmma tile candidates where `wgmma`)."""
    funcs = {}
    for w in workloads:
        funcs[w.kernel] = _kernel(w, target_kind, tuned=tuned, wgmma=wgmma).with_attr("global_symbol", w.kernel)
        direct, sorts = built_bounds(w, target_kind, tuned, wgmma)
        if direct and direct != w.direct_tokens or sorts != w.sorts:
            raise ValueError(f"{w.name}: its kernel's direct / reorder-free bounds are {direct} / {sorts} tokens, "
                             f"the workload says {w.direct_tokens} / {w.sorts} (with_bounds sets them)")
        funcs[w.reorder] = mask_reorder(w.groups, target_kind, w.reorder_bound if direct else 0).with_attr(
            "global_symbol", w.reorder)
        spec = w.spec(target_kind)  # the dense fallback at every count: the crossover's other side
        if BLAS_HELPER not in funcs:  # (one a module, of the workloads' one dtype: bench.build.dense_module)
            funcs[BLAS_HELPER] = blas_helper(w.dtype, target_kind).with_attr("global_symbol", BLAS_HELPER)
        funcs |= {name: f.with_attr("global_symbol", name) for name, f in with_dense_fallback(
            w.fallback, w.kernel, spec.kind, spec.groups, spec.group_size, spec.dim, spec.dtype,
            stored_shape(spec.layout, spec.n, spec.k), "nk", target_kind, ((1, None),), w.input_masked,
            w.output_masked).items()}
        if sweep and target_kind == "cuda":
            funcs[w.reorder_always] = mask_reorder(w.groups, target_kind).with_attr("global_symbol", w.reorder_always)
            for v in variants(w) if sweep == "all" else ():
                knobs = GemvKnobs(*v)
                name = f"{w.kernel}_{knobs.name()}"
                funcs[name] = _kernel(w, target_kind, knobs, wgmma=wgmma).with_attr("global_symbol", name)
            for v in swept_variants(w, w.direct_tokens + 1, wgmma, sweep):
                name = f"{w.kernel}_{tile_name(w, v)}"
                funcs[name] = _kernel(w, target_kind, tuned=tuned, tile=v).with_attr("global_symbol", name)
    return funcs


def dense_module(workloads: list[Workload]) -> tvm.IRModule:
    """One Relax function per dense shape: x [m, k] @ permute_dims(w [n, k]), m symbolic (bench/dense.py)."""
    shapes = {w.dense: DenseShape(w.dense, w.n * w.weights, w.k) for w in workloads}
    dtypes = {w.dtype for w in workloads}
    if len(dtypes) != 1:
        raise ValueError(f"the workloads mix dtypes {sorted(dtypes)}; build them one dtype at a time")
    return dense_shape_module(list(shapes.values()), dtypes.pop())


def build(out_dir: str, target: str = "cuda", workloads: list[Workload] | None = None, sweep: str | None = None,
          records_of: str | None = None, derived: bool = True) -> str:
    """Our kernels (ours.so) and TVM's dense ones (tvm_dense.so) for the workloads, with the committed database's
    picks; `records_of` REV: the picks of the records stamped by REV's kernel code (code_version.records_of), for
    the A/B of a kernel edit whose records are not re-stamped yet; bench.json names REV and its code versions."""
    workloads = workloads or LLAMA_8B
    tgt = parse_target(target)
    if tgt.kind.name == "cuda":
        cuda_codegen()  # WideError where this process imported TVM before the stand-in driver could load
    if sweep not in (None, *SWEEPS):
        raise ValueError(f"unknown sweep {sweep!r}; one of {', '.join(SWEEPS)}")
    pinned = code_records_of(records_of) if records_of else contextlib.nullcontext()
    with tgt:
        with pinned as versions:  # (a bad REV fails here, before anything is written)
            tuned = load_knobs(str(shipped_root() / target_folder(tgt)))
        if not derived:  # untuned shapes on the generic defaults (the A/B of tuning/nearest.py)
            tuned = {k: v for k, v in tuned.items() if k in {w.spec(tgt.kind.name).key for w in workloads}}
        os.makedirs(out_dir, exist_ok=True)
        workloads = with_bounds(workloads, tgt.kind.name, tuned, has_wgmma(tgt))
        funcs = our_kernels(workloads, tgt.kind.name, sweep, tuned, has_wgmma(tgt))
        # built as wide-compile builds them (schedules/launch_bounds.py, schedules/dependent_launch.py)
        funcs = {name: as_built(f, launches_dependents(tgt)) for name, f in funcs.items()}
        # the same pipeline wide-compile runs, no gating: TVM's own kernels, and the vendor BLAS
        export_dense(dense_module(workloads), tgt, os.path.join(out_dir, "tvm_dense.so"), blas=False)
        extern, _ = export_dense(dense_module(workloads), tgt, os.path.join(out_dir, "blas_dense.so"), blas=True)
        tvm.compile(tvm.IRModule(funcs), tgt).export_library(  # (with the extern: the fallbacks call the BLAS)
            os.path.join(out_dir, "ours.so"), options=[str(extern.object_path), *extern.link_options()])
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"target": str(tgt), "blas": extern.library.name, "workloads": [w.to_json() for w in workloads],
                   "sweep": sweep, "derived": derived, "wgmma": has_wgmma(tgt),
                   "layouts": {w.name: w.spec(tgt.kind.name).layout for w in workloads}}
                  | ({"records_of": {"rev": records_of, "code_versions": versions}} if records_of else {}), f, indent=1)
    return out_dir
