"""The Hopper wgmma tile GEMMs (schedules/wgmma_gemm.py): knobs, shapes they refuse, targets that get them, and
device code for every knob (nvcc, sm_90a). Their numerics are checked on the H200 by tools/gpu_check.py."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
import subprocess

import pytest

from wide_tvm.cuda_aot import cuda_codegen

cuda_codegen()

import tvm  # noqa: E402

from wide_tvm.errors import WideError  # noqa: E402
from wide_tvm.schedules import gemm_k, gemm_mn  # noqa: E402
from wide_tvm.kernel_spec import KernelSpec  # noqa: E402
from wide_tvm.knobs import (DEFAULT_TILES, GEMV_TILES, SmemTile, WgmmaK, WgmmaMN, tile_knob,  # noqa: E402
                            tile_knobs, wgmma_n)
from wide_tvm.schedules.wgmma_ring import ring_bytes, ring_layout  # noqa: E402
from wide_tvm.targets import has_wgmma, parse_target, target_folder  # noqa: E402

MN, K = "gemm_mn_swiglu", "gemm_k"


def _spec(kind: str, group_size: int, dim: int = 4096, groups: int = 8) -> KernelSpec:
    return KernelSpec(kind, groups, group_size, dim, "float16", "tc")


def test_wgmma_knobs_parse_name_and_validate():
    """Each wgmma kernel kind has its own knob class, read from the named form or an older log's positional list
    (the same knobs either way), named stably, and checked: knobs another kind has, or combinations a kernel cannot
    build, are one clear ValueError."""
    assert tile_knob(["wgmma", 128, 4, 4], MN) == WgmmaMN() and WgmmaMN().name() == "wg128n256s4"
    assert tile_knob(["wgmma", 128, 4, 4], K) == WgmmaK() and WgmmaK().name() == "wg128n256s4"
    named = {  # positional entry, kind -> the knobs and their name
        (("wgmma", 64, 2, 5), K): (WgmmaK(64, 2, 5), "wg64n128s5"),
        (("wgmma", 128, 2, 6, 4), K): (WgmmaK(rows=2, stages=6, ksplit=4), "wg128n128s6k4"),
        (("wgmma", 128, 4, 4, 1, 1), MN): (WgmmaMN(producer=1), "wg128n256s4p1"),  # one producer warp
        (("wgmma", 128, 2, 6, 4, 2), MN): (WgmmaMN(rows=2, stages=6, ksplit=4, producer=2), "wg128n128s6k4p2"),
        (("wgmma", 128, 4, 4, 1, 4, 132), MN): (WgmmaMN(producer=4, persistent=132), "wg128n256s4p4x132"),
        (("wgmma", 128, 4, 4, 1, 0, 132), K): (WgmmaK(persistent=132), "wg128n256s4x132"),  # stream-K
        # swapped operands: any multiple of 8 tokens a tile (wgmma N)
        (("wgmma", 80, 2, 8, 1, 0, 0, 1), MN): (WgmmaMN(80, 2, 8, swap=1), "wg80n128s8t"),
        (("wgmma", 48, 2, 6, 4, 0, 0, 1), MN): (WgmmaMN(48, 2, 6, 4, swap=1), "wg48n128s6k4t"),
        # ... whose weight copies ask L2 for 256-byte prefetches
        (("wgmma", 80, 1, 6, 1, 0, 0, 1, 256), MN): (WgmmaMN(80, 1, 6, swap=1, l2=256), "wg80n64s6tl256"),
        # gemm_mn's last wave split in K over up to 8 blocks a tile (past 512 tokens)
        (("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8), MN): (WgmmaMN(producer=4, tail=8), "wg128n256s4p4w8"),
        # gemm_k's tiles over tokens ordered by mask pattern (O's 8 head groups, past 512 tokens)
        (("wgmma", 128, 2, 6, 2, 0, 0, 0, 0, 0, 1), K): (WgmmaK(rows=2, stages=6, ksplit=2, order=1), "wg128n128s6k2o"),
        # gemm_mn's warpgroups whose rows are all past the group's count skipping their wgmmas
        (("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 0, 0, 1), MN): (WgmmaMN(producer=4, mma_skip=1), "wg128n256s4p4m"),
        (("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8, 0, 1), MN): (WgmmaMN(producer=4, tail=8, mma_skip=1),
                                                             "wg128n256s4p4w8m"),
        (("gemv",), K): (GEMV_TILES, "gemv64"), ((128, 2, 4, 2), MN): (SmemTile(128, 2, 4, 2), "t128r2s4p2")}
    for (entry, kind), (knobs, name) in named.items():
        assert tile_knob(entry, kind) == knobs and knobs.name() == name, entry
        doc = knobs.to_json()  # field names, and the same knobs read back
        assert doc["kernel"] == knobs.kernel and tile_knob(doc, kind) == knobs
        assert all(doc[f.name] == getattr(knobs, f.name) for f in dataclasses.fields(knobs))
    for bad, kind, why in (
            (["wgmma", 192, 4, 3], MN, "tokens must be one of"), (["wgmma", 128, 5, 4], K, "rows 1..4"),
            (["wgmma", 128, 4, 2], MN, "stages >= 3"), (["wgmma", 128, 4], MN, "expected \\['wgmma'"),
            (["wgmma", 128, 4, 4, 0], K, "ksplit >= 1"), (["wgmma", 128, 4, 4, 1, 3], MN, "producer warps one of"),
            (["wgmma", 128, 4, 4, 1, 4, 1], MN, "persistent grid of 0 or at least 2 blocks"),
            ([128, 1, 3, 1, "smem", 2], MN, "expected \\[tokens, rows, stages, prefetch\\]"),
            ([96, 1, 3, 1], MN, "tokens must be a multiple of 64"),
            (["wgmma", 84, 2, 4, 1, 0, 0, 1], MN, "tokens a multiple of 8 up to 256"),
            (["wgmma", 264, 2, 4, 1, 0, 0, 1], MN, "tokens a multiple of 8 up to 256"),
            (["wgmma", 80, 2, 4, 1, 1, 0, 1], MN, "no producer warps"),
            (["wgmma", 80, 4, 4, 1, 0, 0, 1], MN, "rows 1..2"),
            (["wgmma", 80, 2, 4, 1, 0, 0, 2], MN, "tokens a multiple of 8"),
            (["wgmma", 80, 1, 6, 1, 0, 0, 1, 512], MN, "an L2 prefetch is one of"),
            (["wgmma", 80, 1, 6, 1, 0, 0, 1, 256, 8, 1, 0, 0], MN, "expected \\['wgmma'"),
            (["wgmma", 80, 1, 6, 1, 0, 0, 1, 0, 0, 0, 1], MN, "MMA skip 1"),
            (["wgmma", 128, 4, 4, 1, 4, 132, 0, 0, 0, 0, 1], MN, "MMA skip 1"),
            (["wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 0, 2], MN, "MMA skip 1"),
            (["wgmma", 128, 4, 4, 1, 0, 132, 0, 0, 0, 1], K, "ordered by mask pattern"),
            (["wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 0, 1], K, "ordered by mask pattern"),
            (["wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 2], K, "ordered by mask pattern"),
            (["wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 1], MN, "only the wgmma gemm_k orders its tokens"),
            (["wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 3], MN, "a split tail wave"),
            (["wgmma", 128, 4, 4, 2, 4, 0, 0, 0, 8], MN, "a split tail wave"),
            (["wgmma", 128, 4, 4, 1, 4, 132, 0, 0, 8], MN, "a split tail wave"),
            (["wgmma", 80, 1, 6, 1, 0, 0, 1, 0, 8], MN, "a split tail wave"),
            # knobs only gemm_mn has (a gemm_k tile's rows run different groups step by step: no MMA skip)
            (["wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 0, 1], K, "only the wgmma gemm_mn skips"),
            (["wgmma", 80, 2, 8, 1, 0, 0, 1], K, "only the wgmma gemm_mn swaps its operands"),
            (["wgmma", 128, 4, 4, 1, 0, 0, 0, 256], K, "only the wgmma gemm_mn takes an L2 prefetch"),
            (["wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 8], K, "only the wgmma gemm_mn splits its tail wave"),
            ({"kernel": "wgmma", "tokens": 128, "order": 1}, MN, "no knob order in a gemm_mn_swiglu's WgmmaMN"),
            ({"kernel": "wgmma", "swap": 1}, K, "no knob swap in a gemm_k's WgmmaK"),
            ({"kernel": "smem", "producer": 4}, MN, "no knob producer"), ({"tokens": 128}, MN, "'kernel' must be")):
        with pytest.raises(ValueError, match=why):
            tile_knob(bad, kind)
    # the knobs of one kind do not build the other
    with pytest.raises(ValueError, match="are a gemm_mn's"):
        WgmmaMN().validate(_spec(K, 128))
    with pytest.raises(ValueError, match="are a gemm_k's"):
        WgmmaK().validate(_spec(MN, 128))
    # a target without wgmma (not sm_90a) keeps the other picks and gets the mma.sync tile GEMM for wgmma ones
    log = [["gemv"], {"kernel": "smem", "tokens": 64, "rows": 1, "stages": 3, "prefetch": 1}, ["wgmma", 128, 4, 4]]
    assert tile_knobs(log, True, K)[2] == WgmmaK() and tile_knobs(log, True, MN)[2] == WgmmaMN()
    assert tile_knobs(log, False, K) == (GEMV_TILES, SmemTile(64, 1, 3, 1), SmemTile())
    assert tile_knobs(None, True, K) == DEFAULT_TILES


def test_wgmma_tiles_and_shared_memory():
    assert wgmma_n(128, True, WgmmaMN()) == (256, 128)  # gate and up of one 128-channel group side by side
    assert wgmma_n(32, True, WgmmaMN()) == (64, 32)  # a 32-channel group: N 64
    assert wgmma_n(512, False, WgmmaMN()) == (256, 256)  # Q: two blocks per 512-channel group
    assert ring_bytes(WgmmaMN(), 256) == 4 * (128 + 256) * 128 + 1024  # 4 stages of 48 KB, under the 227 KB
    ws = WgmmaMN(producer=1)
    assert ring_bytes(ws, 256) == ring_bytes(WgmmaMN(), 256) + 4 * 16  # + a full and an empty mbarrier a stage
    assert ring_layout(ws, 256) == (288, 256, 32, 128 * 128, (128 + 256) * 128)  # 2 warpgroups + 1 producer warp
    assert ring_layout(WgmmaK(), 256).copiers == 256 and ring_layout(ws, 256).copier0 == 256
    WgmmaK().validate(_spec(K, 32))  # gemm_k: groups of 32 go two to a 64-wide K step
    for gs in (16, 96):  # ... other group slices must be whole K steps
        with pytest.raises(ValueError, match="group size that is 32 or a multiple of 64"):
            WgmmaK().validate(_spec(K, gs))
    with pytest.raises(ValueError, match="K a multiple of 64"):
        gemm_mn(4, 16, 96, "float16", "tc", True, "cuda", tile_knobs=(WgmmaMN(),) * 3)
    WgmmaMN(ksplit=2).validate(_spec(MN, 128))  # gemm_mn splits K too
    with pytest.raises(ValueError, match="a persistent grid does not split K"):
        WgmmaMN(ksplit=2, producer=4, persistent=132).validate(_spec(MN, 128))
    with pytest.raises(ValueError, match="gemm_mn's persistent grid needs producer warps"):
        WgmmaMN(persistent=132).validate(_spec(MN, 128))
    WgmmaK(persistent=132).validate(_spec(K, 128))  # gemm_k: stream-K, every thread copies
    for ksplit, producer in ((2, 0), (1, 4)):  # ... which splits K itself, without producer warps
        with pytest.raises(ValueError, match="gemm_k's persistent grid"):
            WgmmaK(ksplit=ksplit, producer=producer, persistent=132).validate(_spec(K, 128))
    # swapped operands: a warpgroup per 64 weight rows (32 channels of gate and up), whatever the token tile
    sw = WgmmaMN(80, 2, 8, swap=1)
    assert wgmma_n(128, True, sw) == (128, 64) and ring_layout(sw, 128) == (256, 256, 256, 80 * 128, (80 + 128) * 128)
    assert ring_bytes(sw, 128) == 8 * (80 + 128) * 128 + 1024
    WgmmaMN(80, 2, 8, swap=1, l2=256).validate(_spec(MN, 128))


def test_gemm_k_split_follows_the_token_count():
    """The wgmma gemm_k splits K over more blocks than its knob says where few token tiles would leave SMs idle (a
    wave: 132 SMs x the blocks an SM's shared memory holds), up to MAX_KSPLIT and to MIN_SPLIT_STEPS K steps a
    split; the kernel computes the same count at run time as the Python rule."""
    from tvm import sym

    from wide_tvm.schedules.wgmma_gemm import MAX_KSPLIT, MIN_SPLIT_STEPS
    from wide_tvm.schedules.wgmma_stream_k import gemm_k_splits

    down_512 = WgmmaK(ksplit=2)  # 192 KB ring: one block an SM; 16 column blocks of 256
    assert [gemm_k_splits(t, 16, 224, down_512) for t in (1, 2, 3, 4, 8, 32)] == [MAX_KSPLIT, 4, 2, 2, 2, 2]
    o_128 = WgmmaK(64, 2, 4, ksplit=4)  # 97 KB ring: two blocks an SM; 32 column blocks of 128
    assert [gemm_k_splits(t, 32, 224, o_128) for t in (1, 2, 4)] == [8, 4, 4]
    assert MIN_SPLIT_STEPS == 16 and gemm_k_splits(1, 32, 64, o_128) == 4  # O's 64 K steps: 4 splits of 16 at most
    assert gemm_k_splits(1, 32, 64, WgmmaK(64, 2, 4)) == 4 and gemm_k_splits(1, 32, 16, o_128) == 4
    assert gemm_k_splits(40, 16, 224, WgmmaK()) == 1  # many tiles: the knob's split
    analyzer = sym.Analyzer()
    for tiles in (1, 2, 3, 4, 32):  # the kernel's expression (int32 PrimExprs), folded
        for steps in (64, 224):
            assert int(analyzer.simplify(gemm_k_splits(tvm.tirx.IntImm("int32", tiles), 16, steps, down_512))) == \
                gemm_k_splits(tiles, 16, steps, down_512)
    # no split at all (one block per tile and column block, no partials launch) only where the count allows it
    script = gemm_k(112, 128, 4096, "float16", "tc", "cuda", tile_knobs=(WgmmaK(),) * 3).script()
    assert "T.max(1, T.min(8," in script.replace("T.int32(", "(")
    script = gemm_k(8, 512, 4096, "float16", "tc", "cuda", tile_knobs=(WgmmaK(),) * 3).script()
    assert "T.max(1, T.min(4," in script.replace("T.int32(", "(")


def test_stream_k_shares_every_tiles_steps_out_once():
    """gemm_k's persistent grid (wgmma_stream_k.stream_k_body): the whole waves' tiles b, b + P, ... and the shares of
    the rest's K steps cover every tile's steps once; a block runs all of a tile or writes one partial slot (0: its
    first tile of the rest, begun before it; 1: its last), no two tiles share a block's slot, and the block owning a
    shared tile's first step finds exactly the blocks with a non-empty part of it, in order (the sum launch's walk).
    Shares are whole quarter tiles up to half a tile, else whole tiles."""
    from wide_tvm.schedules.wgmma_stream_k import STREAM_K_OFFSETS, stream_k_owner, stream_k_share, stream_k_start

    assert [stream_k_share(r * 224, 132, 224) for r in (1, 12, 33, 60, 66, 67, 80, 131)] == [56] * 3 + [112] * 2 + [
        224] * 3
    for tiles, ks, blocks in itertools.product((1, 2, 5, 80, 131, 132, 133, 144, 264, 512), (1, 7, 64, 224),
                                               (2, 3, 132)):
        waves, rest_tiles = tiles // blocks, tiles % blocks
        rest = rest_tiles * ks
        share = stream_k_share(rest, blocks, ks)
        q = ks // STREAM_K_OFFSETS if ks % STREAM_K_OFFSETS == 0 else ks  # shares: whole quarter tiles (or tiles)
        assert share * blocks >= rest and share % q == 0 and (share == ks or 2 * share <= ks)
        start = [stream_k_start(rest, b, share) for b in range(blocks + 1)]
        whole, slots, parts = {}, {}, {}
        for b in range(blocks):
            for k in range(waves):
                assert b + k * blocks not in whole
                whole[b + k * blocks] = b
            for r in range(start[b] // ks, (start[b + 1] + ks - 1) // ks):
                lo, hi = max(start[b], r * ks) - r * ks, min(start[b + 1], r * ks + ks) - r * ks
                if (lo, hi) == (0, ks):
                    assert waves * blocks + r not in whole
                    whole[waves * blocks + r] = b
                else:  # (an empty share, only where there are fewer steps than blocks, writes zeros no sum reads)
                    assert (b, int(lo == 0)) not in slots
                    slots[b, int(lo == 0)] = r
                    if hi > lo:
                        parts.setdefault(r, []).append((lo, hi, b))
        assert all(t in whole for t in range(waves * blocks))
        for r in range(rest_tiles):  # the sum launch takes every tile of the rest when a share is under a tile
            assert (waves * blocks + r in whole) == (share == ks)
            if waves * blocks + r in whole:
                assert r not in parts
                continue
            first, last = stream_k_owner(r * ks, share), stream_k_owner(r * ks + ks - 1, share)
            walk = list(range(first, last + 1))
            assert all(start[b] < start[b + 1] for b in walk)
            assert [b for _, _, b in sorted(parts[r])] == walk, (tiles, ks, blocks, r)
            assert all(slots[b, int(start[b] <= r * ks)] == r for b in walk)
            edges = [e for lo, hi, _ in sorted(parts[r]) for e in (lo, hi)]
            assert edges[0] == 0 and edges[-1] == ks and all(a == b for a, b in zip(edges[1:-1:2], edges[2:-1:2]))


def test_stream_k_splits_a_rest_of_more_than_half_a_wave_in_aligned_parts():
    """A rest of R > P / 2 tiles (wgmma_stream_k.stream_k_parts): s aligned parts a tile where that takes fewer waves of
    a segment's time than whole tiles and each part keeps STREAM_K_PART_STEPS K steps (down's 224 steps, R = 80: 3
    parts, 2 / 3 of a tile; O's 64 steps: never), at most STREAM_K_SLOTS partial slots a block; block b's segments b,
    b + P, ... (stream_k_segment) run every rest tile's K steps once, a tile's parts in order, each segment in its own
    slot. The int and PrimExpr forms agree."""
    import tvm.sym
    from tvm import tirx

    from wide_tvm.schedules.wgmma_stream_k import (STREAM_K_PART_STEPS, STREAM_K_SLOTS, stream_k_parts,
                                                   stream_k_segment)

    rests = (1, 66, 67, 80, 88, 89, 96, 99, 100, 131)
    assert [stream_k_parts(r, 132, 224) for r in rests] == [1, 1, 3, 3, 3, 1, 1, 1, 1, 1]
    assert {stream_k_parts(r, 132, 64) for r in range(132)} == {1}
    n = tirx.Var("n", "int32")
    for ks in (64, 224):
        expr = stream_k_parts(n, 132, ks)
        for r in range(132):
            analyzer = tvm.sym.Analyzer()
            analyzer.bind(n, r)
            assert int(analyzer.simplify(expr)) == stream_k_parts(r, 132, ks)
    for blocks, ks in itertools.product((3, 5, 132), (1, 7, 64, 192, 224)):
        for rest in range(1, blocks):
            parts = stream_k_parts(rest, blocks, ks)
            if parts == 1:
                continue
            assert 2 * rest > blocks and parts * rest <= STREAM_K_SLOTS * blocks and ks // parts >= STREAM_K_PART_STEPS
            assert (parts * rest + blocks - 1) // blocks < parts  # fewer segment waves than whole tiles' one x parts
            covered = {}
            for b in range(blocks):
                for j in range(b, parts * rest, blocks):
                    r, lo, hi = stream_k_segment(j, rest, parts, ks)
                    covered.setdefault(r, []).append((lo, hi, j))
            for r in range(rest):
                runs = sorted(covered[r])
                assert [j for _, _, j in runs] == [p * rest + r for p in range(parts)]  # the sum's order, its slots
                edges = [e for lo, hi, _ in runs for e in (lo, hi)]
                assert edges[0] == 0 and edges[-1] == ks and edges[1:-1:2] == edges[2:-1:2]


def _tensor_map_calls(func) -> list:
    """The tensormap_encode_tiled calls of a PrimFunc, as lists of their int arguments after the two pointers."""
    import re

    return [[int(v) for v in m.split(", ")]
            for m in re.findall(r"T\.tensormap_encode_tiled\(\w+, \w+\.data, ([\d, ]+), descriptor", func.script())]


def test_split_tail_covers_the_last_waves_k_steps_once():
    """gemm_mn's split tail (wgmma_tiles.tail_pass): a rest of R tiles past the whole waves is split only when
    0 < R <= half a wave, into S shares of at least a K step, R x S blocks at most a wave (the partial slots, the
    helper blocks); the shares of a tile run its K steps once, in order; the knob's most shares is honoured."""
    from wide_tvm.knobs import TAIL_SHARES
    from wide_tvm.schedules.wgmma_tiles import tail_share_steps, tail_shares

    assert tail_shares(266, 132, 8, 64) == 8 and tail_shares(266, 132, 16, 64) == 16  # Q at 4096: R = 2
    assert tail_shares(264, 132, 8, 64) == 1 and tail_shares(256, 132, 8, 64) == 1  # none past; R = 124 > 66
    assert tail_shares(64, 132, 8, 64) == 2 and tail_shares(66, 132, 16, 2) == 2 and tail_shares(67, 132, 8, 64) == 1
    for tiles, most, steps in itertools.product(range(1, 700), TAIL_SHARES, (1, 2, 3, 64)):
        shares, rest = tail_shares(tiles, 132, most, steps), tiles % 132
        assert 1 <= shares <= min(most, steps)
        if shares == 1:
            continue
        assert 0 < rest <= 66 and rest * shares <= 132
        runs = [tail_share_steps(s, shares, steps) for s in range(shares)]
        assert all(n >= 1 for _, n in runs) and [k for k, _ in runs] == list(itertools.accumulate(
            [0] + [n for _, n in runs[:-1]])) and sum(n for _, n in runs) == steps


def test_pattern_order_is_a_knob_of_few_group_gemm_k_past_512_tokens():
    """Only gemm_k of at most 8 groups (O's head groups) orders its tokens by mask pattern, on the per-tile grid with
    lookahead; of the tuning spaces only its bucket past 512 tokens gets the candidates."""
    from wide_tvm.bench.workloads import ORDER_VARIANTS, WGMMA_VARIANTS, Workload, wgmma_fits
    from wide_tvm.tuning import space as ks

    order = ["wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="only the wgmma gemm_k orders its tokens"):
        tile_knob(order, "gemm_mn")
    with pytest.raises(ValueError, match="are a gemm_k's"):
        gemm_mn(8, 512, 4096, "float16", "tc", False, "cuda", tile_knobs=(tile_knob(order, K),) * 3)
    with pytest.raises(ValueError, match="at most 8 groups"):
        gemm_k(112, 128, 4096, "float16", "tc", "cuda", tile_knobs=(tile_knob(order, K),) * 3)
    with pytest.raises(ValueError, match="with lookahead"):  # 64-token tiles of groups of 32 have none
        gemm_k(6, 32, 256, "float16", "tc", "cuda", tile_knobs=(WgmmaK(64, 1, 4, order=1),) * 3)
    fits = {(kind, g, gs): [wgmma_fits(Workload("w", kind, g, gs, 4096, swiglu, "float16"), v) for v in ORDER_VARIANTS]
            for kind, g, gs, swiglu in (("gemm_mn", 8, 512, False), ("gemm_mn", 112, 128, True),
                                        ("gemm_k", 112, 128, False), ("gemm_k", 8, 512, False))}
    assert fits == {("gemm_mn", 8, 512): [False] * 3, ("gemm_mn", 112, 128): [False] * 3,
                    ("gemm_k", 112, 128): [False] * 3, ("gemm_k", 8, 512): [True] * 3}

    def spaces():
        return {(kind, g): [[v for v in ks.KnobTask(kind, g, gs, 4096, "float16", "tc", "tile", b, True).choices()[
            "variant"] if getattr(v, "order", 0)] for b in range(3)]
                for kind, g, gs in (("gemm_mn_swiglu", 112, 128), ("gemm_mn", 8, 512), ("gemm_k", 112, 128),
                                    ("gemm_k", 8, 512))}

    assert set(ORDER_VARIANTS) <= set(WGMMA_VARIANTS)
    assert spaces() == {("gemm_mn_swiglu", 112): [[], [], []], ("gemm_mn", 8): [[], [], []],
                        ("gemm_k", 112): [[], [], []], ("gemm_k", 8): [[], [], [tile_knob(v, K) for v in ORDER_VARIANTS]]}


def test_pattern_order_shares_skips_between_a_tiles_tokens():
    """The order the sorting launch produces (kernel_reference.ref_pattern_order: Gray-code rank of the pattern, stable) makes
    a 128-token tile of O's 4096 tokens run about 3 / 4 of its 8 groups under random 50 % masks (in token order:
    all of them) and fewer under skewed masks, as schedules/token_order.py says."""
    import numpy as np

    from wide_tvm.kernel_reference import ref_pattern_order as host_order

    def ran(mask, order, bt=128):  # groups a tile runs, over the tiles' groups
        m = mask[order]
        return sum(m[i:i + bt].any(0).sum() for i in range(0, len(m), bt)) / (-(-len(m) // bt) * m.shape[1])

    rng = np.random.default_rng(0)
    mask = (rng.random((4096, 8)) < 0.5).astype(np.int32)
    order = host_order(mask)
    assert sorted(order) == list(range(4096)) and ran(mask, np.arange(4096)) == 1.0
    assert 0.70 < ran(mask, order) < 0.80
    skewed = (rng.random((4096, 8)) < np.linspace(0.05, 0.95, 8)).astype(np.int32)
    assert ran(skewed, host_order(skewed)) < 0.70
    # stable: equal patterns keep their token order; Gray order: neighbouring patterns differ in one group
    keys = [tuple(r) for r in mask[order]]
    assert all(order[i] < order[i + 1] for i in range(4095) if keys[i] == keys[i + 1])
    runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]  # the patterns in their order
    assert len(runs) == len(set(runs)) == 256  # (every pattern occurs at this size)
    assert all(np.sum(np.array(a) != np.array(b)) == 1 for a, b in zip(runs, runs[1:]))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_pattern_order_builds_as_two_many_block_launches(tmp_path):
    """The mask-pattern sort for every group count it takes (1 .. 8) builds (nvcc) as tools/check_token_order.py
    builds it for the GPU check: a launch counting each block's patterns into its row of hist, then one placing the
    tokens from hist's column sums, both over a block per 256 tokens (the first form sorted in one block: 12.5 us of
    O's 193 at 4096 tokens on an H100). Its scratch is a row of 2^G counts a block."""
    import importlib.util
    import os

    from wide_tvm.schedules.token_order import THREADS, hist_size, pattern_order, sort_blocks
    from wide_tvm.knobs import order_groups_ok

    assert [sort_blocks(n) for n in (1, 256, 257, 4096)] == [1, 1, 2, 16] and THREADS == 256
    assert hist_size(8, 4096) == 16 * 256 and hist_size(3, 513) == 3 * 8
    assert order_groups_ok(8) and not order_groups_ok(9) and not order_groups_ok(0)
    with pytest.raises(ValueError, match="1 .. 8 groups"):
        pattern_order(9)
    path = os.path.join(os.path.dirname(__file__), "..", "tools", "check_token_order.py")
    spec = importlib.util.spec_from_file_location("check_token_order", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.build(str(tmp_path), str(tmp_path / "sort.cu"))
    src = (tmp_path / "sort.cu").read_text()
    for g in tool.GROUPS:
        count, place = (re.search(rf"void __launch_bounds__\(256\) sort{g}_kernel{suffix}\([^)]*\) \{{(.*?)\n}}\n",
                                  src, re.S) for suffix in ("", "_1"))
        assert count and place, g
        assert "atomicAdd" in count[1] and "hist_ptr[" in count[1] and "perm_ptr" not in count[0]
        assert "atomicAdd" not in place[1] and "perm_ptr[" in place[1]
        assert "smask_ptr[" in place[1] or "(smask_ptr +" in place[1]
        assert "griddepcontrol" in count[1] and "griddepcontrol" in place[1]  # as the library builds them
    assert (tmp_path / "sort.so").stat().st_size > 0


def test_mma_skip_is_a_knob_of_gemm_mns_tile_buckets():
    """The warpgroup MMA skip (mma_skip) is a candidate of gemm_mn's tile buckets (its split-tail form past 512 tokens
    only), never of gemm_k's."""
    from wide_tvm.bench.workloads import SKIP_VARIANTS, WGMMA_VARIANTS, Workload, tile_name
    from wide_tvm.tuning import space as ks

    assert set(SKIP_VARIANTS) <= set(WGMMA_VARIANTS)
    up = Workload("up", "gemm_mn", 112, 128, 4096, True, "float16")
    assert all(tile_name(up, v) == tile_knob(v, MN).name() and tile_knob(v, MN).name().endswith("m")
               for v in SKIP_VARIANTS)
    for kind, g, gs in (("gemm_mn_swiglu", 112, 128), ("gemm_mn_swiglu", 448, 32), ("gemm_mn", 8, 512),
                        ("gemm_k", 112, 128), ("gemm_k", 8, 512)):
        skips = [[v for v in ks.KnobTask(kind, g, gs, 4096, "float16", "tc", "tile", bucket, wgmma=True)
                  .choices()["variant"] if getattr(v, "mma_skip", 0)] for bucket in range(3)]
        if kind == "gemm_k":
            assert skips == [[], [], []], kind
        else:
            assert skips[0] == skips[1] and set(skips[1]) < set(skips[2]), (kind, skips)
            assert all(not v.tail for v in skips[1]) and any(v.tail for v in skips[2])


def test_split_tail_is_a_gemm_mn_knob_of_the_last_bucket():
    """Only gemm_mn splits its tail wave (gemm_k's persistent grid has stream-K), and only the bucket past 512
    tokens gets such candidates: below, the per-tile gemm_mn sorts its own tokens and never runs the split pass."""
    from wide_tvm.bench.workloads import TAIL_VARIANTS
    from wide_tvm.tuning import space as ks

    with pytest.raises(ValueError, match="only the wgmma gemm_mn splits its tail wave"):
        tile_knob(["wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8], K)
    tile_knob(["wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8], "gemm_mn").validate(_spec("gemm_mn", 512))
    for kind, gs in (("gemm_mn_swiglu", 128), ("gemm_mn", 512), ("gemm_k", 128)):
        variants = [ks.KnobTask(kind, 4096 // gs if kind == "gemm_mn" else 112, gs, 4096, "float16", "tc", "tile",
                                bucket, wgmma=True).choices()["variant"] for bucket in range(3)]
        if kind == "gemm_k":
            assert not any(getattr(v, "tail", 0) for v in variants[0] + variants[1] + variants[2])
            continue
        tails = [tile_knob(v, kind) for v in TAIL_VARIANTS]
        assert not any(v in variants[0] + variants[1] for v in tails) and all(v in variants[2] for v in tails)


@pytest.mark.parametrize("gs", [128, pytest.param(32, marks=pytest.mark.slow)])
def test_gemm_k_weight_tensor_map_boxes_a_k_step_of_the_tc_layout(gs):
    """Where every gemm_k thread copies, its weight tiles come by TMA: boxes of the "tc" weight. Walking the encoded
    map (dimensions, byte strides, box) over a packed weight, as the TMA does, gives the step's tile as nb x 32 K
    halves: a step of one group's (groups of 64 K or more) is one box of both halves, a step of two groups of 32 K
    one box of one half a group. The producer warps' ring keeps cp.async."""
    import numpy as np

    from wide_tvm.weight_layout import pack

    G, N = 6, 256
    chunks = 2 if gs % 64 == 0 else 1  # 32 K halves a box
    knobs = WgmmaK(rows=2)  # nb = 128
    (call,) = _tensor_map_calls(gemm_k(G, gs, N, "float16", "tc", "cuda", tile_knobs=(knobs,) * 3))
    dims, strides, box, steps = call[0:4], [2] + call[4:7], call[7:11], call[11:15]
    assert steps == [1, 1, 1, 1] and all(s % 16 == 0 for s in strides[1:]) and box == [32, 16, 128 // 16, chunks]
    w = np.random.default_rng(0).standard_normal((N, G * gs)).astype(np.float16)
    flat = pack(w, "tc").reshape(-1)

    def tile(coords):  # the box at `coords` (inner dimension first), in the order it lands in shared memory
        idx = np.zeros(box[::-1], dtype=np.int64)
        for d in range(4):
            assert 0 <= coords[d] and coords[d] + box[d] <= dims[d]
            shape = [1] * 4
            shape[3 - d] = box[d]
            idx = idx + (coords[d] + np.arange(box[d])).reshape(shape) * (strides[d] // 2)
        return flat[idx]

    for bx, k0 in ((0, 0), (1, 2 * gs), (1, (G - 3) * gs), (0, G * gs - 32 * chunks)):  # column block, first K
        got = tile([0, 0, bx * 128 // 16, k0 // 32])  # as tma_w addresses it (k0: a step's, or a group's with 32)
        want = w[bx * 128:(bx + 1) * 128, k0:k0 + 32 * chunks].reshape(128, chunks, 32).transpose(1, 0, 2)
        assert np.array_equal(got.reshape(chunks, 128, 32), want)
    # no map (cp.async weights) with producer warps
    assert not _tensor_map_calls(gemm_k(G, gs, N, "float16", "tc", "cuda",
                                        tile_knobs=(WgmmaK(rows=2, producer=1),) * 3))


def test_hopper_targets_get_wgmma():
    """Hopper stays sm_90 for TVM's own schedules (dlight reads "sm_90a" as no tensor cores) and gets sm_90a
    device code; other archs keep the mma.sync kernels."""
    cuda = parse_target("cuda")
    assert str(cuda.attrs["arch"]) == "sm_90" and has_wgmma(cuda)
    assert str(parse_target("cuda:sm_90a").attrs["arch"]) == "sm_90"
    assert not has_wgmma(parse_target("cuda:sm_80")) and not has_wgmma(parse_target("llvm"))
    assert target_folder(cuda) == "cuda-sm90"
    from tvm.s_tir.dlight.gpu.matmul import check_sm_version

    assert check_sm_version(str(cuda.attrs["arch"])) == 90  # TVM dense keeps its tensor-core schedules


def test_tuned_wgmma_picks_follow_the_target():
    from wide_tvm import kernel_spec
    from wide_tvm.passes.lower_gated import _State, _tuned

    key = kernel_spec.kernel_key("gemm_mn_swiglu", 112, 128, 4096, "float16")
    log = {key: {"tiles": [["gemv"], ["wgmma", 128, 2, 4], ["wgmma", 128, 4, 4]]}}
    hopper = _tuned(_State("cuda", {}, None, log, wgmma=True), "gemm_mn_swiglu", 112, 128, 4096, "float16")
    assert hopper["tile_knobs"] == (GEMV_TILES, WgmmaMN(rows=2), WgmmaMN())
    plain = _tuned(_State("cuda", {}, None, log), "gemm_mn_swiglu", 112, 128, 4096, "float16")
    assert plain["tile_knobs"] == (GEMV_TILES, SmemTile(), SmemTile())
    with pytest.raises(WideError, match="unusable knobs"):
        _tuned(_State("cuda", {}, None, {key: {"tiles": [["wgmma", 96, 4, 4]] * 3}}, wgmma=True),
               "gemm_mn_swiglu", 112, 128, 4096, "float16")
    assert DEFAULT_TILES[2].kernel == "smem"  # without a log no target needs sm_90a


def test_per_tile_wgmma_gemm_mn_sorts_its_tokens_up_to_512():
    """Up to SORT_TOKENS tokens a per-tile wgmma gemm_mn block ballots its group's mask column and places its
    tile's tokens itself, so no mask reorder launches in front of it: the reorder's bound in a compiled FFN, in
    MetaSchedule's timed call and in the benchmark follows the tuned picks of the leading token buckets (a
    persistent grid needs every group's count from the reorder; the gemv / mma.sync tiles read it too)."""
    import tvm_ffi

    from wide_tvm.bench.workloads import Workload
    from wide_tvm.passes.lower_gated import _reorder_bound, _State
    from wide_tvm.tuning import space as ks
    from wide_tvm.schedules import mask_reorder
    from wide_tvm.knobs import SORT_TOKENS, reorder_free_bound, sorts_tokens

    per_tile, persistent = WgmmaMN(rows=2, stages=6), WgmmaMN(producer=4, persistent=132)
    assert SORT_TOKENS == 512 and sorts_tokens(per_tile) and not sorts_tokens(persistent)
    assert not sorts_tokens(SmemTile()) and not sorts_tokens(GEMV_TILES)
    assert reorder_free_bound((per_tile, per_tile, per_tile)) == 512
    assert reorder_free_bound((per_tile, persistent, per_tile)) == 128  # 129-512 tokens: the persistent grid
    assert reorder_free_bound((persistent, per_tile, per_tile)) == 0
    assert reorder_free_bound(DEFAULT_TILES) == 0

    cuda = _State("cuda", {}, None, {}, wgmma=True)
    assert _reorder_bound(cuda, "tc", {"tile_knobs": (per_tile, per_tile, per_tile)}) == 512
    assert _reorder_bound(cuda, "tc", {"tile_knobs": (per_tile, persistent, per_tile)}) == 128
    assert _reorder_bound(cuda, "tc", {}) == _reorder_bound(cuda, "tc") == 32  # untuned: the direct kernels'

    # the sorting pass: a ballot over the mask, no counts / order; the persistent grid has none
    assert "__ballot_sync" in gemm_mn(4, 64, 256, "float16", "tc", True, "cuda", tile_knobs=(per_tile,) * 3).script()
    assert "__ballot_sync" not in gemm_mn(4, 64, 256, "float16", "tc", True, "cuda",
                                          tile_knobs=(persistent,) * 3).script()

    # MetaSchedule times a gemm_mn tile candidate with the reorder a model runs in front of it
    task = ks.KnobTask("gemm_mn_swiglu", 4, 64, 256, "float16", "tc", "tile", 1, wgmma=True)
    for variant, bound in ((WgmmaMN(rows=2, stages=6), 512), (WgmmaMN(producer=4, persistent=132), 32)):
        assert tvm_ffi.structural_hash(ks.task_reorder(task, {"variant": variant})) == \
            tvm_ffi.structural_hash(mask_reorder(4, "cuda", bound))
    assert ks.task_reorder(ks.KnobTask("gemm_k", 4, 64, 256, "float16", "tc", "tile", 1, wgmma=True),
                           {"variant": WgmmaK(rows=2, stages=6)}) is None
    # ... and the benchmark its gemm_mn rows
    assert Workload("q", "gemm_mn", 4, 64, 256, sorts=512).reorder == "bench_reorder_g4_d512"
    assert Workload("q", "gemm_mn", 4, 64, 256, sorts=0).reorder == "bench_reorder_g4_d32"


@pytest.mark.slow
def test_gemm_k_hands_33_to_64_tokens_to_its_wgmma_gemm():
    """Where gemm_k's many-token kernel is the wgmma GEMM, its direct kernels stop at 32 tokens (the wgmma GEMM
    is faster at 33-64 on the H200). gemm_k reads the mask itself at every count, so the mask reorder in front of it
    depends only on gemm_mn: up to gemm_mn's direct bound in an FFN, never for a projection that only gemm_k
    consumes, always on the CPU."""
    import re

    from wide_tvm.passes.lower_gated import _reorder_bound, _State
    from wide_tvm.knobs import UNREAD
    from wide_tvm.knobs import direct_bound

    def bounds(func):
        return sorted(int(b) for b in re.findall(r"n <= T\.int64\((\d+)\)", func.script()))

    wg, wg_mn = (WgmmaK(rows=1),) * 3, (WgmmaMN(rows=1),) * 3
    assert bounds(gemm_k(4, 64, 256, "float16", "tc", "cuda")) == [1, 8, 16, 32, 64, 128]
    assert bounds(gemm_k(4, 32, 256, "float16", "tc", "cuda", tile_knobs=wg)) == [1, 8, 16, 32]
    # (and up to 512 tokens gemm_mn's per-tile wgmma blocks sort their tokens themselves)
    assert bounds(gemm_mn(4, 64, 256, "float16", "tc", True, "cuda", tile_knobs=wg_mn)) == [1, 8, 16, 32, 512]
    assert (direct_bound("gemm_k", wg, 32), direct_bound("gemm_k", DEFAULT_TILES, 64)) == (32, 64)
    assert direct_bound("gemm_mn", wg_mn, 64) == direct_bound("gemm_mn_swiglu", DEFAULT_TILES, 64) == 32

    cuda = _State("cuda", {}, None, {}, wgmma=True)
    assert _reorder_bound(cuda, "tc") == 32 and _reorder_bound(cuda, "nk") == 0  # the FFN's gate/up decides
    assert _reorder_bound(cuda, None) == UNREAD  # a projection: gemm_k alone
    assert _reorder_bound(_State("llvm", {}, None, {}), None) == 0  # the CPU gemm_k walks the reorder's lists
    # the gemm_k kernels take counts / order / used but no path of theirs reads them on CUDA (the CPU one does)
    for script in (gemm_k(4, 64, 256, "float16", "tc", "cuda", tile_knobs=wg).script(),
                   gemm_k(4, 64, 256, "float32", "nk", "cuda").script()):
        assert not re.search(r"(?<![\w.])(counts|order|used)\[", script)
    assert re.search(r"(?<![\w.])used\[", gemm_k(4, 64, 256, "float32", "nk", "llvm").script())


@pytest.mark.slow
def test_narrow_wgmma_tiles_take_17_to_32_tokens():
    """A wgmma pick whose tiles cover a group's tokens narrowly takes over from the direct kernels past 16 tokens
    (knobs.TILE_TAKEOVER): gemm_mn's swapped tiles and gemm_k's for groups of a K step (64) or more; gemm_k with
    groups of 32 and unswapped gemm_mn picks keep theirs to 32, non-wgmma picks to their own bounds. The
    reorder-free bound of a sorting gemm_mn does not move. Pinned to the bound before it (32), the kernels are the
    ones built before (what tools/restamp_records.py --set relies on)."""
    import re

    from wide_tvm import knobs
    from wide_tvm.schedules import gemm_mn_reorder_bound

    def bounds(func):
        return sorted(int(b) for b in re.findall(r"n <= T\.int64\((\d+)\)", func.script()))

    swapped = (WgmmaMN(24, 2, 4, swap=1),) * 3
    plain, plain_mn = (WgmmaK(rows=1),) * 3, (WgmmaMN(rows=1),) * 3
    assert bounds(gemm_mn(4, 64, 128, "float16", "tc", True, "cuda", tile_knobs=swapped)) == [1, 8, 16, 512]
    assert bounds(gemm_mn(4, 64, 128, "float16", "tc", True, "cuda", tile_knobs=plain_mn)) == [1, 8, 16, 32, 512]
    assert bounds(gemm_k(4, 64, 256, "float16", "tc", "cuda", tile_knobs=plain)) == [1, 8, 16]
    assert bounds(gemm_k(4, 32, 256, "float16", "tc", "cuda", tile_knobs=plain)) == [1, 8, 16, 32]
    assert [knobs.direct_bound(k, swapped, 64) for k in ("gemm_mn", "gemm_mn_swiglu", "gemm_k")] == [16, 16, 16]
    assert knobs.direct_bound("gemm_k", plain, 128) == 16 and knobs.direct_bound("gemm_k", plain, 32) == 32
    assert knobs.direct_bound("gemm_k", DEFAULT_TILES, 128) == 64
    assert gemm_mn_reorder_bound(swapped) == 512
    try:
        knobs.TILE_TAKEOVER = 32
        pinned = [gemm_mn(4, 64, 128, "float16", "tc", True, "cuda", tile_knobs=swapped),
                  gemm_k(4, 64, 256, "float16", "tc", "cuda", tile_knobs=plain)]
    finally:
        knobs.TILE_TAKEOVER = 16
    assert [bounds(f) for f in pinned] == [[1, 8, 16, 32, 512], [1, 8, 16, 32]]


def _compile_cases(cases: list, export: str | None) -> str:
    """CUDA source of the wgmma cases [(name, "mn" or "k", shape, knob entry)] compiled in one module for a plain
    sm_90 target (not through parse_target); exported to `export` if given."""
    funcs = {}
    for name, kind, shape, v in cases:
        kn = (tile_knob(v, MN if kind == "mn" else K),) * 3
        funcs[name] = (gemm_mn(*shape[:3], "float16", "tc", shape[3], "cuda", tile_knobs=kn) if kind == "mn"
                       else gemm_k(*shape, "float16", "tc", "cuda", tile_knobs=kn))
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target:
        lib = tvm.compile(tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in funcs.items()}), target)
    if export:
        lib.export_library(export)
    return lib.mod.imports[0].inspect_source()


WGMMA_FAMILIES = {  # (the two halves build in parallel under pytest-xdist)
    "gemm_mn": [("mn0", "mn", (4, 64, 128, True), ("wgmma", 128, 4, 4)),
                ("q1", "mn", (2, 512, 64, False), ("wgmma", 128, 2, 6, 4)),
                ("mnp", "mn", (4, 64, 128, True), ("wgmma", 128, 4, 4, 1, 4, 132)),
                ("mns", "mn", (4, 64, 128, True), ("wgmma", 48, 1, 8, 1, 0, 0, 1, 256)),
                ("mnt", "mn", (4, 64, 128, True), ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8)),
                ("mnm", "mn", (4, 64, 128, True), ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 0, 0, 1))],
    "gemm_k": [("k0", "k", (3, 64, 256), ("wgmma", 128, 4, 4)),
               ("kx", "k", (4, 64, 256), ("wgmma", 128, 4, 4, 1, 0, 132)),
               ("ko", "k", (8, 64, 256), ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 1)),
               ("k32", "k", (5, 32, 256), ("wgmma", 128, 2, 6, 4))],
}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("family", ["gemm_k", pytest.param("gemm_mn", marks=pytest.mark.slow)])  # (CI time: 78 s;
def test_wgmma_kernel_families_build(tmp_path, family):  # test_per_tile_wgmma_gemm_mn_sorts_.. builds a gemm_mn)
    """A sample of every wgmma kernel family compiles to sm_90a device code (test_wgmma_kernels_build_for_every_knob,
    in the slow suite, builds every knob candidate): gemm_mn per tile (sorting its tokens), split over blocks, with
    producer warps on a persistent grid, with swapped operands and an L2 prefetch, with a split tail, with warpgroups
    skipping their wgmmas; gemm_k with TMA weights, on the stream-K grid, over pattern-ordered tokens, with groups of
    32."""
    cases = WGMMA_FAMILIES[family]
    src = _compile_cases(cases, str(tmp_path / "a.so"))
    assert all(f"{name}_kernel" in src for name, *_ in cases)
    assert "mbarrier.try_wait.parity" in src
    if family == "gemm_mn":
        for n in (48, 128):  # (48: the swapped tile's tokens as wgmma's N)
            assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in src
        assert "cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" in src  # the swapped gate/up's L2 prefetch
        assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in src  # producer warps
        assert "__ballot_sync" in src  # the per-tile gemm_mn sorts its tokens
    else:
        assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in src or \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in src
        assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in src  # gemm_k's TMA
    assert b"sm_90a" in open(tmp_path / "a.so", "rb").read()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_wgmma_kernels_build_for_every_knob(tmp_path):
    """gate/up (groups of 32 and 64), Q-like (several blocks per group) and gemm_k (also split over blocks, and with
    groups of 32) at every swept wgmma knob set compile to sm_90a device code (cuda_aot.cuda_codegen, called when this
    module is imported, registers the sm_90 -> sm_90a device compile, so a plain sm_90 target works too):
    asynchronous wgmmas with descriptors, a zero-filling cp.async ring in dynamic shared memory. (The default suite
    builds a sample of each family: test_wgmma_kernel_families_build.)"""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from wide_tvm.bench.workloads import ORDER_VARIANTS, STREAM_K_VARIANTS, WGMMA_VARIANTS

    cases = []
    # an L2-prefetching variant differs from its base only in the weight copies' PTX: one of them builds
    l2 = [v for v in WGMMA_VARIANTS if len(v) > 8 and v[8]]
    for i, v in enumerate(v for v in WGMMA_VARIANTS
                          if v not in l2[1:] and v not in STREAM_K_VARIANTS and v not in ORDER_VARIANTS):
        # every set builds gemm_mn, those splitting K too (Q: one K step over 4 or 8 blocks, most of them empty)
        cases += [(f"mn{i}", "mn", (4, 64, 128, True), v), (f"q{i}", "mn", (2, 512, 64, False), v)]
        if len(v) < 7:  # only gemm_mn runs on a persistent grid with producer warps or swaps its operands
            cases.append((f"k{i}", "k", (3, 64, 256), v))
    # gemm_k's persistent grid (stream-K, gemm_k's alone): 4 K steps, so that a share can be a quarter tile
    for i, v in enumerate(STREAM_K_VARIANTS):
        cases.append((f"kx{i}", "k", (4, 64, 256), v))
    cases.append(("g32mn", "mn", (6, 32, 64, True), ("wgmma", 128, 4, 4)))  # (not mn{i}: a name of its own)
    # gemm_k over tokens ordered by mask pattern (gemm_k's alone, at most 8 groups), one of them split over blocks
    for i, v in enumerate(ORDER_VARIANTS + (("wgmma", 128, 2, 6, 2, 0, 0, 0, 0, 0, 1),)):
        cases.append((f"ko{i}", "k", (8, 64, 256), v))
    # two groups a K step: 128-token tiles (with lookahead), 64-token ones (without), producer warps
    for name, v in (("k32", ("wgmma", 128, 2, 6, 4)), ("k32s", ("wgmma", 64, 1, 4)),
                    ("k32p", ("wgmma", 64, 1, 4, 1, 1)), ("k32x", ("wgmma", 128, 4, 4, 1, 0, 132))):
        cases.append((name, "k", (8 if name == "k32x" else 5, 32, 256), v))  # (stream-K: 4 K steps, as above)
    # two halves, each compiled (nvcc included) in a process of its own: both cores
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        halves = list(pool.map(_compile_cases, (cases[::2], cases[1::2]), (str(tmp_path / "a.so"), None)))
    src = "".join(halves)
    for n in (64, 128, 256):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in src
    for n in (32, 48, 80, 144, 208):  # swapped operands: the token tile is wgmma's N
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in src
    assert "wgmma.wait_group.sync.aligned 1;" in src and "fence.proxy.async.shared::cta;" in src
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in src and "extern __shared__" in src
    assert "cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" in src  # the weights' L2 prefetch knob
    # gemm_k's weight tiles by TMA (every thread copying): a tensor map kernel parameter
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in src
    assert "mbarrier.arrive.expect_tx.shared::cta.b64" in src and "const __grid_constant__ CUtensorMap" in src
    # warp-specialised variants: producer copies complete on mbarriers the warpgroups wait for
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in src and "mbarrier.try_wait.parity" in src
    assert "__launch_bounds__(384)" in src  # 2 warpgroups + 4 producer warps
    kernels = src.split('extern "C" __global__')[1:]
    wgmma_mn = [k for k in kernels if "wgmma" in k and "wg_ptr" in k.split("{")[0]]  # gemm_mn's (wgmma helpers)
    # per-tile gemm_mn up to 512 tokens: its blocks sort their tokens (a ballot) and read no reorder; past that, and
    # on the persistent grid, they read its order
    assert any("__ballot_sync" in k and "order_ptr" not in k.split("{")[0] for k in wgmma_mn)
    assert any("__ballot_sync" not in k and "order_ptr" in k.split("{")[0] for k in wgmma_mn)
    assert b"sm_90a" in open(tmp_path / "a.so", "rb").read()  # built for Hopper's arch-specific features
    # gemm_k's fp16 tile leaves through shared memory, 16 bytes a store, none straight from an accumulator; a split
    # knob's kernel (which always splits K) is as it was: fp32 partials 4 bytes a thread, and an fp16 branch that
    # never runs
    staged = {}
    for name, kind, _, v in cases:
        if kind == "k":
            body = [k for k in kernels if re.match(rf" void __launch_bounds__\(\d+\) {name}_kernel", k) and "wgmma" in k]
            assert len(body) == 1, name
            direct = re.search(r"out_ptr\[[^\n]*\] = \(\(half\)acc_ptr\[", body[0]) is not None
            # ... and an unsplit knob's fp32 partials (where few token tiles split it) leave 8 bytes a thread
            staged[name] = "*(uint4*)(out_ptr" in body[0] and "*(float2*)(ws_ptr" in body[0] and not direct
            assert staged[name] == (tile_knob(v, K).ksplit == 1), (name, v)
    assert any(staged.values()) and not all(staged.values())
    # ordered gemm_k: the sort's two launches (each block counts its tokens' patterns with shared-memory atomics into
    # its row of hist; then places them from hist's column sums, with no atomics), then the GEMM whose copies and
    # stores go through the order
    for name, kind, _, v in cases:
        if name.startswith("ko"):
            mine = [k for k in kernels if re.match(rf" void __launch_bounds__\(\d+\) {name}_kernel", k)]
            sorts = [k for k in mine if re.match(r" void __launch_bounds__\(\d+\) \w+\([^)]*hist_ptr[^)]*\) \{", k)]
            assert len(sorts) == 2, name
            assert sum("atomicAdd" in k and "__ballot_sync" in k and "perm_ptr" not in k.split("{")[0]
                       for k in sorts) == 1, name
            assert sum("atomicAdd" not in k and "__ballot_sync" in k and "perm_ptr[" in k and "smask_ptr" in k
                       for k in sorts) == 1, name
            assert any("wgmma" in k and "pre_ptr" in k and re.search(r"out_ptr( \+ |\[)\(+\(int64_t\)perm_ptr\[", k)
                       for k in mine), name  # (through the ring, or a split knob's fragments: rows at their tokens)
    # gemm_k's stream-K grid restarts its TMA mbarriers' phases at each tile it takes up
    assert "mbarrier.inval.shared::cta.b64" in src
    # every kernel initialises its mbarriers behind a block barrier before a thread waits on one (without it, O over
    # ordered tokens crashed within 2000 back-to-back calls on the H200)
    inits = [k for k in kernels if "mbarrier_init_init" in k]
    assert len(inits) >= 8
    for k in inits:
        after = k[k.index("mbarrier_init_init"):]
        assert "__syncthreads();" in after[:after.index("mbarrier_wait")], k.split("(")[1][:60]
    # gemm_mn on the per-tile grid (operands not swapped) stores an unsplit tile through shared memory into its
    # tokens' rows and a split one's fp32 partials 8 bytes a thread; swapped and persistent kernels store fragments.
    # Reading the reorder's order (past SORT_TOKENS) an unsplit per-tile kernel (gate/up or Q) writes no zeros: a
    # second launch writes them where the mask says a token skips a group; sorting its tokens (up to SORT_TOKENS) it
    # writes them itself
    ZERO = "make_uint4(__pack_half2(__float2half_rn(0x0p+0f"
    kinds = set()
    for name, kind, _, v in cases:
        if kind == "mn":
            kn = tile_knob(v, MN)
            bodies = [k for k in kernels
                      if re.match(rf" void __launch_bounds__\(\d+\) {name}_kernel", k) and "wgmma" in k]
            assert bodies, name
            for body in bodies:
                direct = re.search(r"out_ptr\[[^\n]*\] = \(\(half\)\(*acc_ptr\[", body) is not None
                through_ring = re.search(r"\*\(uint4\*\)\(out_ptr [^\n]*= \*\(uint4\*\)\(xs_ptr", body) is not None
                pairs = "*(float2*)(ws_ptr" in body
                if kn.swap or kn.persistent:
                    assert (through_ring, pairs) == (False, False), (name, v)
                elif kn.ksplit > 1:
                    assert (through_ring, pairs, direct) == (False, True, False), (name, v)
                elif kn.tail and pairs:  # the split pass (past 512 tokens): whole tiles, or a share's partials
                    assert (through_ring, direct) == (True, False), (name, v)
                else:
                    assert (through_ring, pairs, direct) == (True, False, False), (name, v)
                kinds.add((bool(kn.swap or kn.persistent), kn.ksplit > 1))
                if not kn.persistent and kn.ksplit == 1:
                    assert (ZERO in body) == ("order_ptr" not in body.split("{")[0]), (name, v)
            # an unsplit per-tile kernel's second launch: zeros from the mask, 16 bytes a thread
            zeros = [k for k in kernels if re.match(rf" void __launch_bounds__\(256\) {name}_kernel", k)
                     and k.split("{")[0].count("_ptr") == 2 and "mask_ptr" in k.split("{")[0] and ZERO in k]
            assert len(zeros) == (kn.ksplit == 1 and not kn.persistent), (name, v)
            # a warpgroup whose rows are all past the group's count runs a copy of the K loop without wgmmas (a
            # fence and an empty commit a step): two K loops, the same wgmmas
            for body in bodies:
                commits = body.count("wgmma_commit_group_commit_group_sync_aligned()")
                mmas = len(re.findall(r"wgmma_f16_ss_mma_async_sync_aligned_m64n\d+k16", body))
                assert commits and mmas == (2 if kn.mma_skip else 4) * commits, (name, v, commits, mmas)
            if kn.tail:  # ... and a split tail's: the shares' partials summed, then written to the tokens' rows
                assert any("*(float2*)(ws_ptr" in b for b in bodies), (name, v)
                assert any(re.match(rf" void __launch_bounds__\(256\) {name}_kernel", k) and "hdr_ptr" in k
                           and "order_ptr" in k.split("{")[0] for k in kernels), (name, v)
    assert kinds == {(False, False), (False, True), (True, False), (True, True)}
    assert any(tile_knob(v, MN).mma_skip for _, kind, _, v in cases if kind == "mn")
    # ptxas keeps every kernel's wgmmas asynchronous (C7514: serialised, e.g. by accumulator reads it cannot
    # place after the K loop's last wait; C7515 / C7520: by the MMA skip's branch, unless each branch drains its own
    # wgmmas)
    for i, half in enumerate(halves):
        (tmp_path / f"h{i}.cu").write_text(half)
        res = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / f"h{i}.cubin"),
                              str(tmp_path / f"h{i}.cu")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "serialized" not in res.stdout + res.stderr, [ln for ln in res.stderr.splitlines() if "C75" in ln]
