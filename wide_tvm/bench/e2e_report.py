"""The end-to-end benchmark's table and plot (wide-bench report E2E.json; the JSON of wide_tvm/bench/e2e.py)."""

from __future__ import annotations

NAMES = {"ours_gated": "ours, gated", "ours_gated_nograph": "ours, gated, no CUDA graphs",
         "ours_dense": "ours, dense", "torch_eager": "PyTorch eager (SDPA, static cache)",
         "torch_compile": "torch.compile (static cache, CUDA graphs)"}


def name(row: str) -> str:
    """A row's title: ours_gated@0.25 -> "ours, gated (25 % active)"."""
    base, _, share = row.partition("@")
    return NAMES.get(base, base) + (f" ({float(share):.0%} active)" if share else "")


def ordered(result: dict) -> list[str]:
    return sorted(result["rows"], key=lambda r: (list(NAMES).index(r.split("@")[0]) if r.split("@")[0] in NAMES
                                                 else len(NAMES), r))


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def fixed_cost(result: dict, row: str) -> dict | None:
    """Batch-1 decode at the smallest context: the step, the time to stream the weights it reads at the measured
    bandwidth (gated: the gated layers' weights at the measured active share), and the rest (the fixed cost) as a
    share of the step."""
    r = result["rows"].get(row)
    if not r or not r.get("step_ms"):
        return None
    ctx = str(min(result["contexts"]))
    step = r["step_ms"][ctx].get("1")
    if step is None:
        return None
    if not r.get("bandwidth_gb_s"):
        return None
    skipped = 1 - r.get("active_share", 1.0) if row.startswith("ours_gated") else 0.0
    read = r["weight_bytes"] - skipped * r.get("gated_weight_bytes", 0)
    stream = read / (r["bandwidth_gb_s"] * 1e9) * 1e3
    return {"step_ms": step, "stream_ms": stream, "fixed_share": max(step - stream, 0) / step}


def markdown(result: dict) -> str:
    rows = ordered(result)
    model = result["model"]
    lines = [f"End to end on {result['device']}: {model['num_layers']} layers of hidden {model['hidden_size']}, "
             f"vocabulary {model['vocab_size']}, {result.get('dtype', 'float16')}; medians.", "",
             "| TTFT (ms) at prompt | " + " | ".join(name(r) for r in rows) + " | gated vs dense | gated vs "
             "torch.compile |", "|---" * (len(rows) + 3) + "|"]
    get = (lambda row, *keys: _dig(result["rows"].get(row, {}), keys))
    for p in result["prompts"]:
        vals = [get(r, "ttft_ms", str(p)) for r in rows]
        lines.append(f"| {p} | " + " | ".join(f"{v:.2f}" if v else "-" for v in vals) + " | "
                     f"{_ratio(get('ours_dense', 'ttft_ms', str(p)), get('ours_gated', 'ttft_ms', str(p)))} | "
                     f"{_ratio(get('torch_compile', 'ttft_ms', str(p)), get('ours_gated', 'ttft_ms', str(p)))} |")
    lines += ["", "| decode tok/s (context, batch) | " + " | ".join(name(r) for r in rows)
              + " | gated vs dense | gated vs torch.compile |", "|---" * (len(rows) + 3) + "|"]
    for c in result["contexts"]:
        for b in result["batches"]:
            tok = {r: get(r, "decode_tok_s", str(c), str(b)) for r in rows}
            lines.append(f"| {c}, {b} | " + " | ".join(f"{v:.1f}" if v else "-" for v in tok.values()) + " | "
                         f"{_ratio(tok.get('ours_gated'), tok.get('ours_dense'))} | "
                         f"{_ratio(tok.get('ours_gated'), tok.get('torch_compile'))} |")
    lines += ["", "| | " + " | ".join(name(r) for r in rows) + " |", "|---" * (len(rows) + 1) + "|",
              "| GPU memory in use (GiB) | " + " | ".join(
                  f"{get(r, 'memory_gib'):.1f}" if get(r, "memory_gib") is not None else "-" for r in rows) + " |"]
    lines.append("| groups active (measured) / main vs the PyTorch model | " + " | ".join(
        f"{get(r, 'active_share'):.0%} / {get(r, 'main_vs_torch'):.1e}" if get(r, "active_share") is not None else "-"
        for r in rows) + " |")
    costs = {r: fixed_cost(result, r) for r in rows}
    lines.append("| decode step at batch 1: fixed cost (beyond streaming its weights) | " + " | ".join(
        f"{c['fixed_share']:.0%} of {c['step_ms']:.2f} ms" if c else "-" for c in costs.values()) + " |")
    kinds = ("gated", "dense", "attention", "other")
    for row in rows:
        parts = result["rows"][row].get("decode_breakdown_us")
        if parts:
            lines.append(f"\n{name(row)}, one decode step at batch 1 by kernel (us of device time): "
                         + ", ".join(f"{k} {parts[k]:.0f}" for k in kinds)
                         + f"; {parts['launches']:.0f} launches, {parts['wall_profiled']:.0f} us wall (profiled)")
    for row, err in result.get("errors", {}).items():
        lines.append(f"\n{name(row)}: failed: {err}")
    return "\n".join(lines)


def _dig(d, keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def plot(result: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ordered(result)
    fig, axes = plt.subplots(1, 1 + len(result["contexts"]), figsize=(5 * (1 + len(result["contexts"])), 4))
    for r in rows:
        ttft = result["rows"][r].get("ttft_ms", {})
        axes[0].plot(result["prompts"], [ttft.get(str(p)) for p in result["prompts"]], marker="o", label=name(r))
        for ax, c in zip(axes[1:], result["contexts"]):
            tok = result["rows"][r].get("decode_tok_s", {}).get(str(c), {})
            ax.plot(result["batches"], [tok.get(str(b)) for b in result["batches"]], marker="o", label=name(r))
    axes[0].set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="TTFT (ms)", title="time to first token")
    for ax, c in zip(axes[1:], result["contexts"]):
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="tokens / s", title=f"decode, context {c}")
    axes[0].legend(fontsize=7)
    fig.suptitle(result["device"])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
