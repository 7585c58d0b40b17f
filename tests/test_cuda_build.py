"""CUDA builds on this GPU-less machine must embed compiled device code, never CUDA source."""

from __future__ import annotations

import re
import shutil

import pytest
import tvm

import wide_tvm
from wide_tvm.schedules import gemm_k, gemm_mn, mask_reorder

FATBIN_MAGIC = b"\x50\xed\x55\xba"  # 0xBA55ED50, little endian

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _assert_device_code(path):
    data = open(path, "rb").read()
    assert FATBIN_MAGIC in data, "no fatbin embedded"
    assert b"__global__" not in data and b"extern \"C\"" not in data, "CUDA source embedded"


def test_kernels_build_to_fatbin(tmp_path):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024})
    funcs = {"reorder": mask_reorder(112, "cuda"), "mn": gemm_mn(112, 128, 4096, "float16", "tc", True, "cuda"),
             "k": gemm_k(112, 128, 4096, "float16", "tc", "cuda"), "q": gemm_mn(8, 512, 4096, "float16", "tc", False, "cuda"),
             "mn_kn": gemm_mn(8, 128, 256, "float16", "kn", True, "cuda")}
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with target:
        tvm.compile(mod, target).export_library(str(tmp_path / "k.so"))
    _assert_device_code(tmp_path / "k.so")


def test_model_builds_for_cuda(exported, tmp_path):
    path, _, cfg = exported("default", "pt2")
    compiled = wide_tvm.compile(path, "cuda")
    assert len(compiled.layers) == 2 * cfg.num_layers
    lib = compiled.export(str(tmp_path / "m.so"))
    _assert_device_code(lib)
    # sm_90: our kernels (gated ones, reorders) are launched as dependents, and only they: each of those waits first
    modules, todo = [], [compiled.executable.mod]
    while todo:  # the VM executable imports the host module, which imports the CUDA one
        modules.append(todo.pop())
        todo += list(modules[-1].imports)
    starts = _kernel_starts("".join(m.inspect_source() for m in modules if m.kind == "cuda"))
    waiting = [name for name, first in starts.items() if first[0] == "tvm_builtin_ptx_griddepcontrol_wait();"]
    assert waiting and len(waiting) < len(starts)  # TVM's own kernels (norms, attention) are launched plainly
    assert open(lib, "rb").read().count(PDL_FLAG) == len(waiting)
    assert (tmp_path / "m.weights.npz").exists()


@pytest.mark.slow
def test_dependent_launch_can_be_turned_off(exported, tmp_path):
    """The opt-out, for drivers or runtimes without it (a second whole CUDA build: the slow suite)."""
    from wide_tvm.cli import compile_main

    path, _, _ = exported("default", "pt2")
    assert compile_main([path, "--target", "cuda", "--no-dependent-launch", "-o", str(tmp_path / "plain.so")]) == 0
    assert PDL_FLAG not in open(tmp_path / "plain.so", "rb").read()


PDL_FLAG = b"tirx.use_programtic_dependent_launch"
# a kernel's first line in TVM's CUDA source: its launch bound (threads[, minimum blocks per SM]) and name
KERNEL_HEADER = (r'extern "C" __global__ void (?:__launch_bounds__\((?P<threads>\d+)(?:, (?P<min_blocks>\d+))?\) )?'
                 r'(?P<name>\w+)\([^)]*\) \{')


def _kernel_starts(source: str) -> dict[str, list[str]]:
    """The first two statements (after declarations) of every kernel defined in CUDA source."""
    decl = re.compile(r"^(alignas\(\d+\) |__shared__ |extern __shared__ )")
    starts = {}
    for m in re.finditer(KERNEL_HEADER, source):
        lines = (ln.strip() for ln in source[m.end():].splitlines())
        starts[m.group("name")] = [ln for ln in lines if ln and not decl.match(ln)][:2]
    return starts


def test_dependent_launch_waits_first_in_every_kernel(tmp_path):
    """Every kernel of a gated PrimFunc launched as a programmatic dependent waits for the kernel before it ahead
    of any other statement: the decode kernels with their split sum, the wgmma tiles with theirs, the reorder."""
    from wide_tvm.schedules.dependent_launch import LAUNCH_PARAMS, PDL, dependent_launch
    from wide_tvm.knobs import GemvKnobs, WgmmaK
    from wide_tvm.targets import launches_dependents, parse_target

    assert [launches_dependents(parse_target(t)) for t in ("cuda", "cuda:sm_80", "cuda:sm_100", "llvm")] == \
        [True, False, True, False]
    split = (GemvKnobs(8, 2, 2, 0, 1, 4),) + (GemvKnobs(),) * 4  # 1 token: four blocks split K, then a sum
    tiles = (WgmmaK(rows=2, stages=6, ksplit=4),) * 3
    funcs = {"k": dependent_launch(gemm_k(112, 128, 4096, "float16", "tc", "cuda", split, tiles)),
             "reorder": dependent_launch(mask_reorder(112, "cuda"))}
    assert list(funcs["k"].attrs[LAUNCH_PARAMS]) == [PDL]
    assert list(dependent_launch(funcs["k"]).attrs[LAUNCH_PARAMS]) == [PDL]  # applied twice: still one flag
    target = parse_target("cuda")
    with target:
        lib = tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()}), target)
    starts = _kernel_starts(lib.mod.imports[0].inspect_source())
    assert len([n for n in starts if n.startswith("k_")]) == 6 and len(starts) >= 7  # 3 direct (+ sum), tile + sum
    assert all(s[0] == "tvm_builtin_ptx_griddepcontrol_wait();" for s in starts.values()), starts
    assert not any("launch_dependents" in s[1] for s in starts.values())  # never triggered early
    lib.export_library(str(tmp_path / "k.so"))
    assert open(tmp_path / "k.so", "rb").read().count(PDL_FLAG) == len(starts)


@pytest.mark.slow
def test_wgmma_kernels_are_built_for_one_block_per_sm():
    """As the library builds them (launch_bounds.as_built), exactly the kernels that issue wgmma carry
    `__launch_bounds__(threads, 1)` (ptxas's register budget then no longer follows the kernel's parameter order,
    schedules/launch_bounds.py), and every kernel still waits first as a programmatic dependent."""

    from wide_tvm.knobs import GemvKnobs, WgmmaK
    from wide_tvm.schedules.launch_bounds import as_built, one_block_per_sm
    from wide_tvm.targets import parse_target

    split = (GemvKnobs(8, 2, 2, 0, 1, 4),) + (GemvKnobs(),) * 4
    tiles = (WgmmaK(64, 2, 4, ksplit=4), WgmmaK(rows=2, stages=6), WgmmaK(rows=2, stages=6))
    funcs = {"k": as_built(gemm_k(112, 128, 4096, "float16", "tc", "cuda", split, tiles), True),
             "reorder": as_built(mask_reorder(112, "cuda"), True)}
    target = parse_target("cuda")
    with target:
        lib = tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()}), target)
    source = lib.mod.imports[0].inspect_source()
    kernels = list(re.finditer(KERNEL_HEADER, source))
    bodies = {m.group("name"): (m, source[m.end():kernels[i + 1].start() if i + 1 < len(kernels) else None])
              for i, m in enumerate(kernels)}
    assert all(m.group("threads") for m, _ in bodies.values())  # every kernel launch-bounded
    wgmma = {name for name, (_, body) in bodies.items() if "wgmma" in body}
    assert len(wgmma) == 2 and len(bodies) >= 7, sorted(bodies)  # the two tile kernels; decode, sums, reorder not
    assert {name for name, (m, _) in bodies.items() if m.group("min_blocks") == "1"} == wgmma
    assert {m.group("min_blocks") for m, _ in bodies.values()} == {"1", None}
    for start in _kernel_starts(source).values():  # the wait first (after, at most, a scalar CSE binding)
        assert "tvm_builtin_ptx_griddepcontrol_wait();" in start and "[" not in start[0], start
    assert one_block_per_sm(funcs["reorder"]).script() == funcs["reorder"].script()  # no wgmma: unchanged


def test_decode_kernels_use_tensor_cores_and_dispatch_on_tokens():
    """fp16 weights in tensor-core tiles get one tensor-core kernel per token bucket, picked per call on the
    host: direct kernels that read the mask for 1, <= 8, <= 16, <= 32 (and, gemm_k, <= 64) tokens, each with its
    own tuned knobs, then (by default) sorted 64-token tiles up to 128 tokens and the tile GEMM past that; they
    load 16-byte vectors into registers."""
    from wide_tvm.knobs import DECODE_BUCKETS, DIRECT_TOKENS

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    for name, func in {"gemm_mn": gemm_mn(8, 64, 256, "float16", "tc", True, "cuda"),
                       "gemm_k": gemm_k(8, 64, 256, "float16", "tc", "cuda")}.items():
        with target:
            lib = tvm.compile(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target)
        src = lib.mod.imports[0].inspect_source()
        kernels = sum(b <= DIRECT_TOKENS[name] for b in DECODE_BUCKETS) + 2  # + the 64-token tiles, the tile GEMM
        assert kernels == {"gemm_mn": 6, "gemm_k": 7}[name]
        assert src.count("__global__ void") == 2 * kernels, name  # declaration + definition
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src, name
        assert "*(uint4*)(wreg_ptr" in src, name  # vectorised weight loads into registers
        assert "__syncthreads()" in src, name  # fixed-order split-K reduction through shared memory


@pytest.mark.slow
def test_decode_knobs_cp_async_ring_and_row_tiles():
    """The `stages` knob streams decode weights through a cp.async ring; rings that would overflow static shared
    memory shrink (stages, then unroll, then warps) instead of failing to build. Row tiles per block
    (`row_warps`) and blocks splitting K (`ksplit`) build with and without the ring."""
    from wide_tvm.schedules.gemv import SMEM_BYTES, _fit_ring
    from wide_tvm.knobs import GemvKnobs

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    kn = (GemvKnobs(8, 2, 1, 3), GemvKnobs(8, 2, 2, 4), GemvKnobs(4, 4, 1, 4), GemvKnobs(8, 1, 1, 2, 4, 2),
          GemvKnobs(8, 2, 2, 0, 2, 3))
    with target:
        lib = tvm.compile(tvm.IRModule({"mn": gemm_mn(8, 64, 256, "float16", "tc", True, "cuda", decode_knobs=kn)
                                        .with_attr("global_symbol", "mn"),
                                        "k": gemm_k(8, 64, 256, "float16", "tc", "cuda", decode_knobs=kn)
                                        .with_attr("global_symbol", "k")}), target)
    src = lib.mod.imports[0].inspect_source()
    assert "cp.async.cg.shared.global" in src and "cp.async.wait_group" in src
    # the 32-token bucket splits K over 2 blocks and gemm_k's 64-token bucket over 3: each such bucket adds a
    # launch that sums the partials. gemm_k: 5 buckets + 2 fix-ups + token tiles + tile GEMM; gemm_mn (no 64-token
    # direct kernel): 4 buckets + 1 fix-up + token tiles + tile GEMM
    assert src.count("__global__ void __launch_bounds__") == 2 * (5 + 2 + 2) + 2 * (4 + 1 + 2)
    with pytest.raises(ValueError, match="knobs for 3 token buckets"):
        gemm_k(8, 64, 256, "float16", "tc", "cuda", decode_knobs=kn[:3])
    stages, unroll, warps = _fit_ring(4, 4, 16, 4, lambda w: w * 1024)
    assert warps * stages * unroll * 4 * 512 + warps * 1024 <= SMEM_BYTES and stages >= 2


TILE_SETS = ((128, 1, 3, 1), (64, 2, 2, 2), (128, 2, 4, 1))


@pytest.mark.parametrize("which", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_tile_kernels_build_for_every_knob(which):
    """The many-token tile kernels build for every knob and warp layout: one row tile per group (all 8 warps
    along the tokens), several blocks per group (group 512), gemm_k's row tiles; the activation copies carry a
    src-size operand (rows that skip the group are zero-filled, not read). Bad knobs are refused by name."""
    from wide_tvm.schedules.tile_gemm import _warp_grid
    from wide_tvm.knobs import GEMV_TILES, SmemTile

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    funcs = {}
    for i, one in [(which, SmemTile(*TILE_SETS[which]))]:
        kn = (one,) * 3
        funcs[f"mn{i}"] = gemm_mn(4, 16, 96, "float16", "tc", True, "cuda", tile_knobs=kn)
        funcs[f"q{i}"] = gemm_mn(2, 512, 64, "float16", "tc", False, "cuda", tile_knobs=kn)
        funcs[f"k{i}"] = gemm_k(6, 32, 64, "float16", "tc", "cuda", tile_knobs=kn)
    with target:
        lib = tvm.compile(tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in funcs.items()}), target)
    src = lib.mod.imports[0].inspect_source()
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in src
    assert src.count("__global__ void __launch_bounds__(256)") == 2 * len(funcs)  # one 8-warp tile kernel each
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert _warp_grid(8, SmemTile(rows=2)) == (2, 4, 2)  # group 128: 4 warps x 2 row tiles, 2 warps on tokens
    assert _warp_grid(1, SmemTile(rows=2)) == (1, 1, 8)  # group 16: one row tile, every warp on the tokens
    assert _warp_grid(256, SmemTile(rows=3)) == (1, 8, 1)  # rows that do not divide the row tiles: 1
    with pytest.raises(ValueError, match="tokens must be a multiple of 64"):
        gemm_k(6, 32, 64, "float16", "tc", "cuda", tile_knobs=(SmemTile(96),) * 3)
    with pytest.raises(ValueError, match="tile knobs for 2 token buckets"):
        gemm_k(6, 32, 64, "float16", "tc", "cuda", tile_knobs=(GEMV_TILES, SmemTile()))


def test_decode_kernels_are_only_for_fp16_tiles():
    """fp32, [N, K] / [K, N] weights or group sizes the mma tiles do not fit keep the SIMT tiled kernel alone;
    asking for tensor-core tiles where they do not exist is an error, not a silent fallback."""
    from wide_tvm.kernel_spec import supports_k, supports_mn

    assert supports_mn(128, 4096, "float16") and supports_k(128, 4096, "float16")
    assert not supports_mn(8, 4096, "float16") and not supports_k(16, 4096, "float16")
    assert not supports_mn(128, 4096, "float32")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target:
        lib = tvm.compile(tvm.IRModule({"k": gemm_k(8, 64, 256, "float16", "kn", "cuda").with_attr(
            "global_symbol", "k"), "n": gemm_mn(8, 64, 256, "float16", "nk", True, "cuda").with_attr(
            "global_symbol", "n")}), target)
    assert "mma.sync" not in lib.mod.imports[0].inspect_source()
    for bad in (lambda: gemm_k(8, 64, 256, "float32", "tc", "cuda"), lambda: gemm_mn(8, 8, 256, "float16", "tc", True, "cuda"),
                lambda: gemm_mn(8, 64, 256, "float16", "tc", True, "llvm")):
        with pytest.raises(ValueError, match="'tc' weight layout"):
            bad()


@pytest.mark.slow  # (~2 minutes of CI; tools/build_gpu_run.sh runs the same build before every GPU session)
@pytest.mark.parametrize("sweep", [None, "tiles"])
def test_bench_build_for_cuda(tmp_path, monkeypatch, sweep):
    """wide-bench build: our kernels (with `sweep`, the many-token knob candidates too: `--sweep tiles`, the cheaper
    of the two sweeps to build) plus TVM's dense baseline, as device code. The sweep here is cut to a few candidates of
    each kind (the full lists cost 5 minutes of CI): tests/test_wgmma.py and test_tile_kernels_build_for_every_knob
    build every candidate."""
    import json

    from wide_tvm.bench import workloads
    from wide_tvm.bench.build import build, our_kernels
    from wide_tvm.bench.workloads import Workload

    monkeypatch.setattr(workloads, "TILE_VARIANTS", (("gemv",), (128, 1, 3, 1)))
    monkeypatch.setattr(workloads, "WGMMA_VARIANTS", (("wgmma", 128, 4, 4), ("wgmma", 64, 1, 4), ("wgmma", 64, 2, 4, 4),
                                                      ("wgmma", 32, 1, 8, 1, 0, 0, 1)))
    small = [Workload("mn", "gemm_mn", 4, 32, 64, swiglu=True), Workload("k", "gemm_k", 4, 32, 64)]
    # every candidate that fits: gemm_k's N of 64 only the wgmma tile of one 64-row N tile, gemm_mn all four
    swept = sorted(n for n in our_kernels(small, "cuda", "tiles", None, True)
                   if n.startswith(("bench_mn_", "bench_k_")) and not n.startswith(tuple(w.fallback for w in small)))
    assert swept == ["bench_k_gemv64", "bench_k_t128r1s3p1", "bench_k_wg64n64s4", "bench_mn_gemv64",
                     "bench_mn_t128r1s3p1", "bench_mn_wg128n256s4", "bench_mn_wg32n64s8t", "bench_mn_wg64n128s4k4",
                     "bench_mn_wg64n64s4"], swept
    build(str(tmp_path), "cuda", small, sweep=sweep)
    _assert_device_code(tmp_path / "ours.so")
    _assert_device_code(tmp_path / "tvm_dense.so")
    spec = json.loads((tmp_path / "bench.json").read_text())
    assert [w["name"] for w in spec["workloads"]] == ["mn", "k"] and spec["sweep"] == sweep
    assert spec["wgmma"]  # cuda (sm_90): the wgmma candidates above are built
    assert spec["layouts"] == {"mn": "tc", "k": "tc"}  # the benchmark feeds tensor-core tiles, as wide-compile stores
    assert [w["direct"] for w in spec["workloads"]] == [32, 64]  # the reorder bounds the GPU host reads (untuned)


@pytest.mark.slow
def test_bench_workloads_carry_their_kernels_direct_bound():
    """A tuned wgmma pick for gemm_k moves its benchmark kernel's direct bound to 16 tokens (groups of 64 or more;
    32 for groups of 32), a swapped wgmma gemm_mn pick its to 16 (knobs.direct_bound); a workload that
    disagrees with its kernel is refused. The mask reorder the benchmark pairs gemm_k with never runs (gemm_k reads
    the mask itself, as LowerGatedLayers compiles it); gemm_mn's runs past its direct kernels and past the kernels
    that sort their tokens themselves."""
    from wide_tvm import kernel_spec
    from wide_tvm.bench.build import our_kernels, with_bounds
    from wide_tvm.bench.workloads import Workload
    from wide_tvm.knobs import UNREAD

    k = Workload("k", "gemm_k", 4, 64, 256)
    tuned = {kernel_spec.kernel_key("gemm_k", 4, 64, 256, "float16"): {"tiles": [["wgmma", 128, 1, 4]] * 3}}
    (bounded,) = with_bounds([k], "cuda", tuned, True)
    assert (bounded.direct_tokens, bounded.reorder) == (16, "bench_reorder_g4_unread")
    half = Workload("k32", "gemm_k", 8, 32, 256)
    tuned[kernel_spec.kernel_key("gemm_k", 8, 32, 256, "float16")] = {"tiles": [["wgmma", 128, 1, 4]] * 3}
    assert with_bounds([half], "cuda", tuned, True)[0].direct_tokens == 32
    assert with_bounds([k], "cuda", tuned, False)[0].direct_tokens == 64  # no wgmma: the mma.sync tiles
    funcs = our_kernels([bounded, Workload("mn", "gemm_mn", 4, 64, 256)], "cuda", None, tuned, True)
    assert "bench_reorder_g4_unread" in funcs and "bench_reorder_g4_d32" in funcs
    assert f"n <= T.int64({UNREAD})" in funcs["bench_reorder_g4_unread"].script()
    with pytest.raises(ValueError, match="bounds are 16 / 0 tokens, the workload says 64 / 0"):
        our_kernels([k], "cuda", None, tuned, True)
    # a gemm_mn whose leading buckets run per-tile wgmma blocks sorts its tokens itself up to 512: no reorder there
    mn = Workload("mn", "gemm_mn", 4, 64, 256)
    tuned[kernel_spec.kernel_key("gemm_mn", 4, 64, 256, "float16")] = {"tiles": [["wgmma", 128, 2, 4]] * 3}
    (sorted_mn,) = with_bounds([mn], "cuda", tuned, True)
    assert (sorted_mn.direct_tokens, sorted_mn.sorts, sorted_mn.reorder) == (32, 512, "bench_reorder_g4_d512")
    assert with_bounds([mn], "cuda", tuned, False)[0].sorts == 0  # no wgmma: the mma.sync tiles read the reorder
    with pytest.raises(ValueError, match="bounds are 32 / 512 tokens, the workload says 32 / 0"):
        our_kernels([mn], "cuda", None, tuned, True)
    tuned[kernel_spec.kernel_key("gemm_mn", 4, 64, 256, "float16")] = {"tiles": [["wgmma", 24, 1, 4, 1, 0, 0, 1]] * 3}
    (swapped,) = with_bounds([mn], "cuda", tuned, True)
    assert (swapped.direct_tokens, swapped.sorts, swapped.reorder) == (16, 512, "bench_reorder_g4_d512")


def test_mask_reorder_has_serial_and_parallel_paths():
    """Few tokens: one block (with the used list); many tokens: one launch, a block per group with warp ballots
    and a block scan. When every consumer is a tensor-core kernel (`direct_tokens`), token counts up to that bound
    launch nothing: those kernels read the mask themselves."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with target:
        lib = tvm.compile(tvm.IRModule({"r": mask_reorder(112, "cuda").with_attr("global_symbol", "r"),
                                        "f": mask_reorder(112, "cuda", direct_tokens=32).with_attr(
                                            "global_symbol", "f")}), target)
    src = lib.mod.imports[0].inspect_source()
    assert "r_kernel_1(" in src and "r_kernel_2(" not in src and "f_kernel(" in src and "f_kernel_1(" not in src
    assert src.count("__global__ void") == 2 * (2 + 1)  # 2 kernels, and 1 (declaration + definition each)
    assert "__syncthreads()" in src and "__ballot_sync" in src
