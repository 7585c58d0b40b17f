"""The gated kernels' knobs as a MetaSchedule search space.

Our block-sparse kernels are hand-written TensorIR whose structure (token tile, warps, ring depth, wgmma shape,
producer warps) follows from their knobs, so no schedule transformation of one function reaches them. Each
(kernel, token bucket) is instead one MetaSchedule task whose workload is a *knob template*: a PrimFunc with the
kernel's signature at the bucket's token count, whose root block the design space annotates with one
`wide.knob.<name>` per knob, the index of a `sample_categorical` decision. MetaSchedule samples and mutates the
decisions (`CategoricalMutator`), the builder instantiates the real kernel with them (`build_candidate`), the
runner times it on valid masks and checks its output (tuning/runner.py), and the database keeps each trace
with its time, so `database.best_records` turns the fastest record back into knobs (`knob_values`). Templates
carry a hash of their kernels' code (schedules/code_version.py), so records of older kernels are told apart.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, astuple, dataclass

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from ..bench.workloads import TILE_VARIANTS, WGMMA_VARIANTS, Workload, wgmma_fits
from ..kernel_spec import KINDS, kernel_key
from ..knobs import (DECODE_BUCKETS, DEFAULT_DECODE, DEFAULT_TILES, DIRECT_TOKENS, TILE_BUCKETS, GemvKnobs, TileConfig,
                     WgmmaK, WgmmaMN, bucket_tokens, tile_knob, tile_knobs)
from ..schedules.code_version import code_version
from ..schedules.gemv import k_plan, mn_plan
from ..schedules.root_block import with_root_block
from ..schedules.tiles import CPU_BUCKETS
from ..weight_layout import LAYOUTS, stored_shape

CPU_BM = (1, 2, 3, 4, 6, 8)  # tokens of a CPU kernel's register tile
CPU_ROWS = (1, 2, 4)  # gemm_mn over [N, K] weights: weight rows of the register tile (a task: that many columns)
CPU_BN = (16, 32, 64, 128)  # gemm_k over [K, N] weights: output columns of a task (its register tile's width)
CPU_TOKENS = (1, 16, 64)  # token count each CPU bucket (<= 1, <= 16, more) is timed at
TILE_TOKENS = (128, 512, 4096)  # ... each CUDA many-token bucket (<= 128, <= 512, more)
KNOB = "wide.knob."  # root-block annotation prefix: wide.knob.<name> = index of the sampled candidate
# The spaces (CPU tiles; CUDA direct (decode) kernels; CUDA many-token kernels): the token count each bucket is
# timed at, and the field of a kernel-knob entry that holds their knobs, one per bucket
SPACE_TOKENS = {"cpu": CPU_TOKENS, "decode": DECODE_BUCKETS, "tile": TILE_TOKENS}
ENTRY_FIELD = {"cpu": "cpu", "decode": "decode", "tile": "tiles"}
# The direct (decode) kernels' knobs, each sampled on its own (knobs.GemvKnobs; rows: gemm_k only). Many
# combinations build the same kernel once fitted to registers and shared memory (gemv.mn_plan / k_plan): such
# points count as one (knob_key).
DECODE_CHOICES = {"warps": (4, 8, 16, 32), "unroll": (1, 2, 4), "rows": (1, 2), "stages": (0, 2, 3, 4),
                  "row_warps": (1, 2, 4), "ksplit": (1, 2, 4)}


@dataclass(frozen=True)
class KnobTask:
    """One tuning task: the knobs of one gated kernel for one token bucket of one space."""

    kind: str  # gemm_mn_swiglu | gemm_mn | gemm_k
    groups: int
    group_size: int
    dim: int  # K of gemm_mn, N of gemm_k
    dtype: str
    layout: str  # the weight layout wide-compile stores (nk, kn, tc)
    space: str  # a key of SPACE_TOKENS
    bucket: int  # index into the space's buckets
    wgmma: bool = False  # the target has sm_90a wgmma (tile candidates)

    @property
    def key(self) -> str:
        return kernel_key(self.kind, self.groups, self.group_size, self.dim, self.dtype)

    @property
    def name(self) -> str:
        return f"{self.key}/{self.space}{self.bucket}"

    @property
    def tokens(self) -> int:
        """The token count this task's candidates are timed at (the bucket's upper bound)."""
        return SPACE_TOKENS[self.space][self.bucket]

    @property
    def workload(self) -> Workload:
        return Workload("task", "gemm_k" if self.kind == "gemm_k" else "gemm_mn", self.groups, self.group_size,
                        self.dim, self.kind == "gemm_mn_swiglu", self.dtype)

    @property
    def cpu_width(self) -> int:
        """What a CPU tile's bn must divide: the group size (gemm_mn columns) or N (gemm_k's [K, N] rows)."""
        return self.group_size if self.kind != "gemm_k" else self.dim

    @property
    def cpu_register_rows(self) -> bool:
        """Whether a CPU tile's bn counts weight rows of a register tile (gemm_mn over [N, K] weights)."""
        return self.kind != "gemm_k" and self.layout == "nk"

    def choices(self) -> dict[str, tuple]:
        """Candidate values per knob (MetaSchedule samples an index into each)."""
        w = self.workload
        if self.space == "cpu":
            widths = CPU_ROWS if self.cpu_register_rows else CPU_BN
            return {"bm": CPU_BM, "bn": tuple(bn for bn in widths if self.cpu_width % bn == 0)}
        if self.space == "decode":
            return {k: v for k, v in DECODE_CHOICES.items() if k != "rows" or w.kind == "gemm_k"}
        # swapped-operand candidates only for the <= 128-token bucket: a tile of at most 208 tokens covers a group's
        # active tokens in one tile only over part of the 129-512 bucket, and past it in two or three (on the H200
        # the bucket's two-count runner picked them, and they were 5-35 % slower at 129-192 and 320-384 tokens:
        # docs/performance.md, "gemm_mn with swapped operands")
        # split-tail candidates only past 512 tokens: below, their kernels are the same as without the split (the
        # per-tile gemm_mn sorts its tokens itself there and never runs the pass that splits)
        # pattern-ordered gemm_k candidates only past 512 tokens, where the sort's launch is a small part of the time
        # and many tiles can share skips
        last = self.bucket == len(TILE_TOKENS) - 1
        wg = tuple(k for k in (tile_knob(v, self.kind) for v in WGMMA_VARIANTS if wgmma_fits(w, v))
                   if (self.bucket == 0 or not k.swap) and (last or not past_512_only(k))) if self.wgmma else ()
        return {"variant": tuple(tile_knob(v, self.kind) for v in TILE_VARIANTS) + wg}

    def size(self) -> int:
        return int(np.prod([len(c) for c in self.choices().values()]))


def past_512_only(knobs) -> bool:
    """Whether many-token knobs are candidates of the last tile bucket only: a split tail wave or a pattern order."""
    return bool(isinstance(knobs, WgmmaMN) and knobs.tail or isinstance(knobs, WgmmaK) and knobs.order)


def kernel_tasks(kind: str, groups: int, group_size: int, dim: int, dtype: str, layout: str, target_kind: str,
                 wgmma: bool = False) -> list[KnobTask]:
    """Every task of one kernel on a target kind: a CPU tile per CPU bucket, or on CUDA the direct kernels'
    knobs per decode bucket they run (tensor-core layout only) and the many-token kernels' per tile bucket.
    The direct tasks stay up to DIRECT_TOKENS even where a wgmma tile pick takes 17-64 tokens (knobs.direct_bound):
    which of the two runs there depends on the tile pick, which tuning may change."""
    spec = (kind, groups, group_size, dim, dtype, layout)
    if target_kind == "llvm":
        return [KnobTask(*spec, "cpu", b) for b in range(len(CPU_BUCKETS) + 1)]
    if layout != "tc":
        return []  # the plain CUDA kernels have no knobs to search
    direct = DIRECT_TOKENS["gemm_k" if kind == "gemm_k" else "gemm_mn"]
    return ([KnobTask(*spec, "decode", b, wgmma) for b, top in enumerate(DECODE_BUCKETS) if top <= direct]
            + [KnobTask(*spec, "tile", b, wgmma) for b in range(len(TILE_BUCKETS) + 1)])


def signature(task: KnobTask) -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of the kernel's parameters at the task's token count, then a `task` tag whose length
    names the kernel kind and weight layout (task_tag): the runner, which gets only shapes, needs both to
    check a candidate's output. The built candidate takes the tag and ignores it."""
    m, g, w = task.tokens, task.groups, task.workload
    weights = [(name, stored_shape(task.layout, w.n, w.k), task.dtype)  # gemm_mn takes W_up even without SwiGLU
               for name in ("wg", "wu")[:1 if task.kind == "gemm_k" else 2]]
    return ([("x", (m, w.k), task.dtype), *weights, ("mask", (m, g), "int32"), ("counts", (g,), "int32"),
             ("order", (g, m), "int32"), ("used", (g + 1,), "int32"), ("out", (m, w.n), task.dtype),
             ("task", (task_tag(task.kind, task.layout),), "int8")])


# Tags count kinds in strides of the first three layouts, as before "kp" came: the tag is part of every template, so
# a changed tag would have orphaned every database record; later layouts are numbered after them.
TAG_STRIDE = 3


def task_tag(kind: str, layout: str) -> int:
    i = LAYOUTS.index(layout)
    if i < TAG_STRIDE:
        return 1 + KINDS.index(kind) * TAG_STRIDE + i
    return 1 + len(KINDS) * TAG_STRIDE + (i - TAG_STRIDE) * len(KINDS) + KINDS.index(kind)


def tag_task(tag: int) -> tuple[str, str]:
    """(kind, layout) of a task tag's length."""
    if tag <= len(KINDS) * TAG_STRIDE:
        return KINDS[(tag - 1) // TAG_STRIDE], LAYOUTS[(tag - 1) % TAG_STRIDE]
    rest = tag - 1 - len(KINDS) * TAG_STRIDE
    return KINDS[rest % len(KINDS)], LAYOUTS[TAG_STRIDE + rest // len(KINDS)]


def template(task: KnobTask) -> tvm.IRModule:
    """The task's workload: the kernel's signature, an empty root block, the task in the function's attributes."""
    from tvm.script import tirx as T

    args = ", ".join(f'{n}: T.Buffer({tuple(s)}, "{d}")' for n, s, d in signature(task))
    func = tvm.script.from_source(f"@T.prim_func\ndef main({args}):\n    T.evaluate(0)\n", extra_vars={"T": T},
                                  s_tir=True)
    attrs = {f"wide.{k}": v for k, v in asdict(task).items()} | {"wide.code": code_version(task.space),
                                                                  "wide.choices": choices_json(task.choices())}
    return tvm.IRModule({"main": with_root_block(func).with_attrs({"global_symbol": "main", **attrs})})


def choices_json(choices: dict[str, tuple]) -> str:
    """Candidate lists as a template stores them (`wide.choices`): tile knobs by field name (to_json)."""
    return json.dumps({name: [c.to_json() if hasattr(c, "to_json") else c for c in cands]
                       for name, cands in choices.items()})


def task_of(mod: tvm.IRModule) -> KnobTask | None:
    """The task a knob template (or a record's workload) was made for; None for any other module."""
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
    attrs = funcs["main"].attrs if "main" in funcs and funcs["main"].attrs is not None else {}
    if "wide.space" not in attrs:
        return None
    fields = KnobTask.__dataclass_fields__
    conv = {"groups": int, "group_size": int, "dim": int, "bucket": int, "wgmma": bool}
    return KnobTask(**{k: conv.get(k, str)(attrs[f"wide.{k}"]) for k in fields})


def is_current(mod: tvm.IRModule) -> bool:
    """Whether a template (or a record's workload) was made by today's kernel code (code_version)."""
    task = task_of(mod)
    return task is not None and str(mod["main"].attrs.get("wide.code", "")) == code_version(task.space)


def sample_knobs(sch: tvm.s_tir.Schedule, decisions: dict[str, int] | None = None) -> None:
    """The design space: one categorical decision per knob, annotated on the root block (fixed by `decisions`)."""
    task = task_of(sch.mod)
    root = sch.get_sblock("root")
    for name, cands in task.choices().items():
        n = len(cands)
        index = sch.sample_categorical(list(range(n)), [1.0 / n] * n,
                                       decision=None if decisions is None else decisions[name])
        sch.annotate(root, KNOB + name, index)


def scheduled(task: KnobTask, decisions: dict[str, int] | None = None, mod: tvm.IRModule | None = None):
    """A schedule of the task's template (`mod`, when already built) with its knob decisions (sampled if None)."""
    sch = tvm.s_tir.Schedule(template(task) if mod is None else mod)
    sample_knobs(sch, decisions)
    return sch


def replayed(mod: tvm.IRModule, trace) -> tvm.IRModule:
    """A template with a database record's decisions applied (knob_values / knob_key read them)."""
    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=True)
    return sch.mod


def knob_values(mod: tvm.IRModule) -> dict:
    """The candidate values a scheduled template's root block selects, by knob name."""
    task = task_of(mod)
    ann = mod["main"].body.block.annotations
    if task.space == "decode" and KNOB + "variant" in ann:  # a record of the space's first form: one variant list
        from ..bench.workloads import K_VARIANTS, MN_VARIANTS

        knobs = GemvKnobs(*(K_VARIANTS if task.kind == "gemm_k" else MN_VARIANTS)[int(ann[KNOB + "variant"])])
        return {name: getattr(knobs, name) for name in task.choices()}
    return {name: cands[int(ann[KNOB + name])] for name, cands in choices_of(mod).items()}


def choices_of(mod: tvm.IRModule) -> dict[str, tuple]:
    """The candidate lists a template (or a record's workload) was made with: its own `wide.choices`, so a record
    keeps its meaning after a list changes (its decisions are indices into them); today's for templates that
    predate the attribute. Tile candidates are read as typed knobs from either form (by field name, or the
    positional lists of templates made before the knobs had names)."""
    task = task_of(mod)
    stored = mod["main"].attrs.get("wide.choices")
    if stored is None:
        return task.choices()
    return {name: tuple(tile_knob(v, task.kind) for v in cands) if name == "variant" else tuple(cands)
            for name, cands in json.loads(str(stored)).items()}


def decode_plan(task: KnobTask, values: dict) -> GemvKnobs:
    """The knobs a direct-kernel candidate really runs with (gemv.mn_plan / k_plan)."""
    knobs, tokens = GemvKnobs(**values), bucket_tokens(task.tokens)
    if task.kind == "gemm_k":
        return k_plan(task.groups, task.dim, tokens, knobs)
    return mn_plan(task.group_size, task.dim, task.kind == "gemm_mn_swiglu", tokens, knobs)


def entry_value(task: KnobTask, values: dict):
    """A candidate's knobs as a kernel-knob entry holds one bucket's (kernel_knobs.json, database_entries)."""
    if task.space == "decode":
        return GemvKnobs(**values).to_json()
    return dict(values) if "variant" not in values else values["variant"].to_json()


def decisions_of(task: KnobTask, values: dict) -> dict[str, int] | None:
    """The decisions that select `values` (None when one is not a candidate of the task)."""
    out = {}
    for name, cands in task.choices().items():
        v = values.get(name)
        if v not in cands:
            return None
        out[name] = cands.index(v)
    return out


def incumbent(task: KnobTask, entry: dict | None) -> dict[str, int] | None:
    """Decisions of the knobs the kernel runs this bucket with when the database has nothing for it: a knob
    file's entry (GPU sweep imports), else the kernel's default; None when those are not in the task's space."""
    from ..knobs import decode_knobs
    from ..schedules.tiles import cpu_default_tile, cpu_tiles, tiles_from_log

    entry = entry or {}
    if task.space == "cpu":
        tiles = tiles_from_log(entry["cpu"]) if "cpu" in entry else None
        tile = cpu_tiles(tiles, cpu_default_tile(task.cpu_register_rows, task.cpu_width))[task.bucket]
        return decisions_of(task, {"bm": tile.bm, "bn": tile.bn})
    if task.space == "decode":
        knob = (decode_knobs(entry["decode"]) if "decode" in entry else DEFAULT_DECODE)[task.bucket]
        return decisions_of(task, {name: getattr(knob, name) for name in task.choices()})
    cands = task.choices()["variant"]
    knob = tile_knobs(entry.get("tiles"), task.wgmma, task.kind)[task.bucket]
    same = [i for i, c in enumerate(cands) if c == knob]
    return {"variant": same[0]} if same else None


def instantiate(task: KnobTask, values: dict) -> tirx.PrimFunc:
    """The real kernel with the knobs `values` (direct kernels: in the task's bucket, the others at their
    defaults; CPU and many-token kernels: every bucket of the space gets them)."""
    from ..schedules import gated_kernel

    extra = {}
    if task.space == "cpu":
        extra["cpu_tile"] = TileConfig(values["bm"], values["bn"])
    elif task.space == "decode":
        extra["decode_knobs"] = tuple(GemvKnobs(**values) if b == task.bucket else knobs
                                      for b, knobs in enumerate(DEFAULT_DECODE))
    else:
        extra["tile_knobs"] = (values["variant"],) * len(DEFAULT_TILES)
    return gated_kernel(task.kind, task.groups, task.group_size, task.dim, task.dtype, task.layout,
                        "llvm" if task.space == "cpu" else "cuda", **extra)


def task_reorder(task: KnobTask, values: dict) -> tirx.PrimFunc | None:
    """The mask reorder a model runs in front of a many-token gemm_mn candidate (timed with it, so a kernel that
    sorts its tokens itself is not weighed against one whose reorder is free): it launches nothing up to the
    candidate's reorder-free bound (schedules.gemm_mn_reorder_bound). None for gemm_k (no CUDA gemm_k
    reads the reorder) and the other spaces (the direct kernels read the mask; the CPU times kernels alone)."""
    from ..schedules import gemm_mn_reorder_bound, mask_reorder

    if task.space != "tile" or task.kind == "gemm_k":
        return None
    knobs = (values["variant"],) * len(DEFAULT_TILES)
    return mask_reorder(task.groups, "cuda", gemm_mn_reorder_bound(knobs))


@derived_object
class CategoricalMutator(ms.mutator.PyMutator):
    """Moves one categorical decision of a trace to another candidate (MetaSchedule's own mutators only touch
    tile sizes, unroll, parallel and thread-binding decisions)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, _rand_state):
        insts = [i for i in trace.insts if i.kind.name == "SampleCategorical" and len(i.attrs[0]) > 1]
        if not insts:
            return None
        inst = insts[self.rng.integers(len(insts))]
        n, old = len(inst.attrs[0]), int(trace.decisions[inst])
        new = (old + 1 + int(self.rng.integers(n - 1))) % n
        return trace.with_decision(inst, new, remove_postproc=True)

    def clone(self):
        return CategoricalMutator(int(self.rng.integers(1 << 30)))


@derived_object
class SkipMeasured(ms.postproc.PyPostproc):
    """Rejects a candidate whose point (knob_key) a database already timed, so that a rerun measures only new
    points (the evolutionary search deduplicates within one run, not against earlier records). A direct-kernel
    candidate's knobs are also rewritten as the plan the kernel fits them to (when its values are candidates):
    knob sets that build the same kernel then become the same module, which the search's own deduplication
    catches within a run (before, up to a third of a task's trials re-timed a plan)."""

    def __init__(self, measured=frozenset()):
        self.measured = frozenset(measured)

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        task, values = task_of(sch.mod), knob_values(sch.mod)
        plan = decode_plan(task, values) if task.space == "decode" else None
        if point_key(values, plan) in self.measured:
            return False
        if plan is not None:
            canon = decisions_of(task, {name: getattr(plan, name) for name in values}) or decisions_of(task, values)
            root = sch.get_sblock("root")
            for name in canon:  # (annotate does not replace a key)
                sch.unannotate(root, KNOB + name)
            for name, index in canon.items():
                sch.annotate(root, KNOB + name, index)
        return True

    def clone(self):
        return SkipMeasured(self.measured)


def knob_key(mod: tvm.IRModule) -> tuple:
    """The point a scheduled template selects, as a hashable key: its knob values (not decision indices, which
    depend on the candidate lists), or for the direct kernels the plan they build (knob sets fitted to the same
    kernel are one point)."""
    task, values = task_of(mod), knob_values(mod)
    return point_key(values, decode_plan(task, values) if task.space == "decode" else None)


def point_key(values: dict, plan: GemvKnobs | None = None) -> tuple:
    """knob_key of knob values (and, for a direct kernel, the plan they build)."""
    return ("plan", *astuple(plan)) if plan is not None else tuple(sorted(values.items()))


def space_generator(measured=frozenset()) -> ms.space_generator.ScheduleFn:
    """The design space of a knob task: categorical knobs only, nothing for MetaSchedule's rules to do; the
    points in `measured` (knob_key of each) are not proposed again."""
    return ms.space_generator.ScheduleFn(sample_knobs, sch_rules=[], postprocs=[SkipMeasured(measured)],
                                         mutator_probs={CategoricalMutator(): 1.0})


def all_decisions(task: KnobTask) -> list[dict[str, int]]:
    """Every point of the task's space (for tests and the seeding of small spaces)."""
    names = list(task.choices())
    return [dict(zip(names, idx)) for idx in itertools.product(*(range(len(c)) for c in task.choices().values()))]
