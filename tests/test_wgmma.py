"""The Hopper wgmma tile GEMMs (schedules/wgmma_gemm.py): knobs, shapes they refuse, targets that get them, and
device code for every knob (nvcc, sm_90a). Their numerics are checked on the H200 by tools/gpu_check.py."""

from __future__ import annotations

import shutil

import pytest

from wide_tvm.cuda_aot import prepare_cuda_aot

prepare_cuda_aot()

import tvm  # noqa: E402

from wide_tvm.errors import WideError  # noqa: E402
from wide_tvm.schedules import gemm_k, gemm_mn  # noqa: E402
from wide_tvm.schedules.tile_gemm import DEFAULT_TILES, GEMV_TILES, TileKnobs, tile_knob, tile_knobs  # noqa: E402
from wide_tvm.schedules.wgmma_gemm import (WGMMA_TILES, check_wgmma_shape, ring_bytes, ring_layout,  # noqa: E402
                                           wgmma_n)
from wide_tvm.targets import has_wgmma, parse_target, target_folder  # noqa: E402


def test_wgmma_knobs_parse_name_and_validate():
    assert tile_knob(["wgmma", 128, 4, 4]) == WGMMA_TILES and WGMMA_TILES.name() == "wg128n256s4"
    assert tile_knob(["wgmma", 64, 2, 5]).name() == "wg64n128s5"
    assert tile_knob(["wgmma", 128, 2, 6, 4]) == TileKnobs(128, 2, 6, 1, "wgmma", 4)
    assert tile_knob(["wgmma", 128, 2, 6, 4]).name() == "wg128n128s6k4"
    assert tile_knob(["wgmma", 128, 4, 4, 1, 1]) == TileKnobs(128, 4, 4, 1, "wgmma", 1, 1)  # one producer warp
    assert tile_knob(["wgmma", 128, 4, 4, 1, 1]).name() == "wg128n256s4p1"
    assert tile_knob(["wgmma", 128, 2, 6, 4, 2]).name() == "wg128n128s6k4p2"
    assert tile_knob(["wgmma", 128, 4, 4, 1, 4, 132]).name() == "wg128n256s4p4x132"  # a persistent grid of 132
    for bad, why in ((["wgmma", 192, 4, 3], "tokens must be one of"), (["wgmma", 128, 5, 4], "rows 1..4"),
                     (["wgmma", 128, 4, 2], "stages >= 3"), (["wgmma", 128, 4], "expected \\['wgmma'"),
                     (["wgmma", 128, 4, 4, 0], "ksplit >= 1"), (["wgmma", 128, 4, 4, 1, 3], "producer warps one of"),
                     (["wgmma", 128, 4, 4, 1, 0, 132], "persistent grid needs producer warps"),
                     ([128, 1, 3, 1, "smem", 2], "only the wgmma GEMMs"),
                     ([128, 1, 3, 1, "smem", 1, 1], "only the wgmma GEMMs")):
        with pytest.raises(ValueError, match=why):
            tile_knob(bad)
    # a target without wgmma (not sm_90a) keeps the other picks and gets the mma.sync tile GEMM for wgmma ones
    log = [["gemv"], [64, 1, 3, 1], ["wgmma", 128, 4, 4]]
    assert tile_knobs(log)[2] == WGMMA_TILES
    assert tile_knobs(log, wgmma=False) == (GEMV_TILES, TileKnobs(64, 1, 3, 1), TileKnobs())


def test_wgmma_tiles_and_shared_memory():
    assert wgmma_n(128, True, WGMMA_TILES) == (256, 128)  # gate and up of one 128-channel group side by side
    assert wgmma_n(32, True, WGMMA_TILES) == (64, 32)  # a 32-channel group: N 64
    assert wgmma_n(512, False, WGMMA_TILES) == (256, 256)  # Q: two blocks per 512-channel group
    assert ring_bytes(WGMMA_TILES, 256) == 4 * (128 + 256) * 128 + 1024  # 4 stages of 48 KB, under the 227 KB
    ws = TileKnobs(128, 4, 4, 1, "wgmma", 1, 1)
    assert ring_bytes(ws, 256) == ring_bytes(WGMMA_TILES, 256) + 4 * 16  # + a full and an empty mbarrier a stage
    assert ring_layout(ws, 256) == (288, 256, 32, 128 * 128, (128 + 256) * 128)  # 2 warpgroups + 1 producer warp
    assert ring_layout(WGMMA_TILES, 256).copiers == 256 and ring_layout(ws, 256).copier0 == 256
    check_wgmma_shape(32, 4096, WGMMA_TILES)  # gemm_k: groups of 32 go two to a 64-wide K step
    for gs in (16, 96):  # ... other group slices must be whole K steps
        with pytest.raises(ValueError, match="group size that is 32 or a multiple of 64"):
            check_wgmma_shape(gs, 4096, WGMMA_TILES)
    with pytest.raises(ValueError, match="K a multiple of 64"):
        gemm_mn(4, 16, 96, "float16", "tc", True, "cuda", tile_knobs=(WGMMA_TILES,) * 3)
    with pytest.raises(ValueError, match="not the wgmma GEMM's"):
        check_wgmma_shape(128, 4096, TileKnobs(), True)
    check_wgmma_shape(128, 4096, TileKnobs(128, 4, 4, 1, "wgmma", 2), True)  # gemm_mn splits K too
    with pytest.raises(ValueError, match="a persistent grid does not split K"):
        check_wgmma_shape(128, 4096, TileKnobs(128, 4, 4, 1, "wgmma", 2, 4, 132), True)
    with pytest.raises(ValueError, match="only the wgmma gemm_mn runs on a persistent grid"):
        check_wgmma_shape(128, 4096, TileKnobs(128, 4, 4, 1, "wgmma", 1, 4, 132))


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
    from wide_tvm import kernel_knobs
    from wide_tvm.passes.lower_gated import _State, _tuned

    key = kernel_knobs.kernel_key("gemm_mn_swiglu", 112, 128, 4096, "float16")
    log = {key: {"tiles": [["gemv"], ["wgmma", 128, 2, 4], ["wgmma", 128, 4, 4]]}}
    hopper = _tuned(_State("cuda", {}, None, log, wgmma=True), "gemm_mn_swiglu", 112, 128, 4096, "float16")
    assert hopper["tile_knobs"] == (GEMV_TILES, TileKnobs(128, 2, 4, 1, "wgmma"), WGMMA_TILES)
    plain = _tuned(_State("cuda", {}, None, log), "gemm_mn_swiglu", 112, 128, 4096, "float16")
    assert plain["tile_knobs"] == (GEMV_TILES, TileKnobs(), TileKnobs())
    with pytest.raises(WideError, match="unusable knobs"):
        _tuned(_State("cuda", {}, None, {key: {"tiles": [["wgmma", 96, 4, 4]] * 3}}, wgmma=True),
               "gemm_mn_swiglu", 112, 128, 4096, "float16")
    assert DEFAULT_TILES[2].kernel == "smem"  # without a log no target needs sm_90a


def test_gemm_k_hands_33_to_64_tokens_to_its_wgmma_gemm():
    """Where gemm_k's many-token kernel is the wgmma GEMM, its direct kernels stop at 32 tokens (the wgmma GEMM
    is faster at 33-64 on the H200). gemm_k reads the mask itself at every count, so the mask reorder in front of it
    depends only on gemm_mn: up to gemm_mn's direct bound in an FFN, never for a projection that only gemm_k
    consumes, always on the CPU."""
    import re

    from wide_tvm.passes.lower_gated import UNREAD, _reorder_bound, _State
    from wide_tvm.schedules.gemv import direct_bound

    def bounds(func):
        return sorted(int(b) for b in re.findall(r"n <= T\.int64\((\d+)\)", func.script()))

    wg = (tile_knob(("wgmma", 128, 1, 4)),) * 3
    assert bounds(gemm_k(4, 64, 256, "float16", "tc", "cuda")) == [1, 8, 16, 32, 64, 128]
    assert bounds(gemm_k(4, 64, 256, "float16", "tc", "cuda", tile_knobs=wg)) == [1, 8, 16, 32]
    assert bounds(gemm_mn(4, 64, 256, "float16", "tc", True, "cuda", tile_knobs=wg)) == [1, 8, 16, 32]
    assert (direct_bound("gemm_k", wg), direct_bound("gemm_k", DEFAULT_TILES)) == (32, 64)
    assert direct_bound("gemm_mn", wg) == direct_bound("gemm_mn_swiglu", DEFAULT_TILES) == 32

    cuda = _State("cuda", {}, None, {}, wgmma=True)
    assert _reorder_bound(cuda, "tc") == 32 and _reorder_bound(cuda, "nk") == 0  # the FFN's gate/up decides
    assert _reorder_bound(cuda, None) == UNREAD  # a projection: gemm_k alone
    assert _reorder_bound(_State("llvm", {}, None, {}), None) == 0  # the CPU gemm_k walks the reorder's lists
    # the gemm_k kernels take counts / order / used but no path of theirs reads them on CUDA (the CPU one does)
    for script in (gemm_k(4, 64, 256, "float16", "tc", "cuda", tile_knobs=wg).script(),
                   gemm_k(4, 64, 256, "float32", "nk", "cuda").script()):
        assert not re.search(r"(?<![\w.])(counts|order|used)\[", script)
    assert re.search(r"(?<![\w.])used\[", gemm_k(4, 64, 256, "float32", "nk", "llvm").script())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_wgmma_kernels_build_for_every_knob(tmp_path):
    """gate/up (groups of 32 and 64), Q-like (several blocks per group) and gemm_k (also split over blocks, and with
    groups of 32) at every swept wgmma knob set compile to sm_90a device code (importing the kernels registers the sm_90 -> sm_90a
    device compile, so a plain sm_90 target works too): asynchronous wgmmas with descriptors, a zero-filling
    cp.async ring in dynamic shared memory."""
    from wide_tvm.bench.workloads import WGMMA_VARIANTS

    funcs = {}
    for i, v in enumerate(WGMMA_VARIANTS):
        kn = (tile_knob(v),) * 3
        # every set builds gemm_mn, those splitting K too (Q: one K step over 4 or 8 blocks, most of them empty)
        funcs[f"mn{i}"] = gemm_mn(4, 64, 128, "float16", "tc", True, "cuda", tile_knobs=kn)
        funcs[f"q{i}"] = gemm_mn(2, 512, 64, "float16", "tc", False, "cuda", tile_knobs=kn)
        if len(v) < 7:  # only gemm_mn runs on a persistent grid
            funcs[f"k{i}"] = gemm_k(3, 64, 256, "float16", "tc", "cuda", tile_knobs=kn)
    funcs["mn32"] = gemm_mn(6, 32, 64, "float16", "tc", True, "cuda", tile_knobs=(WGMMA_TILES,) * 3)
    for name, v in (("k32", ("wgmma", 128, 2, 6, 4)), ("k32p", ("wgmma", 64, 1, 4, 1, 1))):  # two groups a K step
        funcs[name] = gemm_k(5, 32, 256, "float16", "tc", "cuda", tile_knobs=(tile_knob(v),) * 3)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})  # a plain sm_90 target, not through parse_target
    with target:
        lib = tvm.compile(tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in funcs.items()}), target)
    src = lib.mod.imports[0].inspect_source()
    for n in (64, 128, 256):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in src
    assert "wgmma.wait_group.sync.aligned 1;" in src and "fence.proxy.async.shared::cta;" in src
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in src and "extern __shared__" in src
    # warp-specialised variants: producer copies complete on mbarriers the warpgroups wait for
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in src and "mbarrier.try_wait.parity" in src
    assert "__launch_bounds__(384)" in src  # 2 warpgroups + 4 producer warps
    lib.export_library(str(tmp_path / "wg.so"))
    assert b"sm_90a" in open(tmp_path / "wg.so", "rb").read()  # built for Hopper's arch-specific features
