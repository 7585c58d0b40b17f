"""Kernel knob tuning (wide-tune), the knob database wide-compile applies, and wide-bench's reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import build_cpu

import wide_tvm
from wide_tvm import kernel_spec
from wide_tvm.tuning import database, knob_file
from wide_tvm.errors import WideError
from wide_tvm.cli import tune_main
from wide_tvm.kernel_reference import make_mask, ref_gemm_k, ref_gemm_mn, ref_mask_reorder, rel_err
from wide_tvm.schedules import gemm_k, gemm_mn
from wide_tvm.schedules.tiles import TileConfig


def _check_cpu_kernels(tile, layout: str, token_counts, seed: int, k_tile=None) -> None:
    """Our CPU gemm_mn (SwiGLU) and gemm_k with `tile` (one TileConfig or one per CPU bucket; gemm_k `k_tile`
    where given: its bn counts columns, gemm_mn's over [N, K] weights its register tile's rows) against NumPy."""
    import tvm

    groups, gs, dim = 4, 32, 48
    rng = np.random.default_rng(seed)
    mn = build_cpu(gemm_mn(groups, gs, dim, "float32", layout, True, "llvm", cpu_tile=tile))
    k = build_cpu(gemm_k(groups, gs, 64, "float32", layout, "llvm", cpu_tile=k_tile or tile))
    t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a))  # noqa: E731
    for tokens in token_counts:
        mask = make_mask("random", tokens, groups, rng)
        counts, order, used = ref_mask_reorder(mask)
        x = rng.standard_normal((tokens, dim)).astype("float32")
        wshape = (groups * gs, dim) if layout == "nk" else (dim, groups * gs)
        wg, wu = (rng.standard_normal(wshape).astype("float32") for _ in range(2))
        out = t(np.full((tokens, groups * gs), np.nan, "float32"))
        mn(t(x), t(wg), t(wu), t(mask), t(counts), t(order), t(used), out)
        assert rel_err(out.numpy(), ref_gemm_mn(x, wg, wu, mask, gs, layout, True)) < 1e-5, tokens
        a = rng.standard_normal((tokens, groups * gs)).astype("float32")
        w = rng.standard_normal((64, groups * gs) if layout == "nk" else (groups * gs, 64)).astype("float32")
        out = t(np.full((tokens, 64), np.nan, "float32"))
        k(t(a), t(w), t(mask), t(counts), t(order), t(used), out)
        assert rel_err(out.numpy(), ref_gemm_k(a, w, mask, gs, layout)) < 1e-5, tokens


@pytest.mark.parametrize("bm,rows,bn", [(1, 1, 16), (3, 2, 32), (8, 4, 64)])
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_cpu_kernels_correct_for_every_tile(bm, rows, bn, layout):
    """The CPU tuner's kinds of candidates compute the same thing (odd token counts included): gemm_mn over [N, K]
    weights with register tiles of `rows` weight rows, the other kernels with `bn` columns (gemm_mn's at most its
    group size, 32)."""
    _check_cpu_kernels(TileConfig(bm, rows if layout == "nk" else min(bn, 32)), layout, (1, 5, 13), seed=bm * 10 + bn,
                       k_tile=TileConfig(bm, bn))


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_cpu_kernels_take_one_tile_per_token_bucket(layout):
    """Each CPU token bucket (1, <= 16, more) runs its own tile: token counts on both sides of every bound agree
    with the reference; a tile list of the wrong length is refused."""
    from wide_tvm.schedules.tiles import CPU_BUCKETS

    tiles = (TileConfig(1, 1), TileConfig(4, 2), TileConfig(8, 4)) if layout == "nk" else \
        (TileConfig(1, 8), TileConfig(4, 16), TileConfig(8, 32))
    _check_cpu_kernels(tiles, layout, (1, 2, CPU_BUCKETS[1], CPU_BUCKETS[1] + 1, 37), seed=7,
                       k_tile=(TileConfig(1, 16), TileConfig(3, 32), TileConfig(8, 64)))
    with pytest.raises(ValueError, match="2 CPU tiles"):
        gemm_k(4, 32, 64, "float32", layout, "llvm", cpu_tile=tiles[:2])


def test_knob_file_merges_and_rejects_garbage(tmp_path):
    key = kernel_spec.kernel_key("gemm_k", 6, 32, 64, "float32")
    knob_file.save(str(tmp_path), {key: {"cpu": {"bm": 4, "bn": 8}}}, "llvm", "test")
    other = kernel_spec.kernel_key("gemm_mn_swiglu", 6, 32, 64, "float32")
    knob_file.save(str(tmp_path), {other: {"cpu": {"bm": 1, "bn": 16}}}, "llvm", "test")
    assert set(database.load(str(tmp_path))) == {key, other}
    assert database.load(str(tmp_path / "none")) == {}
    (tmp_path / knob_file.FILE).write_text("{not json")
    with pytest.raises(wide_tvm.WideError, match="not a kernel knob file"):
        database.load(str(tmp_path))


@pytest.mark.slow
def test_wide_tune_cpu_resumes_and_compile_applies_it(exported, tmp_path, capsys, monkeypatch):
    """wide-tune runs MetaSchedule over every CPU knob task of the model into a JSON database; a rerun measures
    only points not measured yet (and nothing once --trials are in), and wide-compile applies the fastest. A few
    trials left per task are drawn at random in one batch; more go through the evolutionary search (forced here
    for one trial, the spaces of this tiny model being small)."""
    from wide_tvm.tuning import search
    from wide_tvm.tuning.database import open_database
    from wide_tvm.tuning.space import knob_key, replayed, task_of

    path, model, cfg = exported("default", "onnx")
    out = str(tmp_path / "tl")

    def points():
        keys = []
        for rec in open_database(out).get_all_tuning_records():
            assert max(float(s) for s in rec.run_secs) < 1e9  # every candidate built and ran
            keys.append((task_of(rec.workload.mod).name, knob_key(replayed(rec.workload.mod, rec.trace))))
        return keys

    assert tune_main([path, "--target", "llvm", "--trials", "1", "--out", out]) == 0
    assert len(points()) == 12  # gate/up, down, q_proj, o_proj x 3 CPU token buckets
    entries = database.load(out)
    assert len(entries) == 4 and all(None not in e["cpu"] and len(e["cpu"]) == 3 for e in entries.values())
    with monkeypatch.context() as m:
        m.setattr(search, "SEARCH_MIN", 1)  # the evolutionary search even for one trial
        m.setattr(search, "random_points", None)  # (not called)
        assert tune_main([path, "--target", "llvm", "--trials", "2", "--out", out]) == 0  # resumes: one more each
    assert len(points()) == 24 and len(set(points())) == 24
    capsys.readouterr()
    assert tune_main([path, "--target", "llvm", "--trials", "2", "--out", out]) == 0  # nothing left to tune
    assert capsys.readouterr().out.count("already tuned") == 12 and len(points()) == 24
    assert tune_main(["--show", "--target", "llvm", "--out", out]) == 0
    table = capsys.readouterr().out
    assert table.count("| 2 / ") == 12 and "/cpu2 | 64 | 2 / " in table
    assert tune_main([path, "--target", "llvm", "--trials", "3", "--out", out]) == 0  # one more each, at random
    assert len(points()) == 36 and len(set(points())) == 36
    runs = json.loads((tmp_path / "tl" / knob_file.RUNS).read_text())
    assert [len(r["tasks"]) for r in runs] == [12, 12, 0, 12] and all(r["finished"] for r in runs)
    assert runs[0]["command"].startswith("wide-tune") and "--trials 1" in runs[0]["command"]
    assert "llvm" in runs[0]["target"]
    compiled = wide_tvm.compile(path, "llvm", tuning_log=out)
    assert f"({len(entries)} kernel knob entries)" in compiled.summary()
    lib = compiled.export(str(tmp_path / "m.so"))
    from wide_tvm.model import example_inputs

    x = example_inputs(cfg, 9)
    ref = model(x).detach().numpy()
    assert rel_err(wide_tvm.load(lib)(x.numpy()), ref) < 1e-5


def test_tuned_knobs_reach_the_kernels():
    """LowerGatedLayers turns a knob entry into kernel arguments (CPU tile; CUDA decode knobs)."""
    from wide_tvm.passes.lower_gated import _State, _tuned
    from wide_tvm.knobs import GemvKnobs
    from wide_tvm.knobs import DEFAULT_TILES

    key = kernel_spec.kernel_key("gemm_k", 112, 128, 4096, "float16")
    entries = {key: {"cpu": {"bm": 4, "bn": 16}, "decode": [[32, 2], [16, 1]]}}
    cpu = _State("llvm", {}, None, entries)
    gpu = _State("cuda", {}, None, entries)
    assert _tuned(cpu, "gemm_k", 112, 128, 4096, "float16") == {"cpu_tile": TileConfig(4, 16)}  # every bucket
    per_bucket = {key: {"cpu": [{"bm": 1, "bn": 8}, {"bm": 4, "bn": 16}, {"bm": 8, "bn": 64}]}}
    assert _tuned(_State("llvm", {}, None, per_bucket), "gemm_k", 112, 128, 4096, "float16") == {
        "cpu_tile": (TileConfig(1, 8), TileConfig(4, 16), TileConfig(8, 64))}
    # a two-bucket log (written before the 1-token bucket) gives its <= 8 knobs to 1 token as well; the
    # buckets it predates (32, 64 tokens) keep the defaults
    assert _tuned(gpu, "gemm_k", 112, 128, 4096, "float16") == {
        "decode_knobs": (GemvKnobs(32, 2), GemvKnobs(32, 2), GemvKnobs(16, 1), GemvKnobs(), GemvKnobs()),
        "tile_knobs": DEFAULT_TILES}  # a log without tile knobs: the defaults
    # a shape without an entry takes the nearest tuned shape's knobs (tuning/nearest.py), noted in the state;
    # one too far from every tuned shape keeps the defaults
    assert _tuned(gpu, "gemm_k", 112, 128, 2048, "float16") == _tuned(gpu, "gemm_k", 112, 128, 4096, "float16")
    assert gpu.derived == {kernel_spec.kernel_key("gemm_k", 112, 128, 2048, "float16"): key}
    assert _tuned(gpu, "gemm_k", 4, 128, 64, "float16") == {}
    # a hand-edited or foreign log fails with the kernel's key, not deep inside the kernel builder
    for bad in ({"tiles": [[96, 1, 3, 1]] * 3}, {"tiles": [["gemv"], [128, 0, 3, 1], [128]]}, {"decode": [["x"]]},
                {"tiles": [[128, 1, 1, 1]] * 3}):
        with pytest.raises(WideError, match=f"tuning log entry {key}: unusable knobs"):
            _tuned(_State("cuda", {}, None, {key: bad}), "gemm_k", 112, 128, 4096, "float16")


def test_wide_tune_from_gpu_sweep(tmp_path):
    sweep = {"best": {f"{w}/{b}": {"warps": 8, "unroll": 2 if b > 1 else 4, "rows": 1 + (w == "down_g128"),
                                    "summed_us": 40.0 + b, "tokens": {1: [1], 8: [4, 8], 16: [16], 32: [32],
                                                                      64: [64]}[b]}
                      for w in ("gate_up_g128", "down_g128") for b in (1, 8, 16, 32, 64)}}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    out = str(tmp_path / "cuda")
    assert tune_main(["--target", "cuda", "--from-sweep", str(tmp_path / "sweep.json"), "--out", out]) == 0
    entries = database.load(out)
    named = {"warps": 8, "unroll": 2, "rows": 1, "stages": 0, "row_warps": 1, "ksplit": 1}  # knobs by field name
    assert entries[kernel_spec.kernel_key("gemm_mn_swiglu", 112, 128, 4096, "float16")]["decode"] == [
        named | {"unroll": 4}] + [named] * 4
    down = entries[kernel_spec.kernel_key("gemm_k", 112, 128, 4096, "float16")]
    assert down["decode"] == [named | {"unroll": 4, "rows": 2}] + [named | {"rows": 2}] * 4
    assert down["timed_at_tokens"] == [[1], [4, 8], [16], [32], [64]]
    assert "tiles" not in down
    from wide_tvm.passes.lower_gated import _State, _tuned
    from wide_tvm.knobs import GEMV_TILES, GemvKnobs, SmemTile, tile_knob

    # a second sweep of the many-token kernels alone adds their picks (per bucket) to the first one's decode picks
    picks = {"tiles128": ["gemv"], "tiles512": [64, 2, 4, 2], "tiles": [128, 1, 4, 2]}
    tiles = {"best": {f"down_g128/{b}": {"knobs": "x", "tile": v, "summed_us": 900.04, "tokens": [512]}
                      for b, v in picks.items()}}
    (tmp_path / "tiles.json").write_text(json.dumps(tiles))
    assert tune_main(["--target", "cuda", "--from-sweep", str(tmp_path / "sweep.json"), str(tmp_path / "tiles.json"),
                      "--out", out]) == 0
    entries = database.load(out)
    down = entries[kernel_spec.kernel_key("gemm_k", 112, 128, 4096, "float16")]
    assert down["tiles"] == [tile_knob(v, "gemm_k").to_json() for v in picks.values()] and down["tiles_us"] == [900.0] * 3
    assert down["tiles"][1] == {"kernel": "smem", "tokens": 64, "rows": 2, "stages": 4, "prefetch": 2}
    assert _tuned(_State("cuda", {}, None, entries), "gemm_k", 112, 128, 4096, "float16") == {
        "decode_knobs": (GemvKnobs(8, 4, 2),) + (GemvKnobs(8, 2, 2),) * 4,
        "tile_knobs": (GEMV_TILES, SmemTile(64, 2, 4, 2), SmemTile(128, 1, 4, 2))}


def test_wide_tune_errors(exported, tmp_path, capsys):
    path, _, _ = exported("default", "onnx")
    assert tune_main([path, "--target", "cuda", "--out", str(tmp_path)]) == 2
    assert "run wide-tune on the GPU host" in capsys.readouterr().err
    assert tune_main(["--target", "llvm", "--out", str(tmp_path)]) == 2
    assert "give a MODEL" in capsys.readouterr().err
    assert tune_main([path, "--target", "llvm", "--trials", "0", "--out", str(tmp_path)]) == 2
    assert "--trials 0: give at least 1 trial" in capsys.readouterr().err
    assert tune_main(["--target", "cuda", "--from-sweep", "s.json", "--trials", "3", "--out", str(tmp_path)]) == 2
    assert "--from-sweep imports measurements" in capsys.readouterr().err
    assert not (tmp_path / knob_file.FILE).exists() and not (tmp_path / "database_workload.json").exists()


def test_bench_report_table_and_plot(tmp_path):
    from wide_tvm.bench import report

    rows = [{"workload": w, "tokens": m, "sparsity": 0.5, "mask": "random", "cublas_us": 40.0, "tvm_dense_us": 90.0,
             "ours_us": 30.0 * m, "reorder_us": 4.0, "speedup_vs_cublas": 40 / (30.0 * m),
             "limit_speedup_vs_cublas": 2.0, "limit_us": 20.0, "dense_limit_speedup": 2.0, "rel_err": 3e-4}
            for w in ("gate_up", "down") for m in (1, 4)]
    result = {"device": "test", "timer": "t", "limits": {"bandwidth_gbs": 4000.0, "tensor_tflops": 700.0}, "rows": rows}
    table = report.markdown(result)
    assert table.count("\n| gate_up |") == 2 and "| 1.33x |" in table
    assert "| 67% |" in table and "| 17% |" in table  # ours / roofline: 20 us of 30 us (M = 1), of 120 us (M = 4)
    png = report.plot(result, str(tmp_path / "p.png"))
    assert open(png, "rb").read(4) == b"\x89PNG"
    # an all-skipped row (sparsity 1: the kernel's fixed cost) has no limit ratios: "-", and no point in the plot
    rows.append(dict(rows[0], sparsity=1.0, limit_us=0.0, limit_speedup_vs_cublas=None, dense_limit_speedup=None))
    assert "| - | 0% | - |" in report.markdown(result, sparsity=1.0)
    assert open(report.plot(result, str(tmp_path / "q.png")), "rb").read(4) == b"\x89PNG"


def test_bench_rows_cycle_through_a_pool_of_masks(capsys):
    """wide-bench run times each row over several fresh masks: the roofline is the median draw's, by hand here."""
    from wide_tvm.bench.measure import mask_pool, pool_limit_us, used_groups
    from wide_tvm.bench.workloads import Workload
    from wide_tvm.cli import bench_main

    assert used_groups(np.array([[1, 0, 0], [0, 0, 1]], np.int32)) == 2
    w = Workload("gate_up_g128", "gemm_mn", 112, 128, 4096, swiglu=True)
    pool = mask_pool("random", 1, 112, np.random.default_rng(0), 0.5, 9)
    assert len(pool) == 9 and len({m.tobytes() for m in pool}) == 9 and all(m.shape == (1, 112) for m in pool)
    limits = {"bandwidth_gbs": 4000.0, "tensor_tflops": 700.0}
    by_hand = sorted((int(m.sum()) * 128 * 4096 * 2 * 2 + 2 * (4096 + 14336)) / 4000e3 for m in pool)[4]
    assert pool_limit_us(w, 1, pool, limits) == pytest.approx(by_hand)
    with pytest.raises(ValueError, match="draws must be >= 1"):
        mask_pool("random", 1, 112, np.random.default_rng(0), 0.5, 0)
    with pytest.raises(SystemExit):
        bench_main(["run", "build_dir", "--json", "x.json", "--draws", "0"])
    assert "--draws 0: draw at least 1 mask per row" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["run", "build_dir", "--json", "x.json", "--sparsity", "0.5", "1.5"])
    assert "--sparsity 0.5 1.5: each must be in [0, 1]" in capsys.readouterr().err


def test_bench_report_renders_a_knob_sweep(tmp_path, capsys):
    from wide_tvm.cli import bench_main

    rows = [{"workload": "down", "tokens": m, "knobs": k, "kernel_us": t, "rel_err": 3e-4}
            for m, k, t in ((1, "w16u2", 25.0), (1, "w8u4r2", 40.0), (16, "w16u2", 45.0))]
    sweep = {"rows": rows, "best": {"down/1": {"knobs": "w16u2"}, "down/16": {"knobs": "w16u2"}}}
    (tmp_path / "s.json").write_text(json.dumps(sweep))
    assert bench_main(["report", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "| down | 1 | 25.0 | 40.0 |" in out and "| down | 16 | 45.0 |  |" in out and "down/1 w16u2" in out


def test_sweep_candidates_per_bucket():
    """The candidates a sweep builds and the tuner searches: the direct kernels' up to their bound, past it the tile
    kernels' (wgmma ones only on sm_90a, and only those the shape takes: stream-K for gemm_k alone), named by the
    knobs' own names (wide_tvm/knobs.py, which the GPU host imports without TVM)."""
    from wide_tvm.bench.workloads import (K_VARIANTS, LLAMA_8B, STREAM_K_VARIANTS, TILE_VARIANTS, WGMMA_VARIANTS,
                                          swept_variants, tile_name, variant_name, variants, wgmma_fits)

    down = next(w for w in LLAMA_8B if w.kind == "gemm_k")
    assert variants(down, 64) == K_VARIANTS  # the direct kernels; past them the tile kernels (wgmma on sm_90a)
    on_grid = tuple(v for v in WGMMA_VARIANTS if len(v) < 7)
    assert set(STREAM_K_VARIANTS) <= set(WGMMA_VARIANTS)
    assert variants(down, 65) == TILE_VARIANTS + on_grid + STREAM_K_VARIANTS
    assert variants(down, 65, False) == TILE_VARIANTS
    for w in LLAMA_8B:
        assert all(wgmma_fits(w, v) == (w.kind == "gemm_k") for v in STREAM_K_VARIANTS), w.name
        ordered = [v for v in WGMMA_VARIANTS if len(v) > 10 and v[10]]  # (the positional form's order field)
        assert all(wgmma_fits(w, v) == (w.kind == "gemm_k" and w.groups <= 8) for v in ordered), w.name
    assert variant_name(down, 512, TILE_VARIANTS[1]) == "t128r1s3p1" and tile_name(down, TILE_VARIANTS[0]) == "gemv64"
    assert variant_name(down, 16, K_VARIANTS[4]) == "w8u2r2"
    # what a `--sweep tiles` / `--sweep wgmma` build holds: nothing for the direct kernels' token counts
    assert swept_variants(down, 64, True, "tiles") == () == swept_variants(down, 64, True, "wgmma")
    assert swept_variants(down, 64, True, "all") == K_VARIANTS
    assert swept_variants(down, 65, True, "wgmma") == on_grid + STREAM_K_VARIANTS  # every gemm_k wgmma candidate
    assert swept_variants(down, 65, False, "wgmma") == ()  # a target without wgmma: nothing to sweep
    assert swept_variants(down, 65, True, "tiles") == variants(down, 65)


def test_a_stopped_run_stays_on_record_as_unfinished(tmp_path, monkeypatch):
    """wide-tune records its run before measuring: a run stopped half way (here: interrupted) is listed with the
    tasks it set out to tune and finished: false; its records, if any, are already in the database."""
    from wide_tvm.tuning import search
    from wide_tvm.tuning.driver import tune

    def stopped(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "tune_tasks", stopped)
    with pytest.raises(KeyboardInterrupt):
        tune(None, "llvm", str(tmp_path), llama8b=True, trials=3, only="cpu0")
    (run,) = json.loads((tmp_path / knob_file.RUNS).read_text())
    assert run["finished"] is False and "--trials 3" in run["command"]
    assert run["tasks"] == [f"{kind}/g112x128/d4096/{dt}/cpu0" for dt in ("float32", "float16", "bfloat16")
                            for kind in ("gemm_mn_swiglu", "gemm_k")]


def test_an_untuned_shape_takes_the_nearest_tuned_shapes_knobs():
    from wide_tvm.tuning.nearest import nearest, parse_key

    entries = {"gemm_k/g112x128/d4096/float16": {}, "gemm_k/g448x32/d4096/float16": {},
               "gemm_mn_swiglu/g112x128/d4096/float16": {}, "gemm_k/g112x128/d2048/float16": {},
               "gemm_k/g112x128/d4096/float32": {}}
    assert parse_key("gemm_k/g148x128/d3584/float16") == ("gemm_k", 148, 128, 3584, "float16")
    assert parse_key("not a key") is None
    # same kind, group size and dtype; the nearest K / N on a log scale
    assert nearest(entries, "gemm_k/g148x128/d3584/float16") == "gemm_k/g112x128/d4096/float16"
    assert nearest(entries, "gemm_k/g112x128/d2500/float16") == "gemm_k/g112x128/d2048/float16"
    assert nearest(entries, "gemm_k/g112x128/d5120/float32") == "gemm_k/g112x128/d4096/float32"
    assert nearest(entries, "gemm_mn_swiglu/g148x128/d3584/float16") == "gemm_mn_swiglu/g112x128/d4096/float16"
    assert nearest(entries, "gemm_k/g8x512/d4096/float16") is None  # no tuned shape with groups of 512
    assert nearest(entries, "gemm_mn/g112x128/d4096/float16") is None  # another kind
    assert nearest(entries, "gemm_k/g4x128/d64/float16") is None  # too far from every tuned shape


def test_the_lowering_gives_an_untuned_kernel_the_nearest_knobs(tmp_path):
    """A CUDA plan of an FFN whose shape no database holds takes the tuned groups-of-128 knobs (plan only)."""
    from wide_tvm.frontends.export import export_model
    from wide_tvm.frontends.loader import import_model
    from wide_tvm.model import WideConfig, build_example, example_inputs
    from wide_tvm.passes import LowerGatedLayers
    from wide_tvm.targets import parse_target
    from wide_tvm.tuning.database import load
    from wide_tvm.tuning.folders import shipped_root

    cfg = WideConfig(vocab_size=64, hidden_size=1024, intermediate_size=7168, ffn_group_size=128, num_layers=1,
                     num_heads=8, num_kv_heads=2, head_dim=128, attn_group_size=4)
    path = str(tmp_path / "m.onnx")
    export_model(build_example(cfg).half(), example_inputs(cfg), path)
    tgt = parse_target("cuda")
    lower = LowerGatedLayers("cuda", knobs=load(str(shipped_root() / "cuda-sm90")), wgmma=True, build=False)
    with tgt:
        lower(import_model(path).mod)
    assert lower.plan.derived == {"gemm_mn_swiglu/g56x128/d1024/float16": "gemm_mn_swiglu/g112x128/d4096/float16",
                                  "gemm_k/g56x128/d1024/float16": "gemm_k/g112x128/d4096/float16",
                                  # Q / O: 2 groups of 4 heads x 128 from Llama's 8 groups of 512 channels
                                  "gemm_mn/g2x512/d1024/float16": "gemm_mn/g8x512/d4096/float16",
                                  "gemm_k/g2x512/d1024/float16": "gemm_k/g8x512/d4096/float16"}
    # a tiny model is too far from any tuned shape to borrow its knobs (tuning/nearest.py: MAX_DISTANCE)
    from wide_tvm.tuning.nearest import nearest

    assert nearest(load(str(shipped_root() / "cuda-sm90")), "gemm_k/g4x128/d256/float16") is None
