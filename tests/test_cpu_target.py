"""The CPU target: code for this machine's CPU (not TVM's generic x86-64), a named CPU checked, and TVM's thread
pool on every physical core."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm

from wide_tvm import cpu_threads
from wide_tvm.errors import WideError
from wide_tvm.targets import host_cpu, parse_target


def _vector_add():
    from tvm.script import tirx as T

    @T.prim_func
    def add(a: T.Buffer((256,), "float32"), b: T.Buffer((256,), "float32")):
        for i0 in range(16):
            for i in T.vectorized(16):
                b[i0 * 16 + i] = a[i0 * 16 + i] * T.float32(3) + b[i0 * 16 + i]

    return add


def test_llvm_is_this_cpu_and_llvm_cpu_names_another():
    assert parse_target("llvm").attrs["mcpu"] == host_cpu()
    assert parse_target("llvm:x86-64-v3").attrs["mcpu"] == "x86-64-v3"
    with pytest.raises(WideError, match="unknown CPU 'banana'.*llvm:banana"):
        parse_target("llvm:banana")


def test_the_named_cpu_decides_the_vector_code():
    """llvm:generic is TVM's former code (SSE2, no FMA); x86-64-v3 (any AVX2 machine) gets ymm and FMA. Both run
    here (where this CPU has AVX2) and agree."""
    asm = {}
    a = np.arange(256, dtype="float32")
    flags = set(next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")),
                     []))
    for cpu in ("generic", "x86-64-v3"):
        lib = tvm.compile(_vector_add(), target=parse_target(f"llvm:{cpu}"))
        asm[cpu] = lib.mod.inspect_source("asm")
        if cpu != "generic" and not {"avx2", "fma"} <= flags:
            continue  # not runnable on this machine
        b = tvm.runtime.tensor(np.ones(256, "float32"))
        lib["add"](tvm.runtime.tensor(a), b)
        np.testing.assert_allclose(b.numpy(), a * 3 + 1)
    assert "ymm" not in asm["generic"] and "vfmadd" not in asm["generic"]
    assert "ymm" in asm["x86-64-v3"] and "vfmadd" in asm["x86-64-v3"]


def test_thread_pool_runs_one_thread_per_physical_core(monkeypatch):
    """use_physical_cores (called by wide_tvm.compile / load and the tools before TVM's pool starts) sets
    TVM_NUM_THREADS to the physical cores unless the user set it (or OMP_NUM_THREADS); TVM's own default would be half
    the logical CPUs on x86."""
    n = cpu_threads.physical_cores()
    assert 1 <= n <= (os.cpu_count() or 1)
    if os.environ.get("TVM_NUM_THREADS") == str(n):  # set by wide_tvm (the user left it unset)
        assert tvm.get_global_func("runtime.NumThreads")() == n
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    cpu_threads.use_physical_cores()
    assert os.environ["TVM_NUM_THREADS"] == "3"  # the user's setting stays
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cpu_threads.use_physical_cores()
    assert "TVM_NUM_THREADS" not in os.environ  # TVM reads OMP_NUM_THREADS itself
    monkeypatch.delenv("OMP_NUM_THREADS")
    cpu_threads.use_physical_cores()
    assert os.environ["TVM_NUM_THREADS"] == str(n)


def test_smt_siblings_count_once(monkeypatch, tmp_path):
    """Two logical CPUs that are one core's hyper-threads count as one core; a CPU without topology as itself."""
    real_open = open

    def fake_open(path, *args, **kwargs):
        if str(path).endswith("topology/thread_siblings_list"):
            cpu = int(str(path).split("/cpu")[-1].split("/")[0])
            if cpu == 3:
                raise OSError("no topology")
            return real_open(tmp_path / ("a" if cpu in (0, 1) else "b"), *args, **kwargs)
        return real_open(path, *args, **kwargs)

    (tmp_path / "a").write_text("0-1\n")
    (tmp_path / "b").write_text("2\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr("builtins.open", fake_open)
    assert cpu_threads.physical_cores() == 3  # {0, 1} one core, 2, and 3 (no topology)


def test_cpu_bench_times_its_calls_in_turns_on_rotating_weights():
    """wide-bench cpu's timer calls the kernels it compares in turns (warm-up calls untimed), so a drift of the
    machine's memory rate reaches every column alike, one median per label; consecutive calls take different
    argument sets (weight copies) and so do two calls of one label, and the copies fill four times the cache."""
    from wide_tvm.bench.cpu import time_call, time_interleaved, weight_copies

    seen = []
    sets = [[0], [1], [2]]
    times = time_interleaved({label: (lambda i, label=label: seen.append((label, i)), sets)
                              for label in ("torch", "sparse", "dense")}, reps=3, warmup=1)
    assert [label for label, _ in seen] == ["torch", "sparse", "dense"] * 4
    copies = [i for _, i in seen]
    assert copies == [0, 1, 2] * 4 and all(a != b for a, b in zip(copies, copies[1:]))
    assert sorted(times) == ["dense", "sparse", "torch"] and all(t >= 0 for t in times.values())
    used = []
    time_call(used.append, [[0], [1]], reps=3)
    assert used == [0, 1, 0, 1]
    assert weight_copies(100 << 20, 480 << 20) == 20 and weight_copies(4 << 30, 32 << 20) == 2


def test_cpu_bench_and_tuning_cover_fp32_fp16_and_bf16():
    """wide-bench cpu and `wide-tune --llama8b --target llvm` take the FFN kernels in each dtype a model ships
    (fp16 / bf16 weights halve what a memory-bound kernel reads), named apart; an unknown dtype is refused by name."""
    from wide_tvm.bench.cpu import cpu_workloads
    from wide_tvm.tuning.driver import bench_kernels

    ws = cpu_workloads()
    assert [(w.name, w.dtype) for w in ws] == [
        ("gate_up_g128", "float32"), ("down_g128", "float32"), ("gate_up_g128_fp16", "float16"),
        ("down_g128_fp16", "float16"), ("gate_up_g128_bf16", "bfloat16"), ("down_g128_bf16", "bfloat16")]
    keys = [s.key for s in bench_kernels("llvm")]
    assert keys == [f"{k}/g112x128/d4096/{dt}" for dt in ("float32", "float16", "bfloat16")
                    for k in ("gemm_mn_swiglu", "gemm_k")]
    with pytest.raises(WideError, match="float64"):
        cpu_workloads(("float32", "float64"))


def test_committed_cpu_database_picks_every_benchmark_kernel():
    """tuning_logs/llvm holds a current pick (records of today's kernel code) for every token bucket of every
    kernel `wide-tune --llama8b --target llvm` tunes: an edit of the CPU kernels that was not re-tuned or
    re-stamped fails here instead of silently compiling default tiles."""
    import warnings

    from wide_tvm.tuning import database
    from wide_tvm.schedules.tiles import CPU_BUCKETS
    from wide_tvm.tuning.driver import bench_kernels

    folder = os.path.join(os.path.dirname(__file__), "..", "tuning_logs", "llvm")
    with warnings.catch_warnings():
        warnings.simplefilter("error", database.StaleTuningWarning)
        picks = database.load(folder)
    for spec in bench_kernels("llvm"):
        tiles = picks.get(spec.key, {}).get("cpu", [])
        assert len(tiles) == len(CPU_BUCKETS) + 1 and all(tiles), (spec.key, tiles)


def test_cpu_bench_report_renders_its_rows_and_plot(tmp_path):
    """`wide-bench report` on a `wide-bench cpu` JSON: one Markdown row per workload and count (the bucket's tile,
    ratios from the row's times), and a plot with one panel per dtype."""
    from wide_tvm.cli import bench_main
    import json

    tiles = [{"bm": 1, "bn": 4}, {"bm": 2, "bn": 4}, {"bm": 3, "bn": 4}]
    rows = [{"workload": f"gate_up_g128{sfx}", "dtype": dt, "tokens": m, "torch_us": 2000.0 * m, "tvm_dense_us": 9e5,
             "ours_us": 1000.0 * m, "ours_all_active_us": 1800.0 * m, "speedup_vs_same_kernel_dense": 1.8,
             "speedup_vs_torch": 2.0, "limit_us": 500.0 * m, "limit_speedup_vs_torch": 4.0, "tile": tiles,
             "weight_copies": 5} for dt, sfx in (("float32", ""), ("bfloat16", "_bf16")) for m in (1, 16, 64)]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"device": "CPU (this machine)", "target": "llvm", "cpu": "test CPU",
                                "limits": {"bandwidth_gbs": 20.0, "tensor_tflops": 0.3}, "rows": rows}))
    from wide_tvm.bench import report

    table = report.cpu_markdown(report.load(str(path)))
    assert "| gate_up_g128_bf16 | 16 | 32.0 | 900 | **16.00** | 28.80 | 1.80x | 2.00x | 8.0 | 50% | 2 x 4 | 5 |" in table
    assert "| gate_up_g128 | 64 |" in table and "| 3 x 4 |" in table and len(table.splitlines()) == 4 + 6
    png = tmp_path / "cpu.png"
    assert bench_main(["report", str(path), "--plot", str(png)]) == 0 and png.stat().st_size > 10_000


def test_importing_the_package_changes_nothing():
    """Importing wide_tvm (and its compile driver, runtime and pure-data modules) sets no environment variable, loads
    no stand-in CUDA driver and imports no TVM: compile() / load() and the tools install those when called."""
    import subprocess
    import sys

    code = ("import os, sys; import wide_tvm, wide_tvm.compiler, wide_tvm.runtime, wide_tvm.kernel_spec, wide_tvm.knobs, "
            "wide_tvm.bench.workloads; "
            "assert 'TVM_NUM_THREADS' not in os.environ and 'TVM_CUDA_COMPILE_MODE' not in os.environ, os.environ; "
            "assert 'tvm' not in sys.modules, 'tvm imported'; "
            "assert 'libcuda' not in open('/proc/self/maps').read(), 'a CUDA driver loaded'")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_CUDA_COMPILE_MODE")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
