"""Table of the mma_skip A/B (sixteenth session, H100): the committed build against the same picks with mma_skip
on, alternated twice in one device call (docs/results/mma_skip_h100_{base,skip}_{a,b}.json).

    python docs/results/experiment_mma_skip_ab.py > docs/results/mma_skip_ab_h100.txt
"""
import json
import math
import os

here = os.path.dirname(os.path.abspath(__file__))


def rows(name):
    with open(os.path.join(here, f"mma_skip_h100_{name}.json")) as f:
        data = json.load(f)
    return {(r["workload"], r["tokens"]): r for r in data["rows"]}


runs = {n: rows(n) for n in ("base_a", "skip_a", "base_b", "skip_b")}
print("| workload | M | cuBLAS us | base a / b | mma_skip a / b | skip / base |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
logs = {}
for key in runs["base_a"]:
    base = [runs[n][key]["ours_us"] for n in ("base_a", "base_b")]
    skip = [runs[n][key]["ours_us"] for n in ("skip_a", "skip_b")]
    ratio = sum(skip) / sum(base)
    logs.setdefault(key[0], []).append(math.log(ratio))
    print(f"| {key[0]} | {key[1]} | {runs['base_a'][key]['cublas_us']:.1f} | {base[0]:.1f} / {base[1]:.1f} | "
          f"{skip[0]:.1f} / {skip[1]:.1f} | {ratio:.3f} |")
for w, ls in logs.items():
    print(f"geometric mean skip / base, {w}: {math.exp(sum(ls) / len(ls)):.3f}")
