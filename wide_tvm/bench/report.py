"""Turn wide-bench JSON into a Markdown table (docs/performance.md) and a speedup plot."""

from __future__ import annotations

import json


def markdown(result: dict, sparsity: float = 0.5, mask: str = "random") -> str:
    """One row per workload and token count at `sparsity`: every column the issue asks for, side by side."""
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


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
