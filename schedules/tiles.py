"""Tile sizes of the block-sparse kernels per target kind (the knobs issue 3 hands to MetaSchedule)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    """BM: sorted tokens per tile (the unit of block-level skipping); BN: output columns per tile."""

    bm: int
    bn: int


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def tile_config(target_kind: str, columns: int) -> TileConfig:
    """Tiles for a kernel whose tile columns must divide `columns` (a group size, or N)."""
    if target_kind == "cuda":
        bn = math.gcd(columns, 32) if columns % 32 else 32
        return TileConfig(bm=max(1, 256 // max(bn, 1)) if bn < 16 else 16, bn=bn)
    if target_kind == "llvm":
        return TileConfig(bm=8, bn=_largest_divisor(columns, 64))
    raise ValueError(f"no tile configuration for target kind {target_kind!r}")
