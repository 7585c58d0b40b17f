"""Compile driver: import -> wide pipeline -> TVM executable; `.export(path)` writes the deployable."""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import asdict, dataclass, field

from . import weight_layout
from .artifact import FORMAT, atomic_outputs, check_output, file_sha256, save_weights
from .cpu_threads import use_physical_cores
from .cuda_aot import cuda_codegen, nvcc_path, prepare_cuda_aot
from .errors import WideError
from .fallback import MODES as FALLBACK_MODES, describe, load_crossovers



class NoGatedLayersWarning(UserWarning):
    """The model has no router-gated layers; it was compiled dense."""


class UnloweredGateWarning(UserWarning):
    """A router's gate was not recognised (passes/gate_report.py): its layer runs dense. `strict=True` (wide-compile
    --strict) makes it an error."""


@dataclass
class Compiled:
    """A compiled WIDE model: the TVM executable, its weights and what the passes lowered."""

    executable: object
    model: object  # frontends.loader.ImportedModel
    target: object
    layers: list = field(default_factory=list)
    tuning_log: str | None = None  # the folder(s) applied, " + "-joined
    unlowered: list = field(default_factory=list)  # gate_report.UnloweredGate of each router left dense
    blas: object = None  # blas.extern.BlasExtern the library links, or None
    blas_matmuls: list = field(default_factory=list)  # passes.DispatchedMatmul of each matmul sent to it
    derived: dict = field(default_factory=dict)  # untuned kernel key -> the tuned key whose knobs it took
    fallbacks: dict = field(default_factory=dict)  # kernel symbol -> (token ranges on the dense fallback, source)
    kv_cache: object = None  # passes.kv_cache_attention.CacheShape of a generation build, else None
    generation: dict | None = None  # a generation build's {"max_batch", "vocab", "cuda_graph"}, else None
    # each weight stored in another layout than the model's: name -> (the model's weight, its layout, the stored one)
    weight_origins: dict = field(default_factory=dict)

    @property
    def device_kind(self) -> str:
        return "cuda" if self.target.kind.name == "cuda" else "cpu"

    def meta(self) -> dict:
        return {"format": FORMAT, "target": str(self.target), "device": self.device_kind,
                "input_names": self.model.input_names, "inputs": self.model.input_specs(),
                "weight_names": self.model.weight_names,
                "layers": [layer.to_json() for layer in self.layers],
                "unlowered_gates": [gate.to_json() for gate in self.unlowered], "source": str(self.model.source),
                "blas": [self.blas.library.name] if self.blas else [],
                "blas_matmuls": [m.to_json() for m in self.blas_matmuls], "derived_knobs": self.derived,
                "dense_fallback": {name: {"tokens": [list(r) for r in ranges], "source": source}
                                   for name, (ranges, source) in self.fallbacks.items()},
                "kv_cache": asdict(self.kv_cache) if self.kv_cache else None, "generation": self.generation}

    def export(self, path: str) -> str:
        """Write PATH (TVM library) and its weights file atomically; returns PATH."""
        check_output(path, (self.model.source,))
        with atomic_outputs(path) as (tmp_lib, tmp_weights):
            self.export_library(tmp_lib)
            save_weights(tmp_weights, self.model.weights, self.meta() | {"library_sha256": file_sha256(tmp_lib)})
        return path

    def export_library(self, path: str) -> str:
        """Write the TVM library alone (linked with the BLAS it calls); `export` is the deployable pair. For
        benchmarks that make their weights on the device (bench/model.py)."""
        with self.target:
            self.executable.export_library(path, options=self.blas.link_options() if self.blas else [])
        return path

    def summary(self) -> str:
        ffn = [layer for layer in self.layers if layer.kind == "ffn"]
        attn = [layer for layer in self.layers if layer.kind in ("attention", "projection")]
        lines = [f"target: {self.target.kind.name} ({self.target.attrs.get('arch', 'host')})",
                 f"gated FFN layers lowered: {len(ffn)}", f"gated attention layers lowered: {len(attn)}"]
        for i, layer in enumerate(self.layers):
            lines.append(f"  [{i}] {layer.kind}: {layer.groups} groups x {layer.group_size} channels -> "
                         f"{', '.join(layer.kernels)}; weights {', '.join(layer.weights)}")
        if self.blas:
            lines.append(f"dense matmuls sent to {self.blas.library.name}: {len(self.blas_matmuls)}")
        if self.unlowered:
            lines.append(f"router gates not recognised (their layers run dense): {len(self.unlowered)}")
            lines += [f"  {gate}" for gate in self.unlowered]
        lines.append(f"weights: {len(self.model.weights)} tensors kept as parameters, saved beside the library "
                     f"(*.weights.npz), {sum(w.nbytes for w in self.model.weights) / 2**20:.2f} MiB")
        if self.tuning_log:
            tuned = len(_tuned_entries(self.tuning_log.split(" + ")))
            lines.append(f"tuning log applied: {self.tuning_log} ({tuned} kernel knob entries)")
        for key, source in self.derived.items():
            lines.append(f"  {key}: not tuned; the knobs of the nearest tuned shape, {source}")
        if self.fallbacks:
            lines.append(f"dense fallback (the BLAS instead of the gated kernel) in {len(self.fallbacks)} kernels:")
            lines += [f"  {name}: at {describe(ranges)} tokens ({source})"
                      for name, (ranges, source) in self.fallbacks.items()]
        return "\n".join(lines)


def _tuning_logs(target, tuning_log: str | None) -> list[str]:
    """The tuning folders a compile applies, lowest priority first: `tuning_log` alone where given, else the shipped
    tunings of the target and the user's on top (tuning/folders.py)."""
    from .targets import target_folder
    from .tuning.folders import default_folders

    if tuning_log is not None:
        if not os.path.isdir(tuning_log):
            raise WideError(f"{tuning_log}: tuning log folder not found")
        return [tuning_log]
    return default_folders(target_folder(target))


def _tuned_entries(folders: list[str]) -> dict:
    """The kernel-knob entries of the folders, each on top of the ones before (tuning/folders.py: merge_entries)."""
    from .tuning.database import load
    from .tuning.folders import merge_entries

    entries: dict = {}
    for folder in folders:
        entries = merge_entries(entries, load(folder))
    return entries


def _repacked(w, src: str, layout: str):
    import numpy as np

    if w.ndim and not any(w.strides):  # a placeholder (np.broadcast_to of one value: a benchmark's weight spec)
        n, k = w.shape if src == "nk" else w.shape[::-1]
        return np.broadcast_to(w.reshape(-1)[:1].reshape(()), weight_layout.stored_shape(layout, n, k))
    return np.ascontiguousarray(weight_layout.pack(w if src == "nk" else w.T, layout))


def _repack_weights(imported, plan) -> dict:
    """The stored arrays as the lowered module's parameters take them (passes/lower_gated.py: GatedPlan): repacked
    once, here, and where a dense fallback still reads the stored array, the repacked copy right after it; returns
    what Compiled.weight_origins records."""
    arrays, names, origins = [], [], {}
    for w, name in zip(imported.weights, imported.weight_names):
        arrays.append(_repacked(w, *plan.repacked[name]) if name in plan.repacked else w)
        names.append(name)
        if name in plan.repacked:
            origins[name] = (name, *plan.repacked[name])
        if name in plan.copies:
            copy, layout, have = plan.copies[name]
            arrays.append(_repacked(w, layout, have))
            names.append(copy)
            origins[copy] = (name, layout, have)
    imported.weights, imported.weight_names = arrays, names
    return origins


def prepare_builds() -> None:
    """Before this process first imports TVM: TVM's CPU pool on every physical core, and the stand-in CUDA driver
    where there is no real one (wide_tvm/cuda_aot.py), so the kernels it builds embed device code. compile() calls
    it; so do the command-line tools before they build anything."""
    use_physical_cores()  # before TVM's CPU thread pool starts
    prepare_cuda_aot()  # before the first `import tvm` (a no-op where a real driver exists)


def _check_every_gate(imported, tgt) -> None:
    """WideError naming every router whose gate the lowering would leave dense (compile's `strict`)."""
    from .passes import LowerGatedLayers

    plan = LowerGatedLayers(tgt.kind.name, build=False)
    with tgt:
        plan(imported.mod)
    if plan.plan.unlowered:
        raise WideError(f"{imported.source}: {len(plan.plan.unlowered)} router gate(s) not lowered (strict): "
                        + "; ".join(map(str, plan.plan.unlowered)))


def _blas_extern(tgt):
    """The target's BLAS extern, built (wide_tvm/blas/extern.py); WideError where its wheel is missing."""
    from .blas.extern import extern_for

    return extern_for(tgt.kind.name)


def compile(model, target: str = "llvm", tuning_log: str | None = None,  # noqa: A001
            dense: bool = False, dependent_launch: bool = True, strict: bool = False, blas: bool = True,
            fallback: str = "auto", generation: bool = False, max_batch: int = 64,
            cuda_graph: bool | None = None) -> Compiled:
    """Compile a .onnx / .pt2 path, an ExportedProgram or an ImportedModel for `target` (see `parse_target`).

    `dense=True` skips the gated-layer lowering: the same pipeline, TVM's dense kernels (a baseline).
    `dependent_launch=False` launches the gated kernels plainly on sm_90+ too (schedules/dependent_launch.py).
    A router whose gate is not recognised leaves its layer dense with an UnloweredGateWarning naming the router and
    the node where recognition stopped; `strict=True` raises a WideError instead.
    `blas=True` sends every other dense matmul to the vendor BLAS (cuBLASLt for fp16 / bf16 / fp32 on CUDA, OpenBLAS for fp32
    on the CPU; wide_tvm/blas/), linked into the library; `blas=False` leaves them to TVM's own kernels.
    `fallback` ("auto", "off", "always"; wide_tvm/fallback.py): where the vendor BLAS on the masked operand is faster
    than a gated kernel (measured crossovers in the tuning folders, else a cost model), the kernel runs it instead.
    A fallback reads the weights as the model stores them, so a repacked weight (CUDA's tensor-core tiles) is kept
    twice; "off" keeps one copy. Needs `blas`.
    `generation=True` also builds the entry points a generator needs (wide_tvm/entry_points.py: `prefill` and
    `decode` over a paged KV cache, `create_kv_cache`, the samplers; passes/kv_cache_attention.py); a model whose
    attention does not map onto the cache is a WideError naming the node. `max_batch`: the most sequences one decode
    step takes (its memory is planned for that many); `cuda_graph` (default: on for CUDA) captures each decode batch
    size in a CUDA graph.
    """
    if isinstance(model, (str, os.PathLike)):
        from .frontends import check_model_file

        check_model_file(model)  # before TVM and torch load
    prepare_builds()
    import tvm

    from .frontends.loader import ImportedModel, import_model
    from .passes import DispatchDenseMatmuls, LowerGatedLayers, wide_pipeline
    from .targets import has_wgmma, launches_dependents, parse_target
    from .tuning.database import has_other_records, readable_folder

    tgt = parse_target(target) if isinstance(target, str) else target
    if tgt.kind.name == "cuda" and nvcc_path() is None:
        raise WideError(f"target {target!r} needs nvcc to build CUDA device code, and none was found on PATH")
    if tgt.kind.name not in ("cuda", "llvm"):
        raise WideError(f"target {target!r}: only cuda and llvm targets are supported")
    if fallback not in FALLBACK_MODES:
        raise WideError(f"dense fallback {fallback!r}: expected one of {', '.join(FALLBACK_MODES)}")
    if tgt.kind.name == "cuda":
        cuda_codegen()
    extern = _blas_extern(tgt) if blas else None  # before the import: a missing wheel fails fast
    imported = model if isinstance(model, ImportedModel) else import_model(model)
    dispatch = DispatchDenseMatmuls(tgt.kind.name, extern) if extern else None
    logs = _tuning_logs(tgt, tuning_log)
    lower = LowerGatedLayers(tgt.kind.name, enabled=not dense, knobs=_tuned_entries(logs), wgmma=has_wgmma(tgt),
                             dependent=dependent_launch and launches_dependents(tgt),
                             fallback=fallback if extern else "off", crossovers=load_crossovers(logs))
    adder = None
    if generation:
        from .passes.kv_cache_create import AddGeneration

        if not 1 <= max_batch <= 4096:
            raise WideError(f"max_batch {max_batch}: expected 1 to 4096 sequences")
        cuda_graph = tgt.kind.name == "cuda" if cuda_graph is None else cuda_graph and tgt.kind.name == "cuda"
        adder = AddGeneration(tgt, max_batch, cuda_graph)
    if strict and not dense:  # fail before the build: the lowering's plan alone (no kernel built) names them
        _check_every_gate(imported, tgt)
    # TVM's own schedules, where a database has any (its knob records are applied through `knobs` above)
    ms_log = next((log for log in reversed(logs) if has_other_records(log)), None)
    ms_log = readable_folder(ms_log) if ms_log else None  # (torn lines skipped, with a warning)
    try:
        graphs = adder is not None and adder.cuda_graph  # (TVM's RewriteCUDAGraph acts under this option only)
        with tgt, (tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}) if graphs
                   else contextlib.nullcontext()):
            pipeline = wide_pipeline(tgt, lower, ms_log, dispatch, adder)
            executable = tvm.compile(imported.mod, tgt, relax_pipeline=pipeline)
    except WideError:
        raise
    except Exception as err:  # noqa: BLE001 - surface one line, never a TVM traceback
        if os.environ.get("WIDE_TVM_TRACEBACK"):  # (for developers: TVM's own error, whole)
            raise
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        raise WideError(f"{imported.source}: compiling for {tgt.kind.name} failed: "
                        f"{lines[-1] if lines else type(err).__name__}") from None
    origins = _repack_weights(imported, lower.plan)
    for gate in lower.plan.unlowered:
        warnings.warn(f"{imported.source}: {gate}", UnloweredGateWarning, stacklevel=2)
    if not lower.plan.layers and not dense:
        warnings.warn(f"{imported.source}: no router-gated layers found; compiled dense", NoGatedLayersWarning,
                      stacklevel=2)
    matmuls = dispatch.dispatched if dispatch else []
    return Compiled(executable, imported, tgt, lower.plan.layers, " + ".join(logs) or None, lower.plan.unlowered,
                    extern if matmuls or lower.plan.fallbacks else None, matmuls, lower.plan.derived,
                    lower.plan.fallbacks, adder.cache if adder else None,
                    {"max_batch": adder.max_batch, "vocab": adder.vocab, "cuda_graph": adder.cuda_graph}
                    if adder else None, origins)
