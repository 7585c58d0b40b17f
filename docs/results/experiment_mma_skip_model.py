"""The warpgroup wgmma work the gemm_mn knob mma_skip removes, counted on mask draws (no GPU): per group, 128-token
tiles over its active tokens; a tile's second warpgroup (rows 64-127) multiplies only where the tile holds more than
64 active tokens. Prints, per workload and token count, the share of warpgroup K loops that skip their wgmmas.

    python docs/results/experiment_mma_skip_model.py"""
import numpy as np

from wide_tvm.kernel_reference import make_mask

rng = np.random.default_rng(0)
print("workload      groups  tokens  sparsity  mask     tiles/group  warpgroup loops skipped")
for name, groups in (("gate_up_g128", 112), ("gate_up_g32", 448), ("q_proj_h4", 8)):
    for tokens in (129, 192, 256, 384, 512, 1024, 4096):
        for sparsity, kind in ((0.5, "random"), (0.5, "skewed"), (0.25, "random"), (0.75, "random")):
            tiles = idle = 0
            for _ in range(8):
                counts = make_mask(kind, tokens, groups, rng, sparsity).sum(0)
                for c in counts:
                    t = -(-int(c) // 128)
                    tiles += t
                    idle += t and (int(c) - (t - 1) * 128 <= 64)
            print(f"{name:13s} {groups:6d} {tokens:7d} {sparsity:9.2f}  {kind:7s} {tiles / 8 / groups:11.2f}  "
                  f"{idle / (2 * tiles):.1%}")
