"""Turn wide-bench JSON into a Markdown table (docs/performance.md) and a speedup plot."""

from __future__ import annotations

import json


def auto_us(row: dict, crossovers: dict) -> float:
    """The time of the path a compiled model runs for `row` (a gated benchmark row timing both): the dense fallback
    where wide_tvm/fallback.py's decision from `crossovers` (the tuning folders' measured points) takes it, else the
    gated kernel."""
    from ..fallback import covers, decide
    from ..tuning.nearest import parse_key

    if "fallback_us" not in row:
        return row["ours_us"]
    ranges, _ = decide(row["key"], parse_key(row["key"])[0], "cuda", "auto", crossovers)
    return row["fallback_us"] if covers(ranges, row["tokens"]) else row["ours_us"]


def markdown(result: dict, sparsity: float = 0.5, mask: str = "random", crossovers: dict | None = None) -> str:
    """One row per workload and token count at `sparsity`: every column the issue asks for, side by side; where the
    run timed the dense fallback too, its time and the path a compiled model picks (`auto_us` with `crossovers`)."""
    if any("fallback_us" in r for r in result["rows"]):
        return _fallback_markdown(result, sparsity, mask, crossovers or {})
    lim = result["limits"]
    lines = [f"Device: {result['device']}; timer: {result['timer']}; measured DRAM bandwidth "
             f"{lim['bandwidth_gbs']:.0f} GB/s, dense fp16 tensor cores {lim['tensor_tflops']:.0f} TFLOP/s. "
             f"Sparsity {sparsity}, {mask} masks. Times in microseconds; ours = mask reorder + kernel, timed together "
             f"(the reorder alone in parentheses).", "",
             "| workload | M | cuBLAS dense | TVM dense | ours (reorder) | ours vs cuBLAS | roofline limit vs cuBLAS "
             "| ours / roofline | 1/(1-s) | rel err |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        if r["sparsity"] != sparsity or r["mask"] != mask:
            continue
        lines.append(f"| {r['workload']} | {r['tokens']} | {r['cublas_us']:.1f} | {r['tvm_dense_us']:.1f} | "
                     f"{r['ours_us']:.1f} ({r['reorder_us']:.1f}) | {r['speedup_vs_cublas']:.2f}x | "
                     f"{times(r['limit_speedup_vs_cublas'])} | {r['limit_us'] / r['ours_us']:.0%} | "
                     f"{times(r['dense_limit_speedup'])} | {r['rel_err']:.1e} |")
    return "\n".join(lines)


def _fallback_markdown(result: dict, sparsity: float, mask: str, crossovers: dict) -> str:
    lim = result["limits"]
    lines = [f"Device: {result['device']}; timer: {result['timer']}; measured DRAM bandwidth "
             f"{lim['bandwidth_gbs']:.0f} GB/s, dense fp16 tensor cores {lim['tensor_tflops']:.0f} TFLOP/s. "
             f"Sparsity {sparsity}, {mask} masks. Microseconds; gated = mask reorder + kernel; fallback = reorder + "
             "vendor BLAS (+ the mask / SwiGLU epilogue); picked = the path the crossovers choose; cuBLAS + SwiGLU "
             "(gate/up) = torch's GEMM and its silu(g) * u, what a dense FFN runs.", "",
             "| workload | M | cuBLAS | our cuBLASLt dense | gated | fallback | picked vs cuBLAS | gated vs cuBLAS "
             "| fallback vs cuBLAS | picked vs cuBLAS + SwiGLU | rel err (gated / fallback) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        if r["sparsity"] != sparsity or r["mask"] != mask:
            continue
        picked = auto_us(r, crossovers)
        swiglu = f"{r['cublas_swiglu_us'] / picked:.2f}x" if "cublas_swiglu_us" in r else "-"
        lines.append(f"| {r['workload']} | {r['tokens']} | {r['cublas_us']:.1f} | {r['blas_dense_us']:.1f} | "
                     f"{r['ours_us']:.1f} | {r['fallback_us']:.1f} | **{r['cublas_us'] / picked:.2f}x** | "
                     f"{r['cublas_us'] / r['ours_us']:.2f}x | {r['cublas_us'] / r['fallback_us']:.2f}x | {swiglu} | "
                     f"{r['rel_err']:.1e} / {r['fallback_rel_err']:.1e} |")
    return "\n".join(lines)


def times(ratio: float | None) -> str:
    """A speedup as "1.23x"; "-" where a row has none (all-skipped masks: no work, no limit)."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def sweep_markdown(result: dict) -> str:
    """The knob sweep (`wide-bench run --sweep`): kernel microseconds per candidate, and the picks."""
    rows = result["rows"]
    knobs = sorted({r["knobs"] for r in rows})
    lines = ["| workload | M | " + " | ".join(knobs) + " |", "| --- | ---: | " + " | ".join("---:" for _ in knobs) + " |"]
    for name in dict.fromkeys(r["workload"] for r in rows):
        for m in sorted({r["tokens"] for r in rows if r["workload"] == name}):
            cells = {r["knobs"]: r["kernel_us"] for r in rows if r["workload"] == name and r["tokens"] == m}
            lines.append(f"| {name} | {m} | " + " | ".join(f"{cells[k]:.1f}" if k in cells else "" for k in knobs) + " |")
    lines += ["", "Picked (least summed time over the bucket's token counts): " + ", ".join(
        f"{key} {pick['knobs']}" for key, pick in result["best"].items())]
    return "\n".join(lines)


def plot(result: dict, path: str, mask: str = "random") -> str:
    """Speedup over cuBLAS against token count, one panel per workload, one line per sparsity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["workload"] for r in result["rows"]))
    cols = min(3, len(names))
    nrows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        rows = [r for r in result["rows"] if r["workload"] == name and r["mask"] == mask]
        for sp in sorted({r["sparsity"] for r in rows}):
            pts = sorted((r["tokens"], r["speedup_vs_cublas"], r["limit_speedup_vs_cublas"])
                         for r in rows if r["sparsity"] == sp and r["limit_speedup_vs_cublas"] is not None)
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"ours s={sp}")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], ls=":", color=line.get_color(), label=f"limit s={sp}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(name)
        ax.set_xlabel("tokens M")
    for row in axes:
        row[0].set_ylabel("speedup over cuBLAS dense")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"{result['device']}: gated kernels vs torch.matmul ({mask} masks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def is_cpu(result: dict) -> bool:
    """A `wide-bench cpu` result (torch.matmul on this machine's CPU) rather than a GPU run's."""
    return bool(result["rows"]) and "torch_us" in result["rows"][0]


def _cpu_tile(row: dict) -> str:
    """The tuned tile of the row's token bucket (schedules.tiles.CPU_BUCKETS: 1, 2-16, more)."""
    from ..schedules.tiles import CPU_BUCKETS

    tiles = row.get("tile")
    if not tiles:
        return "default"
    t = tiles[sum(row["tokens"] > b for b in CPU_BUCKETS)]
    return f"{t['bm']} x {t['bn']}"


def cpu_markdown(result: dict) -> str:
    """`wide-bench cpu`'s rows in milliseconds: torch.matmul in the same dtype, TVM dense, ours, ours with every
    group active, the ratios, and the limit (used weight bytes at the measured read rate or active FLOPs at the
    measured fp32 rate)."""
    lim = result["limits"]
    lines = [f"CPU: {result.get('cpu', result['device'])}, target {result['target']}; measured "
             f"{lim['bandwidth_gbs']:.1f} GB/s read, {lim['tensor_tflops'] * 1e3:.0f} GFLOP/s fp32. Milliseconds.", "",
             "| workload | M | torch.matmul (same dtype) | TVM dense | ours (50 %) | ours, all active | vs same kernel "
             "dense | vs torch | limit | % of limit | tile (bm x bn) | weight copies |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['workload']} | {r['tokens']} | {r['torch_us'] / 1e3:.1f} | {r['tvm_dense_us'] / 1e3:.0f} | "
                     f"**{r['ours_us'] / 1e3:.2f}** | {r['ours_all_active_us'] / 1e3:.2f} | "
                     f"{r['speedup_vs_same_kernel_dense']:.2f}x | {r['speedup_vs_torch']:.2f}x | "
                     f"{r['limit_us'] / 1e3:.1f} | {r['limit_us'] / r['ours_us']:.0%} | {_cpu_tile(r)} | "
                     f"{r.get('weight_copies', 1)} |")
    return "\n".join(lines)


def cpu_plot(result: dict, path: str) -> str:
    """Speedups against token count, one panel per dtype: over torch.matmul (solid), over the same kernel with
    every group active (dashed), and the limit over torch (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = list(dict.fromkeys(r.get("dtype", "float32") for r in result["rows"]))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.6 * len(dtypes), 3.6), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        rows = [r for r in result["rows"] if r.get("dtype", "float32") == dt]
        for name in dict.fromkeys(r["workload"] for r in rows):
            pts = sorted((r["tokens"], r["speedup_vs_torch"], r["speedup_vs_same_kernel_dense"],
                          r["limit_speedup_vs_torch"]) for r in rows if r["workload"] == name)
            m = [p[0] for p in pts]
            line, = ax.plot(m, [p[1] for p in pts], marker="o", label=f"{name} vs torch")
            ax.plot(m, [p[2] for p in pts], marker="s", ls="--", color=line.get_color(),
                    label=f"{name} vs all active")
            ax.plot(m, [p[3] for p in pts], ls=":", color=line.get_color(), label=f"{name} limit vs torch")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(dt)
        ax.set_xlabel("tokens M")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("speedup")
    fig.suptitle(f"{result.get('cpu', result['device'])}: gated kernels at 50 % (random masks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def is_dense(result: dict) -> bool:
    """A `wide-bench dense-run` result (dense matmul shapes) rather than the gated kernels'."""
    return result.get("kind") == "dense"


def dense_markdown(result: dict) -> str:
    """`wide-bench dense-run`'s rows: torch.matmul, our library's BLAS dispatch, TVM's own kernels and the limit."""
    lim = result["limits"]
    lines = [f"Device: {result['device']} ({result['dtype']}); timer: {result['timer']}; measured "
             f"{lim['bandwidth_gbs']:.0f} GB/s, {lim['tensor_tflops']:.1f} TFLOP/s dense. Microseconds; ours = "
             f"the compiled library's matmul through {result['blas']}.", "",
             "| shape | N x K | T | torch.matmul | ours | TVM's own kernel | limit | ours vs torch | TVM vs torch "
             "| rel err |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        tvm_us = "-" if r["tvm_us"] is None else f"{r['tvm_us']:.1f}"
        dims = {"scores": "heads x T x T", "values": "heads x T x 128"}.get(r["form"], f"{r['n']} x {r['k']}")
        lines.append(f"| {r['shape']} | {dims} | {r['tokens']} | {r['torch_us']:.1f} | **{r['blas_us']:.1f}** | "
                     f"{tvm_us} | {r['limit_us']:.1f} | {r['blas_vs_torch']:.2f}x | {times(r['tvm_vs_torch'])} | "
                     f"{r['rel_err']:.1e} |")
    return "\n".join(lines)


def dense_plot(result: dict, path: str) -> str:
    """Speed over torch.matmul against token count, one line per shape: ours (solid), TVM's own (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in dict.fromkeys(r["shape"] for r in result["rows"]):
        rows = sorted((r for r in result["rows"] if r["shape"] == name), key=lambda r: r["tokens"])
        line, = ax.plot([r["tokens"] for r in rows], [r["blas_vs_torch"] for r in rows], marker="o", label=name)
        pts = [(r["tokens"], r["tvm_vs_torch"]) for r in rows if r["tvm_vs_torch"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=":", color=line.get_color())
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("tokens T")
    ax.set_ylabel("speed over torch.matmul")
    ax.legend(fontsize=7)
    ax.set_title(f"{result['device']}: dense matmuls, ours ({result['blas']}, solid) and TVM's own (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def model_markdown(result: dict) -> str:
    """`wide-bench model-run`'s rows: PyTorch (dense, SDPA) against our library gated and dense."""
    cfg = result["config"]
    lines = [f"Device: {result['device']}; model {result['model']} ({cfg['num_layers']} layers, hidden "
             f"{cfg['hidden_size']}, intermediate {cfg['intermediate_size']}); timer: {result['timer']}. "
             "Microseconds per forward of [1, T].", "",
             "| T | PyTorch (dense, SDPA) | ours gated | ours gated, no fallback | ours dense | gated vs PyTorch | "
             "dense vs PyTorch | gated vs dense |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        nofb = r.get("ours_gated_nofallback_us")
        lines.append(f"| {r['tokens']} | {r['torch_us']:.0f} | **{r['ours_gated_us']:.0f}** | "
                     f"{'-' if nofb is None else f'{nofb:.0f}'} | {r['ours_dense_us']:.0f} "
                     f"| {r['gated_vs_torch']:.2f}x | {r['dense_vs_torch']:.2f}x | {r['gated_vs_dense']:.2f}x |")
    return "\n".join(lines)


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
