"""Measured crossovers of the dense fallback (wide_tvm/fallback.py) into a tuning folder: `wide-tune --crossover`.

A `wide-bench run` times, per gated kernel and token count, the gated path (mask reorder + kernel: `ours_us`) and
the kernel's dense fallback (reorder + vendor BLAS + epilogue: `fallback_us`) on the same masks. This keeps the rows
at one sparsity and mask kind (50 % random by default, what the decision assumes) as points [tokens, gated_us,
dense_us] per kernel key, in `crossover.json`:

    {"kernels": {"gemm_k/g112x128/d4096/float16": {"points": [[1, 14.1, 23.0], [4, 22.5, 24.1], ...],
                                                   "sparsity": 0.5, "masks": "random", "device": "NVIDIA H200",
                                                   "source": "gated.json"}}}

A later import replaces a kernel's whole entry. Pure Python.
"""

from __future__ import annotations

import json
import os

from ..fallback import CROSSOVER_FILE


def points_from_run(run: dict, sparsity: float = 0.5, masks: str = "random") -> dict:
    """Kernel key -> [[tokens, gated_us, dense_us], ...] from a `wide-bench run` result (its rows with `key` and
    `fallback_us`) at `sparsity` and `masks`."""
    points: dict = {}
    for row in run.get("rows", []):
        if "fallback_us" not in row or "key" not in row:
            continue
        if abs(row["sparsity"] - sparsity) > 1e-9 or row["mask"] != masks:
            continue
        points.setdefault(row["key"], []).append([row["tokens"], row["ours_us"], row["fallback_us"]])
    return {key: sorted(pts) for key, pts in points.items()}


def import_runs(folder: str, paths: list[str], sparsity: float = 0.5, masks: str = "random") -> tuple[str, int]:
    """Write the crossover points of the runs at `paths` (later files win, kernel by kernel) into FOLDER's
    crossover.json; returns (its path, kernels written). ValueError where the runs hold no such rows."""
    entries: dict = {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        for key, pts in points_from_run(run, sparsity, masks).items():
            entries[key] = {"points": pts, "sparsity": sparsity, "masks": masks,
                            "device": run.get("device", ""), "source": os.path.basename(path)}
    if not entries:
        raise ValueError(f"{', '.join(paths)}: no rows with both paths timed (`fallback_us`) at sparsity {sparsity} "
                         f"and {masks} masks; time them with `wide-bench run` of a `wide-bench build` of today")
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, CROSSOVER_FILE)
    existing = {}
    if os.path.isfile(target):
        with open(target) as f:
            existing = json.load(f).get("kernels", {})
    tmp = target + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"kernels": existing | entries}, f, indent=1)
    os.replace(tmp, target)
    return target, len(entries)
