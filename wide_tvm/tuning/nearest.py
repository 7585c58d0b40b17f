"""Knobs for a kernel shape the tuning databases hold no records of: those of the nearest tuned shape.

A user's own model (Qwen2.5-7B's FFN: `gemm_mn_swiglu/g148x128/d3584/float16`) should not run the generic defaults,
which are several times slower than tuned knobs at many tokens. The knobs that win depend mostly on the kernel kind,
the group size (the tile's row count and what a warp streams), the dtype and the token bucket, far less on the exact
K and N, so an untuned shape takes, bucket by bucket, the entry of the tuned shape with the same kind, group size and
dtype whose reduction length and grouped width are nearest (on a log scale), if it is near enough (`MAX_DISTANCE`:
both within 4x, roughly), and of its knobs those that fit the new shape. Example: with the Llama-3.1-8B tunings,
`gemm_mn_swiglu/g148x128/d3584/float16` takes `gemm_mn_swiglu/g112x128/d4096/float16`'s knobs, and
`gemm_k/g112x128/d5120/float16` (Mistral-Nemo's down) takes `gemm_k/g112x128/d4096/float16`'s.

Used by the lowering (passes/lower_gated.py) and the benchmark build alike.
"""

from __future__ import annotations

import math
import re

from ..kernel_spec import KernelSpec
from ..knobs import decode_knobs, tile_knobs

MAX_DISTANCE = 2 * math.log(4)  # a tuned shape further than this (tiny test models from 8B shapes) lends nothing

_KEY = re.compile(r"^(?P<kind>\w+)/g(?P<groups>\d+)x(?P<gs>\d+)/d(?P<dim>\d+)/(?P<dtype>\w+)$")


def parse_key(key: str) -> tuple[str, int, int, int, str] | None:
    """(kind, groups, group size, dim, dtype) of a kernel_spec.kernel_key, or None for another kind of key."""
    m = _KEY.match(key)
    if m is None:
        return None
    return m["kind"], int(m["groups"]), int(m["gs"]), int(m["dim"]), m["dtype"]


def _distance(a: tuple, b: tuple) -> float:
    """How far two shapes of one kind are: the log ratios of their `dim` and their grouped width, summed."""
    return abs(math.log(a[3] / b[3])) + abs(math.log((a[1] * a[2]) / (b[1] * b[2])))


def nearest(entries: dict, key: str) -> str | None:
    """The key of the tuned entry nearest to `key` (same kind, group size and dtype; the least `_distance`, ties to
    the first in sorted order, at most MAX_DISTANCE), or None where no entry qualifies."""
    want = parse_key(key)
    if want is None:
        return None
    candidates = []
    for other in sorted(entries):
        have = parse_key(other)
        if other != key and have and have[0] == want[0] and have[2] == want[2] and have[4] == want[4]:
            candidates.append((_distance(want, have), other))
    best = min(candidates, default=None)
    return best[1] if best and best[0] <= MAX_DISTANCE else None


def _cpu_tiles(entry) -> tuple:
    """A "cpu" entry's tiles as a tuple, as the lowering reads them (schedules/tiles.py: tiles_from_log)."""
    from ..schedules.tiles import tiles_from_log

    tiles = tiles_from_log(entry)
    return tiles if isinstance(tiles, tuple) else (tiles,)


def _fits(knobs, spec: KernelSpec) -> bool:
    try:
        for knob in knobs:
            if knob is not None:  # (a bucket keeping its default)
                knob.validate(spec)
    except (TypeError, ValueError, KeyError):
        return False
    return True


def knobs_entry(entries: dict, spec: KernelSpec, wgmma: bool) -> tuple[dict, str | None]:
    """(the knobs entry a compile applies to `spec`, the tuned key it was derived from or None). Its own entry where
    the databases hold one; else the nearest tuned shape's, keeping only the knob families (decode, tiles, cpu) that
    fit `spec` (the others take their defaults); else {}."""
    own = entries.get(spec.key)
    if own:
        return own, None
    source = nearest(entries, spec.key)
    if source is None:
        return {}, None
    entry = entries[source]
    checks = {"decode": lambda e: decode_knobs(e),
              "tiles": lambda e: tile_knobs(e, wgmma, spec.kind),
              "cpu": _cpu_tiles}
    fitting = {}
    for family, read in checks.items():
        if family in entry:
            try:
                knobs = read(entry[family])
            except (TypeError, ValueError, KeyError):
                continue
            if _fits(knobs, spec):
                fitting[family] = entry[family]
    return fitting, source if fitting else None
