"""The end-to-end benchmark's model (wide_tvm/bench/e2e_model.py): one layer's module exported N times and imported
with placeholder weights compiles to the model of N layers exported whole, with no weight memory."""

from __future__ import annotations

import pytest

import wide_tvm
from wide_tvm.model import WideConfig, build_example, example_inputs


@pytest.mark.slow
def test_the_benchmark_model_compiles_as_the_whole_model_without_weight_memory():
    from wide_tvm.bench.e2e_model import import_for_benchmark
    from wide_tvm.frontends.export import export_program

    cfg = WideConfig(num_layers=3)
    bench = import_for_benchmark(cfg, "float32")
    assert all(not any(w.strides) for w in bench.weights)  # (zero-stride placeholders)
    whole = export_program(build_example(cfg, seed=7).eval(), example_inputs(cfg, 8))
    got, want = wide_tvm.compile(bench, "llvm"), wide_tvm.compile(whole, "llvm")
    assert got.model.weight_names == want.model.weight_names
    assert [w.shape for w in got.model.weights] == [w.shape for w in want.model.weights]
    assert all(not any(w.strides) for w in got.model.weights)  # (through the repacking too)
    assert len(got.layers) == len(want.layers) == 2 * cfg.num_layers


@pytest.mark.slow
def test_the_end_to_end_benchmark_runs_every_row_on_the_cpu(tmp_path):
    """wide-bench e2e-build / e2e / report, their whole flow on a tiny model on the CPU (the GPU runs the same)."""
    import json

    from wide_tvm.bench.e2e import build_e2e, run_e2e
    from wide_tvm.bench.e2e_report import markdown, plot

    build_e2e(str(tmp_path), target="llvm", max_batch=4, name="tiny")
    out = str(tmp_path / "e2e_result.json")
    rows = ("ours_gated", "ours_gated@0.25", "ours_dense", "torch_eager")
    result = run_e2e(str(tmp_path), out, rows=rows, prompts=(8, 24), batches=(1, 3), contexts=(16,), steps=4,
                     timeout=600)
    assert result["errors"] == {} and set(result["rows"]) == set(rows)
    for row in result["rows"].values():
        assert all(row["ttft_ms"][str(p)] > 0 for p in (8, 24))
        assert all(row["decode_tok_s"]["16"][str(b)] > 0 for b in (1, 3))
    for name in ("ours_gated", "ours_gated@0.25", "ours_dense"):  # (the PyTorch WIDE model's weights: the same model)
        assert result["rows"][name]["main_vs_torch"] < 1e-4, name
    assert abs(result["rows"]["ours_gated"]["active_share"] - 0.5) < 0.1
    assert abs(result["rows"]["ours_gated@0.25"]["active_share"] - 0.25) < 0.1
    assert json.load(open(out))["kind"] == "e2e"
    table = markdown(result)
    assert "| 16, 3 |" in table and "ours, gated (25% active)" in table
    assert plot(result, str(tmp_path / "e2e.png")).endswith(".png")
