"""Share of its groups a gemm_k tile of consecutive tokens runs, by token order (NumPy; no GPU): token order, plain
binary pattern order, Gray-code order (schedules/token_order.host_order, the kernel's) and a greedy packing of
patterns into tiles, under random and skewed masks (three seeds each, mean).

    python docs/results/experiment_pattern_order_model.py
"""
import numpy as np

from wide_tvm.schedules.token_order import host_order


def ran(mask, order, bt=128):
    """Groups the tiles run over the tiles' groups."""
    m = mask[order]
    return sum(m[i:i + bt].any(0).sum() for i in range(0, len(m), bt)) / (-(-len(m) // bt) * m.shape[1])


def binary(mask):
    """Plain binary order of the patterns, group 0 most significant (any number of groups), stable."""
    return np.lexsort(tuple(mask[:, g] for g in range(mask.shape[1] - 1, -1, -1)))


def greedy(mask, bt=128):
    """Tiles filled pattern by pattern, each next pattern the one that adds fewest groups to the tile's union."""
    pats = (mask * (1 << np.arange(mask.shape[1]))).sum(1)
    left = {}
    for i, p in enumerate(pats):
        left.setdefault(int(p), []).append(i)
    order = []
    while left:
        union, tile = 0, []
        while len(tile) < bt and left:
            p = min(left, key=lambda q: (bin(union | q).count("1"), bin(q).count("1"), q))
            take = left[p][:bt - len(tile)]
            tile += take
            left[p] = left[p][len(take):]
            if not left[p]:
                del left[p]
            union |= p
        order += tile
    return np.array(order)


for groups, tokens in ((8, 4096), (8, 1024), (112, 4096)):
    for kind in ("random", "skewed"):
        res = []
        for seed in range(3):
            rng = np.random.default_rng(seed)
            p = 0.5 if kind == "random" else rng.permutation(np.linspace(0.05, 0.95, groups))
            mask = (rng.random((tokens, groups)) < p).astype(np.int32)
            # (Gray order and the greedy packing for the kernel's <= 8 groups only)
            orders = [np.arange(tokens), binary(mask)] + ([host_order(mask), greedy(mask)] if groups <= 8 else [])
            res.append([ran(mask, o) for o in orders])
        names = ["token", "binary", "gray", "greedy"]  # (zip stops at the orders computed)
        print(f"G={groups:3d} n={tokens} {kind:6s} " + "  ".join(f"{k} {v:.3f}" for k, v in zip(names, np.mean(res, 0))))
