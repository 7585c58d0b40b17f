"""The kernels' knobs as a MetaSchedule search space (tuning/space.py) and the database wide-compile
reads back (tuning/database.py). The MetaSchedule runs themselves: tests/test_tuning.py."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest

from wide_tvm.cuda_aot import cuda_codegen

cuda_codegen()

import tvm  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from wide_tvm import kernel_spec  # noqa: E402
from wide_tvm.tuning import database  # noqa: E402
from wide_tvm.kernel_reference import ref_gemm_k, ref_gemm_mn, rel_err  # noqa: E402
from wide_tvm.knobs import GEMV_TILES, WgmmaMN, tile_knob  # noqa: E402
from wide_tvm.tuning.database import database_entries, measured, open_database  # noqa: E402
from wide_tvm.schedules import code_version as cv  # noqa: E402
from wide_tvm.tuning import runner as kr  # noqa: E402
from wide_tvm.tuning import space as ks  # noqa: E402
from wide_tvm.targets import parse_target  # noqa: E402


def _args_info(mod: tvm.IRModule) -> list:
    return [a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]


@pytest.mark.parametrize("kind,layout,bucket", [pytest.param("gemm_mn_swiglu", "nk", 1, marks=pytest.mark.slow),
                                                ("gemm_k", "kn", 2), ("gemm_mn_swiglu", "nk", 0)])
def test_every_cpu_candidate_builds_from_the_template_and_computes_the_kernel(kind, layout, bucket):
    """What MetaSchedule measures is the real kernel: each point of a CPU task's space, built by the builder
    function from the annotated template and run on the runner's inputs (a valid mask and its reorder), matches
    NumPy (odd token count 13 included)."""
    groups, gs, dim = 4, 32, 48
    task = ks.KnobTask(kind, groups, gs, dim, "float32", layout, "cpu", bucket)
    target = parse_target("llvm")
    assert task.tokens == ks.CPU_TOKENS[bucket] and task.size() == len(ks.all_decisions(task))
    for decisions in ks.all_decisions(task):
        sch = ks.scheduled(task, decisions)
        values = ks.knob_values(sch.mod)
        assert ks.decisions_of(task, values) == decisions
        lib = kr.build_candidate(sch.mod, target)
        args = kr.alloc_args(tvm.cpu(), _args_info(sch.mod), 1)[0]
        host = [a.numpy() for a in args]
        mask = host[-6]
        assert mask.shape == (task.tokens, groups) and 0 < mask.sum() < mask.size or task.tokens == 1
        assert (host[-5] == mask.sum(axis=0)).all()  # counts of the mask, not random integers
        assert ks.tag_task(host[-1].size) == (kind, layout)  # the trailing tag names the kernel
        lib["main"](*args)
        if kind == "gemm_k":
            ref = ref_gemm_k(host[0], host[1], mask, gs, layout)
        else:
            ref = ref_gemm_mn(host[0], host[1], host[2], mask, gs, layout, True)
        assert rel_err(args[-2].numpy(), ref) < 1e-5, values
        kr.check_output(args)  # the runner's own check agrees


def test_runner_rejects_a_candidate_with_wrong_output():
    """The runner checks every timed candidate's output rows against NumPy: a kernel that computes something
    else (here the plain projection run on SwiGLU's inputs, by handing it its own tag) fails the evaluator, which
    MetaSchedule then records as a failed run, never as a time; so does a single wrong element."""
    import numpy as np

    swiglu = ks.KnobTask("gemm_mn_swiglu", 4, 32, 64, "float32", "nk", "cpu", 1)
    plain = ks.KnobTask("gemm_mn", 4, 32, 64, "float32", "nk", "cpu", 1)
    target, cfg = parse_target("llvm"), ms.runner.EvaluatorConfig(number=1, repeat=2, min_repeat_ms=0)
    sch = ks.scheduled(swiglu, {"bm": 0, "bn": 0})
    args = kr.alloc_args(tvm.cpu(), _args_info(sch.mod), 1)[0]
    costs = kr.run_evaluator(kr.build_candidate(sch.mod, target), tvm.cpu(), cfg, [args])
    assert len(costs) == 2 and all(c > 0 for c in costs)  # the right kernel passes
    out = args[-2].numpy()
    rows, _ = kr._EXPECTED[id(args[-2])]
    out[rows[-1], np.flatnonzero(out[rows[-1]])[:1]] += 1.0  # one wrong element in a checked row
    args[-2].copyfrom(out)
    with pytest.raises(RuntimeError, match="wrong output"):
        kr.check_output(args)
    wrong = kr.build_candidate(ks.scheduled(plain, {"bm": 0, "bn": 0}).mod, target)
    tag = tvm.runtime.tensor(np.zeros(ks.task_tag("gemm_mn", "nk"), np.int8), tvm.cpu())
    with pytest.raises(RuntimeError, match="wrong output"):
        kr.run_evaluator(wrong, tvm.cpu(), cfg, [[*args[:-1], tag]])


def test_mutator_moves_one_decision_and_measured_points_are_skipped():
    task = ks.KnobTask("gemm_k", 4, 32, 256, "float32", "kn", "cpu", 0)
    sch = ks.scheduled(task, {"bm": 0, "bn": 0})
    mutator = ks.CategoricalMutator(seed=3)
    for _ in range(10):
        trace = mutator.apply(sch.trace)
        before = [int(v) for v in sch.trace.decisions.values()]
        after = [int(v) for v in trace.decisions.values()]
        assert sum(a != b for a, b in zip(before, after)) == 1
        assert all(0 <= a < len(c) for a, c in zip(after, task.choices().values()))
    skip = ks.SkipMeasured({ks.knob_key(sch.mod)})
    assert not skip.apply(sch) and skip.apply(ks.scheduled(task, {"bm": 1, "bn": 0}))


def test_cuda_tasks_cover_the_direct_and_many_token_kernels():
    from wide_tvm.bench.workloads import TILE_VARIANTS
    from wide_tvm.tuning.driver import bench_kernels

    specs = {s.key: s for s in bench_kernels("cuda")}
    gate_up = specs[kernel_spec.kernel_key("gemm_mn_swiglu", 112, 128, 4096, "float16")]
    tasks = ks.kernel_tasks(gate_up.kind, gate_up.groups, gate_up.group_size, gate_up.dim, gate_up.dtype,
                            gate_up.layout, "cuda", wgmma=True)
    # direct kernels up to 32 tokens (buckets 1, 8, 16, 32), then the tile buckets <= 128, <= 512, more
    assert [(t.space, t.tokens) for t in tasks] == [("decode", 1), ("decode", 8), ("decode", 16), ("decode", 32),
                                                    ("tile", 128), ("tile", 512), ("tile", 4096)]
    assert set(tasks[0].choices()) == {"warps", "unroll", "stages", "row_warps", "ksplit"}  # each knob on its own
    assert tasks[-1].choices()["variant"][:len(TILE_VARIANTS)] == tuple(tile_knob(v, "gemm_k") for v in TILE_VARIANTS)
    assert any(v.kernel == "wgmma" for v in tasks[-1].choices()["variant"])
    down = specs[kernel_spec.kernel_key("gemm_k", 112, 128, 4096, "float16")]
    down_tasks = ks.kernel_tasks(down.kind, down.groups, down.group_size, down.dim, down.dtype, down.layout, "cuda")
    assert [t.tokens for t in down_tasks if t.space == "decode"] == [1, 8, 16, 32, 64]
    assert down_tasks[0].choices() == ks.DECODE_CHOICES and down_tasks[0].size() == 864  # + gemm_k's rows
    assert all(v.kernel != "wgmma" for v in down_tasks[-1].choices()["variant"])  # no sm_90a, no wgmma candidates
    sig = dict((n, (s, d)) for n, s, d in ks.signature(tasks[-1]))
    assert sig["wg"] == ((14336 // 16, 16 * 4096), "float16") and sig["order"] == ((112, 4096), "int32")
    assert ks.tag_task(sig["task"][0][0]) == ("gemm_mn_swiglu", "tc")
    assert ks.kernel_tasks("gemm_k", 3, 24, 40, "float16", "nk", "cuda") == []  # no tensor-core kernel: no knobs


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("space", ["decode", pytest.param("tile", marks=pytest.mark.slow)])  # (decode: the sample)
def test_cuda_candidates_build_from_the_template(space):
    """The builder function compiles a direct-kernel and a wgmma candidate to sm_90a device code here."""
    target = parse_target("cuda")
    decode = {"warps": 1, "unroll": 1, "rows": 1, "stages": 2, "row_warps": 1, "ksplit": 1}  # w8u2r2s3
    cases = {"decode": (decode, "gemm_k"), "tile": (None, "gemm_mn_swiglu")}
    for decisions, kind in [cases[space]]:
        task = ks.KnobTask(kind, 4, 64, 128, "float16", "tc", space, 1 if space == "decode" else 2, wgmma=True)
        if decisions is None:  # the first wgmma candidate
            decisions = {"variant": next(i for i, v in enumerate(task.choices()["variant"]) if v.kernel == "wgmma")}
        sch = ks.scheduled(task, decisions)
        lib = kr.build_candidate(sch.mod, target)
        assert [m.kind for m in lib.imports] == ["cuda"]
        src = lib.imports[0].inspect_source()
        assert ("wgmma.mma_async" if space == "tile" else "mma.sync") in src
        # a gemm_mn tile candidate is timed with the mask reorder a model runs in front of it (tuning/runner.py)
        assert lib.implements_function(kr.REORDER) == (space == "tile")


def _record(db, task: ks.KnobTask, decisions: dict, us: float | list) -> None:
    sch = ks.scheduled(task, decisions)
    wl = db.commit_workload(ks.template(task))
    secs = [t * 1e-6 for t in us] if isinstance(us, list) else [us * 1e-6] * 3
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, secs, parse_target("llvm"),
                                                     ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))


def test_database_picks_the_fastest_record_per_bucket(tmp_path):
    """wide-compile's knobs come from the fastest valid record of each tuned bucket; buckets without records keep
    the knob file's entry or the kernel default (None), failed runs never win, and the lowering gets them."""
    from wide_tvm.passes.lower_gated import _State, _tuned
    from wide_tvm.schedules.tiles import TileConfig

    db = open_database(str(tmp_path))
    mn = ks.KnobTask("gemm_mn_swiglu", 4, 32, 64, "float32", "nk", "cpu", 1)
    _record(db, mn, {"bm": 0, "bn": 1}, 50.0)
    _record(db, mn, {"bm": 2, "bn": 0}, 20.0)
    _record(db, mn, {"bm": 1, "bn": 0}, 1e10)  # a failed run
    k = ks.KnobTask("gemm_k", 4, 32, 64, "float32", "kn", "cpu", 2)
    _record(db, k, {"bm": 1, "bn": 2}, 7.0)
    assert len(measured(db, ks.template(mn))) == 3
    entries = database.load(str(tmp_path))
    assert entries[mn.key]["cpu"] == [None, {"bm": 3, "bn": 1}, None]
    assert entries[mn.key]["database_us"] == {"cpu1": 20.0}
    assert entries[k.key]["cpu"] == [None, None, {"bm": 2, "bn": 64}]
    state = _State("llvm", {}, None, entries)
    assert _tuned(state, "gemm_mn_swiglu", 4, 32, 64, "float32") == {"cpu_tile": (None, TileConfig(3, 1), None)}
    # a knob file's one-for-every-bucket entry keeps the buckets the database did not tune
    merged = database_entries(str(tmp_path), {mn.key: {"cpu": {"bm": 1, "bn": 32}}})
    assert merged[mn.key]["cpu"] == [{"bm": 1, "bn": 32}, {"bm": 3, "bn": 1}, {"bm": 1, "bn": 32}]
    # None buckets build with the kernel's default tile
    from wide_tvm.schedules import gemm_mn

    gemm_mn(4, 32, 64, "float32", "nk", True, "llvm", cpu_tile=(None, TileConfig(3, 1), None))


def test_one_cold_sample_cannot_decide_a_pick(tmp_path):
    """A record's time is the mean over its timed counts of each count's median (database.record_seconds): the
    H200 database once picked O's <= 128-token kernel for a record whose first sample was a cold 184 us among
    19-27 us ones. Here A is faster at both counts but has one such sample; B is slower at both."""
    from wide_tvm.tuning.database import best_records, record_seconds

    db = open_database(str(tmp_path))
    task = ks.KnobTask("gemm_k", 4, 64, 128, "float16", "tc", "tile", 0, wgmma=True)  # timed at 128, then 64 tokens
    a = [184.0] + [24.2] * 19 + [19.5] * 20  # mean 30.3 us
    b = [25.0] * 20 + [21.7] * 20  # mean 23.35 us
    _record(db, task, {"variant": 0}, a)
    _record(db, task, {"variant": 1}, b)
    (secs, values), = best_records(str(tmp_path)).values()
    assert values == {"variant": task.choices()["variant"][0]} and secs == pytest.approx((24.2 + 19.5) / 2 * 1e-6)
    # each count's own median: a slow count is not outvoted by the other's samples
    assert record_seconds(task, [1.0] * 20 + [3.0] * 20) == pytest.approx(2.0)
    # samples that do not split over the counts (an older runner's) are one count
    assert record_seconds(task, [1.0, 2.0, 9.0]) == pytest.approx(2.0)


def test_damaged_database_names_its_folder(tmp_path):
    (tmp_path / "database_workload.json").write_text("not json\n")
    (tmp_path / "database_tuning_record.json").write_text("[1, 2]\n")
    with pytest.raises(Exception, match="unreadable MetaSchedule database"):
        database.load(str(tmp_path))


def test_incumbent_is_what_the_kernel_runs_without_the_database():
    """The knobs wide-tune measures first: the knob file's pick for the bucket, else the kernel's default."""
    from wide_tvm.bench.workloads import TILE_VARIANTS

    cpu = ks.KnobTask("gemm_mn_swiglu", 4, 32, 64, "float32", "nk", "cpu", 1)
    assert ks.knob_values(ks.scheduled(cpu, ks.incumbent(cpu, None)).mod) == {"bm": 4, "bn": 2}  # cpu_default_tile
    entry = {"cpu": [{"bm": 1, "bn": 1}, {"bm": 8, "bn": 4}, None]}
    assert ks.knob_values(ks.scheduled(cpu, ks.incumbent(cpu, entry)).mod) == {"bm": 8, "bn": 4}
    dec = ks.KnobTask("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", "decode", 2)
    values = ks.knob_values(ks.scheduled(dec, ks.incumbent(dec, None)).mod)
    assert values == {"warps": 4, "unroll": 4, "stages": 0, "row_warps": 1, "ksplit": 1}  # GemvKnobs() defaults
    pick = ks.incumbent(dec, {"decode": [[8, 2, 1, 3, 2, 1]] * 5})
    assert ks.knob_values(ks.scheduled(dec, pick).mod) == {"warps": 8, "unroll": 2, "stages": 3, "row_warps": 2,
                                                           "ksplit": 1}
    assert ks.incumbent(dec, {"decode": [[64, 1]] * 5}) is None  # not a candidate of the space
    tile = ks.KnobTask("gemm_k", 112, 128, 4096, "float16", "tc", "tile", 0, wgmma=True)
    assert ks.incumbent(tile, None) == {"variant": TILE_VARIANTS.index(("gemv",))}  # the first bucket's default
    assert tile.choices()["variant"][TILE_VARIANTS.index(("gemv",))] == GEMV_TILES
    wg = ks.KnobTask("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", "tile", 2, wgmma=True)
    pick = {"tiles": [["gemv"], [128, 1, 3, 1], ["wgmma", 128, 4, 4, 1, 4]]}
    assert wg.choices()["variant"][ks.incumbent(wg, pick)["variant"]] == WgmmaMN(producer=4)
    named = {"tiles": [None, None, WgmmaMN(producer=4).to_json()]}  # the named form picks the same candidate
    assert ks.incumbent(wg, named) == ks.incumbent(wg, pick)


@pytest.mark.slow
def test_direct_kernel_knobs_fitted_to_the_same_kernel_are_one_point():
    """The decode space samples warps, unroll, rows, stages, row_warps and ksplit on their own; knob sets the
    kernel fits to the same plan (gemv.mn_plan / k_plan) share a key, so a measured plan is not proposed again,
    and the plan is what the kernel builds (same TIR)."""
    from wide_tvm.schedules import gated_kernel
    from wide_tvm.knobs import DECODE_BUCKETS, GemvKnobs

    task = ks.KnobTask("gemm_mn_swiglu", 8, 32, 1024, "float16", "tc", "decode", 3)  # 32 tokens: unroll fits to 2
    idx = {name: {v: i for i, v in enumerate(c)} for name, c in task.choices().items()}

    def point(**values):
        return ks.scheduled(task, {name: idx[name][v] for name, v in values.items()})

    a = point(warps=8, unroll=4, stages=0, row_warps=1, ksplit=1)
    b = point(warps=8, unroll=2, stages=0, row_warps=1, ksplit=1)
    c = point(warps=8, unroll=1, stages=0, row_warps=1, ksplit=1)
    assert ks.knob_key(a.mod) == ks.knob_key(b.mod) != ks.knob_key(c.mod)
    skip = ks.SkipMeasured({ks.knob_key(b.mod)})
    assert not skip.apply(a) and skip.apply(c)
    plan = ks.decode_plan(task, ks.knob_values(a.mod))
    assert plan == GemvKnobs(8, 2, 1, 0, 1, 1)

    def script(knobs):
        per_bucket = tuple(knobs if b == task.bucket else GemvKnobs() for b in range(len(DECODE_BUCKETS)))
        return gated_kernel(task.kind, task.groups, task.group_size, task.dim, task.dtype, "tc", "cuda",
                            decode_knobs=per_bucket).script()

    assert script(GemvKnobs(**ks.knob_values(a.mod))) == script(plan) == ks.instantiate(task, ks.knob_values(
        b.mod)).script()
    distinct = {ks.knob_key(ks.scheduled(task, d).mod) for d in ks.all_decisions(task)}
    assert 1 < len(distinct) < task.size()


def test_records_of_older_kernel_code_are_not_applied_but_re_measured_first(tmp_path, monkeypatch):
    """Every template carries a hash of its kernels' code: after a kernel change the old records no longer apply
    (wide-compile falls back to the knob file or the default, --show says so), and wide-tune measures each task's
    fastest stale knobs first."""
    from wide_tvm.tuning.database import best_records, summary

    db = open_database(str(tmp_path))
    task = ks.KnobTask("gemm_k", 4, 32, 64, "float32", "kn", "cpu", 2)
    _record(db, task, {"bm": 1, "bn": 2}, 7.0)
    _record(db, task, {"bm": 0, "bn": 0}, 9.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all current: no warning
        assert database.load(str(tmp_path))[task.key]["cpu"] == [None, None, {"bm": 2, "bn": 64}]
    monkeypatch.setattr(ks, "code_version", lambda space: "0123456789abcdef")  # the kernels changed
    assert not ks.is_current(db.get_all_tuning_records()[0].workload.mod)
    with pytest.warns(database.StaleTuningWarning, match="1 tuned kernel bucket.*gemm_k/g4x32/d64/float32/cpu2"):
        assert database.load(str(tmp_path)) == {}  # said, not silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -W error: the warning itself, not "unreadable MetaSchedule database"
        with pytest.raises(database.StaleTuningWarning, match="gemm_k/g4x32/d64/float32/cpu2"):
            database.load(str(tmp_path))
    assert best_records(str(tmp_path)) == {}
    assert best_records(str(tmp_path), current=False) == {task: (pytest.approx(7e-6), {"bm": 2, "bn": 64})}
    assert "2 records were timed on older kernel code" in summary(str(tmp_path))
    assert len(measured(db, ks.template(task))) == 0


def test_first_form_decode_records_are_read_and_pruned(tmp_path):
    """Records of the decode space's first form (one `variant` index into the sweep's list, no code hash) still
    name their knobs, so wide-tune re-measures the fastest of them first; `wide-tune --prune` then drops every
    stale record and keeps the current ones."""
    from wide_tvm.bench.workloads import K_VARIANTS
    from wide_tvm.cli import tune_main
    from wide_tvm.tuning.database import best_records, prune, summary
    from wide_tvm.knobs import GemvKnobs

    db = open_database(str(tmp_path))
    task = ks.KnobTask("gemm_k", 112, 128, 4096, "float16", "tc", "decode", 0)
    old = ks.template(task)
    old = tvm.IRModule({"main": old["main"].without_attr("wide.code")})
    sch = tvm.s_tir.Schedule(old)
    n = len(K_VARIANTS)
    sch.annotate(sch.get_sblock("root"), ks.KNOB + "variant", sch.sample_categorical(list(range(n)), [1 / n] * n, 6))
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(old), [2e-5] * 3,
                                                     parse_target("llvm"),
                                                     ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
    _record(db, ks.KnobTask("gemm_k", 4, 32, 64, "float32", "kn", "cpu", 2), {"bm": 1, "bn": 2}, 7.0)
    del db
    (secs, values), = best_records(str(tmp_path), current=False).values()
    knobs = GemvKnobs(*K_VARIANTS[6])
    assert values == {name: getattr(knobs, name) for name in ks.DECODE_CHOICES} and secs == pytest.approx(2e-5)
    assert ks.decisions_of(task, values) is not None  # re-measurable in today's space
    assert "1 records were timed on older kernel code" in summary(str(tmp_path))
    assert tune_main(["--prune", "--out", str(tmp_path)]) == 0
    assert prune(str(tmp_path)) == (1, 0)
    assert "older kernel code" not in summary(str(tmp_path)) and len(best_records(str(tmp_path))) == 1
    assert tune_main(["--prune", "--out", str(tmp_path / "none")]) != 0  # no database: a clear error


def test_code_version_ignores_docs_and_python_version_details():
    """The code hash reads syntax trees without docstrings, comments or positions, and without the empty fields
    newer Pythons add (3.12's type_params): the GPU host (3.12) and this machine (3.11) must agree on it."""
    import ast

    a = ast.parse('def f(x):\n    """doc"""\n    return x + 1  # note\n')
    b = ast.parse("def f(x):\n\n    return x + 1\n")
    b.body[0].type_params = []  # as Python 3.12 parses it
    b.body[0].body.insert(0, ast.Expr(ast.Constant("other doc")))
    for tree in (a, b):
        tree.body[0].body = tree.body[0].body[1:]  # what code_version drops
    assert cv._canonical(a) == cv._canonical(b) != cv._canonical(ast.parse("def f(x):\n    return x + 2\n"))
    assert len({cv.code_version(s) for s in cv.SPACE_SOURCES}) == 3


def test_code_version_does_not_change_when_code_moves():
    """A pure move (a definition into another module, definitions re-ordered, imports rewritten, annotations
    renamed) keeps the hash, so it stales no tuning record; a changed body or a renamed definition changes it."""
    one = ("from .a import x\nK = 64\n\n\ndef f(knobs: TileKnobs, n) -> int:\n    from ..knobs import rule\n"
           "    return rule(knobs) + n * K\n\n\ndef g(n):\n    return f(None, n)\n")
    # f moved to a module of its own, after g, with other imports and annotations
    two = ["from .b import x\nimport os\n\n\ndef g(n):\n    return f(None, n)\n",
           '"""The f module."""\nfrom ...wide_tvm.knobs import TileKnobs\nK = 64\n\n\n'
           "def f(knobs: WgmmaMN, n):\n    from ...wide_tvm.knobs import rule\n    return rule(knobs) + n * K\n"]
    assert cv._digest([one]) == cv._digest(two)
    assert cv._digest([one]) != cv._digest([one.replace("n * K", "n * K + 1")])
    assert cv._digest([one]) != cv._digest([one.replace("def g", "def h")])
    assert cv._digest([one]) != cv._digest([one.replace("import rule", "import other as rule")])


def _restamp_tool():
    """tools/restamp_records.py as a module (tools/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "restamp_records", os.path.join(os.path.dirname(__file__), "..", "tools", "restamp_records.py"))
    restamp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(restamp)
    return restamp


def test_records_of_a_revision_count_as_current_inside_the_pin(tmp_path, monkeypatch):
    """code_version_at(REV) hashes REV's kernel modules as code_version hashes today's (HEAD's package, laid out as
    the restamp tool does, agrees in a process of its own); inside records_of(REV) REV's versions are today's, so a
    record REV's code stamped applies and one today's code stamped does not, and outside it is the other way round
    (wide-bench build --records-of); a revision git does not know is a clear error."""
    from wide_tvm.errors import WideError

    restamp = _restamp_tool()
    pkg = restamp.package_at("HEAD", str(tmp_path / "pkg"))
    assert restamp.package_versions(pkg) == {s: cv.code_version_at("HEAD", s) for s in cv.SPACE_SOURCES}
    task = ks.KnobTask("gemm_k", 4, 16, 64, "float32", "kn", "cpu", 0)
    today = ks.template(task)
    monkeypatch.setattr(cv, "code_version_at", lambda rev, space: f"{rev}-{space}")
    with cv.records_of("old") as versions:
        assert versions == {s: f"old-{s}" for s in cv.SPACE_SOURCES}
        assert not ks.is_current(today)
        old = ks.template(task)  # stamped as REV's code would have stamped it
        assert ks.is_current(old) and str(old["main"].attrs["wide.code"]) == "old-cpu"
    assert ks.is_current(today) and not ks.is_current(old) and cv.code_version("cpu") == cv._tree_version("cpu")
    monkeypatch.undo()
    with pytest.raises(WideError, match="no-such-rev"):
        with cv.records_of("no-such-rev"):
            pass
    assert cv.code_version("tile") == cv._tree_version("tile")


def test_knob_sets_of_one_plan_become_one_module_for_the_search():
    """The postprocessor writes a direct-kernel candidate's knobs as its plan, so MetaSchedule's deduplication of
    identical modules catches aliases within a run; plans are fixed points of the fitting; the record's own trace
    still replays to the sampled decisions."""
    task = ks.KnobTask("gemm_mn_swiglu", 8, 32, 1024, "float16", "tc", "decode", 3)
    idx = {name: {v: i for i, v in enumerate(c)} for name, c in task.choices().items()}

    def post(**values):
        sch = ks.scheduled(task, {name: idx[name][v] for name, v in values.items()})
        sch.enter_postproc()  # as the search does before its postprocessors
        assert ks.SkipMeasured().apply(sch)
        return sch

    a = post(warps=8, unroll=4, stages=0, row_warps=1, ksplit=1)
    b = post(warps=8, unroll=2, stages=0, row_warps=1, ksplit=1)
    c = post(warps=8, unroll=1, stages=0, row_warps=1, ksplit=1)
    from tvm_ffi import structural_equal

    assert structural_equal(a.mod, b.mod) and not structural_equal(a.mod, c.mod)
    assert ks.knob_values(a.mod)["unroll"] == 2  # the plan's value
    assert ks.knob_values(ks.replayed(ks.template(task), a.trace))["unroll"] == 4  # the sampled decision
    for d in ks.all_decisions(task)[::7]:
        plan = ks.decode_plan(task, ks.knob_values(ks.scheduled(task, d).mod))
        assert ks.decode_plan(task, {n: getattr(plan, n) for n in task.choices()}) == plan


@pytest.mark.slow
def test_the_search_proposes_each_plan_once():
    """MetaSchedule's evolutionary search over a direct-kernel task (search only: candidates are reported back as
    timed without running) proposes 32 distinct plans in two batches; before the postprocessor rewrote knobs as
    plans, 48 proposals held 29 distinct ones."""
    task = ks.KnobTask("gemm_mn_swiglu", 112, 128, 4096, "float16", "tc", "decode", 0)
    mod, target = ks.template(task), parse_target("cuda")
    ctx = ms.TuneContext(mod, target=target, space_generator=ks.space_generator(),
                         search_strategy=ms.search_strategy.EvolutionarySearch(
                             population_size=64, init_measured_ratio=0.0, genetic_num_iters=2),
                         task_name=task.name, rand_state=1, num_threads=1)
    db = ms.database.MemoryDatabase()
    ctx.pre_tuning(max_trials=32, num_trials_per_iter=16, design_spaces=ctx.generate_design_space(), database=db,
                   cost_model=ms.cost_model.RandomModel())
    keys = []
    for _ in range(2):
        cands = ctx.generate_measure_candidates()
        keys += [ks.knob_key(ks.replayed(mod, c.sch.trace)) for c in cands]
        ctx.notify_runner_results(cands, [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None) for _ in cands])
        for c in cands:
            db.commit_tuning_record(ms.database.TuningRecord(c.sch.trace, db.commit_workload(mod), [1e-3], target,
                                                             c.args_info))
    assert len(keys) == 32 and len(set(keys)) == 32


def test_records_keep_their_meaning_when_a_candidate_list_changes(tmp_path, monkeypatch):
    """A record's decisions are indices into the candidate lists; the template stores its lists, so after a list
    changes (here CPU_BN reordered) an old record still names the knobs it timed, counts as measured for the new
    template, and its pick is applied as timed."""
    from wide_tvm.tuning.database import best_records

    db = open_database(str(tmp_path))
    task = ks.KnobTask("gemm_k", 4, 32, 64, "float32", "kn", "cpu", 2)
    _record(db, task, {"bm": 1, "bn": 2}, 7.0)  # bm 2, bn 64 under today's lists
    monkeypatch.setattr(ks, "CPU_BN", tuple(reversed(ks.CPU_BN)))  # (128, 64, 32, 16): index 2 is now bn 16
    assert task.choices()["bn"] == (64, 32, 16)
    assert best_records(str(tmp_path)) == {task: (pytest.approx(7e-6), {"bm": 2, "bn": 64})}
    new = ks.template(task)
    assert measured(db, new) == {ks.knob_key(ks.scheduled(task, {"bm": 1, "bn": 0}, new).mod)}
    assert database.load(str(tmp_path))[task.key]["cpu"] == [None, None, {"bm": 2, "bn": 64}]


@pytest.mark.slow
def test_restamp_keeps_the_records_whose_kernel_is_unchanged(tmp_path, monkeypatch):
    """tools/restamp_records.py: the kernel hashes it compares are the same for the same code and differ between
    knob values; `--jobs` splits the records by task (task_chunks); `--only` builds only the records of the tasks
    it names; `--sample N` only a task's first N, the others following them; `--write` gives today's stamp to exactly
    the records its report names; `package_at` lays out an importable package of a git revision."""
    import json
    import subprocess
    import sys

    from wide_tvm.tuning.database import best_records, record_key, task_records

    restamp = _restamp_tool()
    path = restamp.__file__
    folder, old = str(tmp_path / "db"), "feedface00000000"
    db = open_database(folder)
    task = ks.KnobTask("gemm_k", 4, 32, 64, "float32", "kn", "cpu", 2)
    stale = tvm.IRModule({"main": ks.template(task)["main"].with_attr("wide.code", old)})
    for decisions, us in (({"bm": 0, "bn": 0}, 9.0), ({"bm": 1, "bn": 1}, 5.0)):
        sch = ks.scheduled(task, decisions, stale)
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(stale), [us * 1e-6] * 3,
                                                         parse_target("llvm"),
                                                         ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
    del db
    assert best_records(folder) == {}  # both stale
    first = restamp.collect(restamp.kernel_hashes(folder, old), "today's code")
    again = restamp.collect(restamp.kernel_hashes(folder, old), "today's code")
    assert first == again and sorted(first) == ["0", "1"] and first["0"][2] != first["1"][2]
    assert restamp.collect(restamp.kernel_hashes(folder, "0" * 16), "today's code") == {}
    assert restamp.task_chunks(folder, old, 4) == [r"^(gemm_k/g4x32/d64/float32/cpu2)$"]  # --jobs: one task
    assert restamp.collect(restamp.kernel_hashes(folder, old, only=restamp.task_chunks(folder, old, 4)[0]),
                           "today's code") == first
    monkeypatch.setenv("WIDE_RESTAMP_ONLY", "/tile")  # what --only sets: this cpu task's records are not built
    assert restamp.collect(restamp.kernel_hashes(folder, old), "today's code") == {}
    assert restamp.task_chunks(folder, old, 4) == []
    monkeypatch.setenv("WIDE_RESTAMP_ONLY", "gemm_k/g4x32/d64/float32/cpu2")
    assert restamp.collect(restamp.kernel_hashes(folder, old), "today's code") == first
    monkeypatch.delenv("WIDE_RESTAMP_ONLY")
    monkeypatch.setenv("WIDE_RESTAMP_SAMPLE", "1")  # what --sample 1 sets: each task's first record is built
    sampled = restamp.collect(restamp.kernel_hashes(folder, old), "today's code")
    assert sorted(sampled) == ["0"] and sampled["0"] == first["0"]
    assert restamp.unsampled_records(folder, sampled, {0}) == {1}  # the task's other record goes with its sample
    assert restamp.unsampled_records(folder, sampled, set()) == set()  # ... unless the sample's kernel changed
    monkeypatch.delenv("WIDE_RESTAMP_SAMPLE")
    monkeypatch.setenv("WIDE_RESTAMP_SET", "knobs.TILE_TAKEOVER=32")  # what --set sets: a constant today's build uses
    assert restamp.collect(restamp.kernel_hashes(folder, old), "today's code") == first  # (no CPU kernel reads it)
    monkeypatch.setenv("WIDE_RESTAMP_SET", "gemv.NO_SUCH_BOUND=32")
    with pytest.raises(SystemExit, match="wide_tvm.schedules.gemv has no NO_SUCH_BOUND"):
        restamp.collect(restamp.kernel_hashes(folder, old), "today's code")
    monkeypatch.delenv("WIDE_RESTAMP_SET")
    first_secs = float(task_records(folder)[0][1].run_secs[0])
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"same": [0]}))  # a report of before record keys: refused, nothing written
    refused = subprocess.run([sys.executable, path, folder, "--from-report", str(report), "--write"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "without record keys" in refused.stderr
    assert not any(ks.is_current(rec.workload.mod) for _, rec in task_records(folder))
    key = record_key(task_records(folder)[0][1])
    report.write_text(json.dumps({"same": [0], "keys": {"0": key}}))
    db = open_database(folder)  # a record appended after the report: the report still names the record it found
    sch = ks.scheduled(task, {"bm": 2, "bn": 2}, stale)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(stale), [7e-6] * 3,
                                                     parse_target("llvm"),
                                                     ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
    del db
    subprocess.run([sys.executable, path, folder, "--from-report", str(report), "--write"], check=True,
                   capture_output=True)
    current = [float(rec.run_secs[0]) for _, rec in task_records(folder) if ks.is_current(rec.workload.mod)]
    assert len(task_records(folder)) == 3 and current == [pytest.approx(first_secs)]
    other_folder = str(tmp_path / "other")  # a report of another database: refused
    open_database(other_folder)
    refused = subprocess.run([sys.executable, path, other_folder, "--from-report", str(report)], capture_output=True,
                             text=True)
    assert refused.returncode == 2 and "1 records of the report are not in" in refused.stderr
    (secs, _), = best_records(folder).values()
    assert secs == pytest.approx(first_secs)  # the re-stamped record is applied; the other stays stale
    pkg = restamp.package_at("HEAD", str(tmp_path / "pkg"))
    assert os.path.exists(os.path.join(pkg, "wide_tvm", "schedules", "gemv.py"))
    # a record whose template predates stored candidate lists: the code that stamped it reports its lists, and
    # today's build decodes its decisions with the lists it is given, not today's
    bare_folder = str(tmp_path / "bare")
    db = open_database(bare_folder)
    bare = tvm.IRModule({"main": stale["main"].without_attr("wide.choices")})
    sch = ks.scheduled(task, {"bm": 0, "bn": 0}, bare)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(bare), [1e-6], parse_target("llvm"),
                                                     ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
    del db
    (space, _, kernel, lists), = restamp.collect(restamp.kernel_hashes(bare_folder, old), "today's code").values()
    import tvm_ffi

    choices = task.choices()
    want = str(tvm_ffi.structural_hash(ks.instantiate(task, {"bm": choices["bm"][0], "bn": choices["bn"][0]})))
    assert kernel == want and json.loads(lists) == {k: list(v) for k, v in choices.items()}
    other = {"0": json.dumps({"bm": list(choices["bm"]), "bn": list(reversed(choices["bn"]))})}
    (tmp_path / "lists.json").write_text(json.dumps(other))
    (_, _, kernel2, given), = restamp.collect(restamp.kernel_hashes(bare_folder, old, choices=str(tmp_path / "lists.json")),
                                              "today's code").values()
    assert given is None and kernel2 != kernel  # bn index 0 now names the last bn


def test_runner_times_a_candidate_with_its_mask_reorder():
    """A timed call runs the candidate module's mask reorder (on the argument set's mask, counts, order, used)
    before the kernel where the module has one, else the kernel alone."""
    calls = []

    class Module:  # the two methods _timed_call uses of a tvm.runtime.Module
        def __init__(self, names):
            self.names = names

        def implements_function(self, name):
            return name in self.names

        def __getitem__(self, name):
            return lambda *a: calls.append((name, a))

    args = list(range(9))  # x, w_gate, w_up, mask, counts, order, used, out, task tag
    kr._timed_call(Module({"main", kr.REORDER}))(*args)
    assert calls == [(kr.REORDER, (3, 4, 5, 6)), ("main", tuple(args))]
    calls.clear()
    kr._timed_call(Module({"main"}))(*args)
    assert calls == [("main", tuple(args))]


def test_tile_buckets_are_timed_below_their_top_too():
    """A candidate of the <= 128 / <= 512 / more-token buckets is timed at 64 / 256 / 2048, 1536 and 1024 tokens as
    well (argument sets at every count; its time is the mean of each count's median), since its pick serves the
    whole bucket."""
    for kind, bucket, counts in (("gemm_mn_swiglu", 0, [128, 64]), ("gemm_mn", 1, [512, 256]),
                                 ("gemm_mn", 2, [4096, 2048, 1536, 1024]), ("gemm_k", 0, [128, 64]),
                                 ("gemm_k", 2, [4096, 2048, 1536, 1024])):
        task = ks.KnobTask(kind, 4, 64, 128, "float16", "tc", "tile", bucket, wgmma=True)
        sets = kr.alloc_args(tvm.cpu(), _args_info(ks.template(task)), 1)
        assert [s[0].shape[0] for s in sets] == counts  # x [tokens, K]
        assert all(s[-2].shape[0] == m and s[-4].shape == (4, m) for s, m in zip(sets, counts))  # out, order


def test_bucket_halves_tool_ranks_as_the_database_picks():
    """tools/bucket_halves.py on the committed H200 database: every tile task's "pick" is the bucket's pick
    database.load makes (the fastest record by the mean over its counts of each count's median), and its time
    at the bucket's timed count is the largest (that count's repeats come first in a record)."""
    import re
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    folder = os.path.join(root, "tuning_logs", "cuda-sm90")
    out = subprocess.run([sys.executable, os.path.join(root, "tools", "bucket_halves.py"), folder],
                         capture_output=True, text=True, check=True).stdout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        picks = database.load(folder)
    tasks = re.findall(r"^(\S+)/tile(\d): \d+ current records\n  pick\s+(\S+)\s+(.*)$", out, re.M)
    assert len(tasks) == 18, out  # 6 kernels x the <= 128, <= 512 and more-token buckets
    for key, bucket, knobs, times in tasks:
        assert knobs == tile_knob(picks[key]["tiles"][int(bucket)], key.split("/")[0]).name(), (key, bucket)
        counts, us = zip(*((int(m), float(t)) for m, t in re.findall(r"(\d+): +([\d.]+) us", times)))
        assert counts == (ks.TILE_TOKENS[int(bucket)], *kr.ALSO_TIMED[ks.TILE_TOKENS[int(bucket)]]), times
        assert us[0] == max(us), (key, bucket, times)


def test_measure_knobs_tool_picks_the_fastest_records_and_given_variants():
    """tools/measure_knobs.py on the committed H200 database: per task its K fastest distinct records (any code
    version) and each given variant the task has as a candidate, once; a variant outside the task's space (gemm_k's
    stream-K for gemm_mn) is left out."""
    import importlib.util
    import sys

    from wide_tvm.bench.workloads import STREAM_K_VARIANTS, TAIL_VARIANTS
    from wide_tvm.tuning.database import best_records, task_records

    root = os.path.join(os.path.dirname(__file__), "..")
    spec = importlib.util.spec_from_file_location("measure_knobs", os.path.join(root, "tools", "measure_knobs.py"))
    tool = importlib.util.module_from_spec(spec)
    sys.modules["measure_knobs"] = tool
    spec.loader.exec_module(tool)
    folder = os.path.join(root, "tuning_logs", "cuda-sm90")
    q = ks.KnobTask("gemm_mn", 8, 512, 4096, "float16", "tc", "tile", 2, wgmma=True)
    records = task_records(folder)
    pick = best_records(folder, records)[q][1]
    # (Q's two fastest: the tail 8 / 16 variants with producer warps; TAIL_VARIANTS[2], without them, comes third)
    points = tool.points_to_time([q], records, 2, [TAIL_VARIANTS[2], STREAM_K_VARIANTS[0], TAIL_VARIANTS[2]])
    assert [t for t, _ in points] == [q] * 3
    values = [v for _, v in points]
    assert values[0] == pick and values[1] != pick and values[2] == {"variant": tile_knob(TAIL_VARIANTS[2], "gemm_mn")}


@pytest.mark.slow
def test_db_records_carries_a_subset_and_merges_back_only_new_records(tmp_path):
    """tools/db_records.py: the records of the tasks --only names go to a new folder (twice: nothing more), and a
    folder that comes back with one record measured there adds exactly that record to a copy of the source."""
    import re
    import shutil
    import subprocess
    import sys

    from tvm.s_tir import meta_schedule as ms

    from wide_tvm.tuning.database import task_records

    root = os.path.join(os.path.dirname(__file__), "..")
    tool = os.path.join(root, "tools", "db_records.py")
    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(root, "tuning_logs", "llvm"), src)
    records = task_records(src)
    name = sorted({task.name for task, _ in records})[0]
    mine = [rec for task, rec in records if task.name == name]
    assert 0 < len(mine) < len(records)
    sub = str(tmp_path / "sub")

    def run(*args):
        res = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout

    assert f"{len(mine)} records added, 0 already there" in run(src, sub, "--only", f"^{re.escape(name)}$")
    assert f"0 records added, {len(mine)} already there" in run(src, sub, "--only", f"^{re.escape(name)}$")
    assert {task.name for task, _ in task_records(sub)} == {name}
    db = open_database(sub)  # a record measured on the other machine: the same candidate, other run times
    rec = mine[0]
    db.commit_tuning_record(ms.database.TuningRecord(rec.trace, db.commit_workload(rec.workload.mod), [1e-6] * 3,
                                                     rec.target, rec.args_info))
    del db
    assert f"1 records added, {len(mine)} already there" in run(sub, src)
    assert len(task_records(src)) == len(records) + 1
    refused = subprocess.run([sys.executable, tool, str(tmp_path / "none"), sub], capture_output=True, text=True)
    assert refused.returncode == 2 and "no tuning database" in refused.stderr


def test_task_tags_of_the_first_layouts_never_move():
    """A task's tag is part of its template: the tags of "nk" / "kn" / "tc" stay what they were before "kp" came (or
    every database record would be orphaned), and every (kind, layout) has its own tag that reads back."""
    from wide_tvm.weight_layout import LAYOUTS

    assert [ks.task_tag(k, lay) for k in ks.KINDS for lay in ("nk", "kn", "tc")] == list(range(1, 10))
    tags = {ks.task_tag(k, lay): (k, lay) for k in ks.KINDS for lay in LAYOUTS}
    assert len(tags) == len(ks.KINDS) * len(LAYOUTS) and all(ks.tag_task(t) == kl for t, kl in tags.items())


def test_code_version_hashes_the_knob_rules_too():
    """Every space's code version covers wide_tvm/knobs.py as well as its kernel modules: the token buckets, the bounds
    between kernels and the shape checks moved there from the kernel modules, and an edit of them must stale the
    records as it did before."""
    from wide_tvm import knobs

    for space in cv.SPACE_SOURCES:
        paths = cv.source_paths(space)
        assert os.path.abspath(knobs.__file__) in paths and all(os.path.exists(p) for p in paths)
        assert cv._digest([open(p).read() for p in paths]) == cv.code_version(space)
