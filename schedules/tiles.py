"""Tile sizes of the block-sparse kernels per target kind (the knobs issue 3 hands to MetaSchedule)."""

from __future__ import annotations

import math

from ..knobs import TileConfig
from .dispatch import token_dispatch


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def tile_config(target_kind: str, columns: int) -> TileConfig:
    """Tiles for a kernel whose tile columns must divide `columns` (a group size, or N)."""
    if target_kind == "cuda":
        bn = math.gcd(columns, 32) if columns % 32 else 32
        return TileConfig(bm=max(1, 256 // max(bn, 1)) if bn < 16 else 16, bn=bn)
    if target_kind == "llvm":
        return cpu_default_tile(False, columns)
    raise ValueError(f"no tile configuration for target kind {target_kind!r}")


def cpu_default_tile(register_rows: bool, columns: int) -> TileConfig:
    """The CPU tile a kernel runs without tuned knobs. `register_rows`: gemm_mn over [N, K] weights, whose bn is
    the weight rows of its register tile (schedules/gemm_mn.py); else bn is the columns of a task (a divisor of
    `columns`, which is the group size or N; a multiple of 16 where N is one, as "kp" weight panels need)."""
    if register_rows:
        return TileConfig(bm=4, bn=_largest_divisor(columns, 2))
    if columns % 16 == 0:
        return TileConfig(bm=4, bn=16 * _largest_divisor(columns // 16, 2))
    return TileConfig(bm=4, bn=_largest_divisor(columns, 32))


CPU_BUCKETS = (1, 16)  # CPU kernels: one tile per bucket (1 token, <= 16 tokens, more), each tuned apart


def cpu_tiles(tile, default: TileConfig) -> tuple[TileConfig, ...]:
    """One tile per CPU bucket (len(CPU_BUCKETS) + 1) from None (the default everywhere), one TileConfig
    (every bucket) or a tuple with one per bucket (None: that bucket's default)."""
    if tile is None:
        tile = default
    if isinstance(tile, TileConfig):
        return (tile,) * (len(CPU_BUCKETS) + 1)
    tiles = tuple(tile)
    if len(tiles) != len(CPU_BUCKETS) + 1:
        raise ValueError(f"{len(tiles)} CPU tiles; the CPU kernels have {len(CPU_BUCKETS) + 1} token buckets "
                         f"(<= {', <= '.join(map(str, CPU_BUCKETS))}, more)")
    return tuple(default if t is None else t for t in tiles)


def cpu_kernels(tile, default: TileConfig, make_body):
    """Macro (n, *args) running the CPU kernel body of n's token bucket; make_body(TileConfig) builds one, and
    buckets with the same tile share it."""
    tiles = cpu_tiles(tile, default)
    bodies = {t: make_body(t) for t in set(tiles)}
    return token_dispatch([(b, bodies[t]) for b, t in zip(CPU_BUCKETS + (None,), tiles)])


def tiles_from_log(entry) -> TileConfig | tuple[TileConfig, ...]:
    """The tiles of a tuning log's "cpu" entry: {"bm", "bn"} for every bucket, or a list of one per bucket
    (None: the bucket's default)."""
    if isinstance(entry, dict):
        return TileConfig(**entry)
    return tuple(None if e is None else TileConfig(**e) for e in entry)


def tile_dims(tile: TileConfig, width: int, what: str) -> tuple[int, int]:
    """(BM, BN) of a tile whose BN columns must divide `width` (`what` names it in the error)."""
    if width % tile.bn:
        raise ValueError(f"tile width {tile.bn} does not divide {what} {width}")
    return tile.bm, tile.bn
