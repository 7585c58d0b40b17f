"""The dense fallback: the decision (wide_tvm/fallback.py), its measured crossovers (wide-tune --crossover), the
kernel that holds both paths (schedules/dense_fallback.py) and whole models compiled with it, on the CPU."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import wide_tvm
from wide_tvm.errors import WideError
from wide_tvm.fallback import covers, decide, describe, merge, model_ranges, ranges_from_points
from wide_tvm.kernel_reference import make_mask, ref_gemm_k, ref_gemm_mn, ref_mask_reorder, rel_err
from wide_tvm.tuning.crossover import import_runs, points_from_run

from conftest import assert_matches_model, module_sources


def test_measured_points_decide_the_counts_nearest_them():
    pts = [(1, 10, 17), (16, 40, 38), (256, 300, 250), (4096, 2400, 2600)]  # the module's worked example
    assert ranges_from_points(pts) == ((5, 1024),)
    assert ranges_from_points([(1, 5, 6), (64, 9, 8)]) == ((9, None),)  # sqrt(64) = 8 still takes the 1-token point
    assert ranges_from_points([(1, 5, 4)]) == ((1, None),)
    assert ranges_from_points([(4, 5, 6), (8, 5, 6)]) == ()
    assert merge([(1, 3), (4, 9), (20, None), (12, 15)]) == ((1, 9), (12, 15), (20, None))
    assert describe(((5, 1024), (2048, None))) == "5-1024, 2048+" and describe(()) == "never"


def test_the_cost_model_falls_back_where_the_kernels_do_dense_work():
    # CUDA: once ~95 % of groups are used (5 tokens at 50 %) the direct kernels stream nearly everything; gemm_k's
    # many-token tiles use every group, gemm_mn's skip per token (half the work at 50 %) and stay gated; gate/up's
    # fallback pays its SwiGLU pass on top of the GEMM, which the gated kernel never loses
    assert model_ranges("gemm_k", "cuda") == ((5, None),)
    assert model_ranges("gemm_mn", "cuda") == ((5, 16),)
    assert model_ranges("gemm_mn_swiglu", "cuda") == ()
    assert model_ranges("gemm_k", "llvm") == () == model_ranges("gemm_mn", "llvm")  # the CPU kernels beat OpenBLAS


def test_decide_takes_measurements_then_the_nearest_shape_then_the_model():
    key = "gemm_k/g112x128/d4096/float16"
    crossovers = {key: {"points": [[1, 10, 20], [64, 50, 40]]}}
    assert decide(key, "gemm_k", "cuda", "auto", crossovers) == (((9, None),), "measured")
    near = "gemm_k/g148x128/d3584/float16"  # Qwen2.5-7B's down: Llama's points, where they win clearly
    assert decide(near, "gemm_k", "cuda", "auto", crossovers) == (((9, None),), f"measured for {key}")
    close = {key: {"points": [[1, 10, 20], [64, 50, 48]]}}  # a 4 % win: Llama's own, no other shape's
    assert decide(key, "gemm_k", "cuda", "auto", close)[0] == ((9, None),)
    assert decide(near, "gemm_k", "cuda", "auto", close)[0] == ()
    far = "gemm_k/g4x16/d64/float16"
    assert decide(far, "gemm_k", "cuda", "auto", crossovers) == (((5, None),), "cost model")
    assert decide(key, "gemm_k", "cuda", "off", crossovers) == ((), "off")
    assert decide(key, "gemm_k", "cuda", "always", crossovers) == (((1, None),), "always")
    with pytest.raises(ValueError, match="sometimes"):
        decide(key, "gemm_k", "cuda", "sometimes", crossovers)


def _run(rows):
    return {"device": "test GPU", "rows": rows}


def _row(key, tokens, ours, fallback, sparsity=0.5, mask="random"):
    return {"key": key, "tokens": tokens, "ours_us": ours, "fallback_us": fallback, "sparsity": sparsity,
            "mask": mask}


def test_crossovers_import_from_a_benchmark_run(tmp_path):
    key = "gemm_mn_swiglu/g112x128/d4096/float16"
    run = _run([_row(key, 16, 40.0, 38.0), _row(key, 1, 10.0, 17.0), _row(key, 16, 1.0, 2.0, mask="skewed"),
                _row(key, 16, 1.0, 2.0, sparsity=0.25), {"key": key, "tokens": 4, "ours_us": 3.0}])
    assert points_from_run(run) == {key: [[1, 10.0, 17.0], [16, 40.0, 38.0]]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    written, count = import_runs(str(tmp_path / "db"), [str(path)])
    entry = json.loads(open(written).read())["kernels"][key]
    assert count == 1 and entry["points"] == [[1, 10.0, 17.0], [16, 40.0, 38.0]] and entry["device"] == "test GPU"
    (tmp_path / "empty.json").write_text(json.dumps(_run([])))
    with pytest.raises(ValueError, match="fallback_us"):
        import_runs(str(tmp_path / "db"), [str(tmp_path / "empty.json")])


def test_wide_tune_crossover_is_one_clear_error_for_a_run_without_both_paths(tmp_path, capsys):
    from wide_tvm.cli import tune_main

    (tmp_path / "old.json").write_text(json.dumps(_run([{"key": "k", "tokens": 1, "ours_us": 1.0, "sparsity": 0.5,
                                                         "mask": "random"}])))
    assert tune_main(["--target", "cuda", "--out", str(tmp_path / "db"), "--crossover",
                      str(tmp_path / "old.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "fallback_us" in err


# -- the kernel with both paths, built for the CPU (OpenBLAS) -------------------------------------------------------

G, GS, K, N = 4, 16, 64, 48
RANGES = ((3, 8),)  # the fallback at 3-8 tokens, the gated kernel at 1-2 and 9+


@pytest.fixture(scope="module")
def fallback_kernels(tmp_path_factory):
    """Callable name -> packed function of one library holding gated kernels and their fallbacks (RANGES)."""
    from wide_tvm.compiler import prepare_builds

    prepare_builds()
    import tvm

    from wide_tvm.blas import libraries
    from wide_tvm.blas.extern import extern_for
    from wide_tvm.schedules import gemm_k, gemm_mn
    from wide_tvm.schedules.dense_fallback import BLAS_HELPER, blas_helper, with_dense_fallback
    from wide_tvm.schedules.root_block import with_root_block
    from wide_tvm.weight_layout import stored_shape

    kp = stored_shape("kp", N, G * GS)
    funcs = {BLAS_HELPER: blas_helper("float32", "llvm"),
             "mn": gemm_mn(G, GS, K, "float32", "nk", True, "llvm"),
             **with_dense_fallback("mn_fb", "mn", "gemm_mn_swiglu", G, GS, K, "float32", (G * GS, K), "nk", "llvm",
                                   RANGES),
             "q": gemm_mn(G, GS, K, "float32", "nk", False, "llvm"),
             **with_dense_fallback("q_fb", "q", "gemm_mn", G, GS, K, "float32", (G * GS, K), "nk", "llvm", RANGES,
                                   masked_output=False),
             "k": gemm_k(G, GS, N, "float32", "kp", "llvm"),
             **with_dense_fallback("k_fb", "k", "gemm_k", G, GS, N, "float32", kp, "nk", "llvm", RANGES),
             **with_dense_fallback("k_fb_in", "k", "gemm_k", G, GS, N, "float32", kp, "kn", "llvm", RANGES,
                                   masked_input=True)}
    mod = tvm.IRModule({name: with_root_block(f).with_attr("global_symbol", name) for name, f in funcs.items()})
    extern = extern_for("llvm")
    path = str(tmp_path_factory.mktemp("fallback") / "kernels.so")
    with tvm.target.Target("llvm"):
        tvm.compile(mod, "llvm").export_library(path, options=[str(extern.object_path), *extern.link_options()])
    libraries.load([libraries.OPENBLAS.name])
    lib = tvm.runtime.load_module(path)
    return lambda name: lib[name]


@pytest.mark.parametrize("tokens", [1, 3, 5, 8, 9])
@pytest.mark.parametrize("kind", ["random", "all_active", "all_skipped", "skewed"])
def test_both_paths_compute_the_gated_kernel(fallback_kernels, tokens, kind):
    import tvm

    from wide_tvm.weight_layout import pack

    rng = np.random.default_rng(tokens * 7 + len(kind))
    t_ = tvm.runtime.tensor
    x = rng.standard_normal((tokens, K)).astype("float32")
    wg, wu = (rng.standard_normal((G * GS, K)).astype("float32") for _ in range(2))
    mask = make_mask(kind, tokens, G, rng)
    reorder = [t_(v) for v in ref_mask_reorder(mask)]
    out = t_(np.zeros((tokens, G * GS), "float32"))
    fallback_kernels("mn_fb")(t_(x), t_(wg), t_(wu), t_(mask), *reorder, t_(wg), t_(wu), out)
    assert rel_err(out.numpy(), ref_gemm_mn(x, wg, wu, mask, GS, "nk", True)) < 1e-5
    fallback_kernels("q_fb")(t_(x), t_(wg), t_(wg), t_(mask), *reorder, t_(wg), t_(wg), out)
    active = np.repeat(mask, GS, axis=1) != 0  # (Q's fallback leaves skipped head groups as they come)
    ref = ref_gemm_mn(x, wg, wg, mask, GS, "nk", False)
    assert rel_err(np.where(active, out.numpy(), 0), ref) < 1e-5
    a = rng.standard_normal((tokens, G * GS)).astype("float32")
    w = rng.standard_normal((N, G * GS)).astype("float32")
    out = t_(np.zeros((tokens, N), "float32"))
    fallback_kernels("k_fb")(t_(a), t_(pack(w, "kp")), t_(mask), *reorder, t_(w), out)
    assert rel_err(out.numpy(), ref_gemm_k(a, w, mask, GS, "nk")) < 1e-5
    masked = np.where(active, a, 0).astype("float32")  # as a gemm_mn of the same mask writes it
    fallback_kernels("k_fb_in")(t_(masked), t_(pack(w, "kp")), t_(mask), *reorder, t_(np.ascontiguousarray(w.T)),
                                out)
    assert rel_err(out.numpy(), ref_gemm_k(a, w, mask, GS, "nk")) < 1e-5


@pytest.mark.parametrize("tokens", [2, 3, 8, 9])
def test_the_token_ranges_pick_the_path(fallback_kernels, tokens):
    """A fallback told its input is masked does not mask it: fed an unmasked input it gives a @ W in its ranges,
    while the gated kernel outside them still skips the groups."""
    import tvm

    from wide_tvm.weight_layout import pack

    rng = np.random.default_rng(tokens)
    t_ = tvm.runtime.tensor
    mask = make_mask("random", tokens, G, rng)
    mask[0, 0], mask[0, 1] = 0, 1
    a = rng.standard_normal((tokens, G * GS)).astype("float32")
    w = rng.standard_normal((N, G * GS)).astype("float32")
    out = t_(np.zeros((tokens, N), "float32"))
    fallback_kernels("k_fb_in")(t_(a), t_(pack(w, "kp")), t_(mask), *[t_(v) for v in ref_mask_reorder(mask)],
                                t_(np.ascontiguousarray(w.T)), out)
    dense = covers(RANGES, tokens)
    ref = a.astype(np.float64) @ w.T.astype(np.float64) if dense else ref_gemm_k(a, w, mask, GS, "nk")
    assert rel_err(out.numpy(), ref) < 1e-5


# -- whole models -------------------------------------------------------------------------------------------------

def test_a_model_on_its_dense_fallbacks_equals_pytorch(exported, tmp_path):
    path, model, cfg = exported("default", "onnx")
    compiled = wide_tvm.compile(path, "llvm", fallback="always")
    kernels = {s.symbol for layer in compiled.layers for s in layer.specs}
    assert set(compiled.fallbacks) == kernels and all(r == ((1, None),) for r, _ in compiled.fallbacks.values())
    # the CPU gemm_k reads its weights in 16-column panels, so the fallback keeps the stored [N, K] array too
    copies = [n for n in compiled.model.weight_names if n.endswith(".kp")]
    assert copies and all(n[:-3] in compiled.model.weight_names for n in copies)
    assert "dense fallback" in compiled.summary()
    # o_proj's fallback reads its input masked inside the attention's transpose (passes/head_mask.py), so it runs
    # no masking pass of its own; the FFN's down reads gate/up's masked output
    o_proj = [layer.kernels[1] for layer in compiled.layers if layer.kind == "attention"]
    assert o_proj and all(name.endswith("_dense_in") for name in o_proj)
    assert re.search(r"fused_transpose\w*_wide_head_mask", module_sources(compiled.executable))
    runner = wide_tvm.load(compiled.export(str(tmp_path / "m.so")))
    assert set(runner.meta["dense_fallback"]) == kernels
    assert_matches_model(runner, model, cfg)


def test_measured_crossovers_reach_the_compiled_model(exported, tmp_path):
    """wide-tune --crossover's file in a tuning folder decides a compile's ranges ("auto"); without one the CPU cost
    model keeps every kernel gated, and "off" adds nothing."""
    from wide_tvm.cli import tune_main

    path, model, cfg = exported("default", "onnx")
    plain = wide_tvm.compile(path, "llvm")
    assert plain.fallbacks == {} and not any(n.endswith(".kp") for n in plain.model.weight_names)
    keys = {s.key for layer in plain.layers for s in layer.specs}
    rows = [_row(key, t, ours, fb) for key in keys for t, ours, fb in ((1, 1.0, 2.0), (16, 3.0, 2.0))]
    (tmp_path / "run.json").write_text(json.dumps(_run(rows)))
    folder = tmp_path / "llvm"
    assert tune_main(["--out", str(folder), "--crossover", str(tmp_path / "run.json")]) == 0
    tuned = wide_tvm.compile(path, "llvm", tuning_log=str(folder))
    assert {v for v in tuned.fallbacks.values()} == {(((5, None),), "measured")}
    assert len(tuned.fallbacks) == len(keys)
    assert_matches_model(wide_tvm.load(tuned.export(str(tmp_path / "m.so"))), model, cfg, (2, 9))  # both paths
    assert wide_tvm.compile(path, "llvm", tuning_log=str(folder), fallback="off").fallbacks == {}


def test_an_unknown_fallback_mode_is_one_clear_error(exported, tmp_path, capsys):
    from wide_tvm.cli import compile_main

    path, _, _ = exported("dense", "onnx")
    with pytest.raises(WideError, match="sometimes"):
        wide_tvm.compile(path, "llvm", fallback="sometimes")
    with pytest.raises(SystemExit) as exit_info:
        compile_main([path, "--fallback", "sometimes", "-o", str(tmp_path / "m.so")])
    assert exit_info.value.code == 2 and not (tmp_path / "m.so").exists()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_dense_paths_move_16_bytes_a_thread():
    """The CUDA dense path's elementwise pass (SwiGLU x mask, or an input's mask) loads and stores 16 bytes a
    thread where a group is a multiple of 8 halves, and falls back to one element a thread where it is not."""
    from wide_tvm.compiler import prepare_builds
    from wide_tvm.cuda_aot import cuda_codegen

    prepare_builds()
    cuda_codegen()
    import tvm

    from wide_tvm.schedules.dense_fallback import BLAS_HELPER, blas_helper, with_dense_fallback
    from wide_tvm.schedules.root_block import with_root_block
    from wide_tvm.targets import parse_target
    funcs = {BLAS_HELPER: blas_helper("float16", "cuda")}
    for name, kind, gs, masked in (("mn", "gemm_mn_swiglu", 32, False), ("k", "gemm_k", 32, False),
                                   ("mn4", "gemm_mn_swiglu", 4, False)):
        groups = 64 // gs
        shape = (groups * gs, 64)
        funcs[name + "_blas"] = with_dense_fallback(name, name, kind, groups, gs, 64, "float16", shape, "nk", "cuda",
                                                    RANGES, masked)[name + "_blas"]
    mod = tvm.IRModule({n: with_root_block(f).with_attr("global_symbol", n) for n, f in funcs.items()})
    target = parse_target("cuda")
    with target:
        source = module_sources(tvm.compile(mod, target))
    kernels = {m.group(1): source[m.end():source.find("\n}\n", m.end())]
               for m in re.finditer(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\([^)]*\) \{', source)}
    assert set(kernels) == {"mn_blas_kernel", "k_blas_kernel", "mn4_blas_kernel"}, set(kernels)
    moves = {name: [ln for ln in body.splitlines() if "*(uint4*)" in ln] for name, body in kernels.items()}
    assert len(moves["mn_blas_kernel"]) == 3  # gate and up loaded, the product stored: 16 bytes each
    assert len(moves["k_blas_kernel"]) == 2
    assert "uint4" not in kernels["mn4_blas_kernel"]
