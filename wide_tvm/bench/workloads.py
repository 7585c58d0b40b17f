"""The benchmarked workloads: Llama-3.1-8B projection shapes, token counts, sparsities, mask kinds, and the knob
candidates a sweep builds. Pure Python (the GPU host imports it with the TVM runtime alone): names and shape rules
come from wide_tvm/knobs.py, the kernels' own."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..kernel_spec import KernelSpec
from ..knobs import DIRECT_TOKENS, TILE_BUCKETS, UNREAD, GemvKnobs, tile_knob

TOKENS = (1, 4, 8, 16, 32, 64, 512, 4096)
SWEEP_TOKENS = (1, 4, 8, 16, 32, 64)  # token counts the knob sweep times: every DECODE_BUCKETS bucket
SPARSITIES = (0.25, 0.5, 0.75)
MASKS = ("random", "skewed")


@dataclass(frozen=True)
class Workload:
    """One gated projection: `kind` gemm_mn (output groups) or gemm_k (reduction groups).

    gemm_mn: x [M, k] -> [M, groups*group_size] (with SwiGLU: gate and up weights);
    gemm_k: a [M, groups*group_size] -> [M, n].
    """

    name: str
    kind: str
    groups: int
    group_size: int
    dim: int  # K of gemm_mn, N of gemm_k
    swiglu: bool = False
    dtype: str = "float16"
    # the built kernel's direct-kernel bound (knobs.direct_bound, set by `wide-bench build` from the tuned
    # tile knobs: 16 where a narrow wgmma tile takes over, 32 for gemm_k's other wgmma picks); 0: DIRECT_TOKENS[kind]
    direct: int = 0
    # the built gemm_mn's reorder-free bound (knobs.reorder_free_bound of its tuned tile knobs, set
    # by `wide-bench build`): up to it its many-token kernels sort their tokens themselves; 0: none does
    sorts: int = 0
    # how its dense fallback runs in a model (schedules/dense_fallback.py): gemm_k's input already zero where a
    # group is skipped (down: a gemm_mn of the same mask wrote it; O: the attention's transpose back to tokens
    # masks it, fused, passes/head_mask.py),
    # gemm_mn's output masked (Q's is not: the attention's output gating discards skipped head groups)
    input_masked: bool = False
    output_masked: bool = True

    @property
    def k(self) -> int:
        return self.dim if self.kind == "gemm_mn" else self.groups * self.group_size

    @property
    def n(self) -> int:
        return self.groups * self.group_size if self.kind == "gemm_mn" else self.dim

    @property
    def weights(self) -> int:
        """Weight matrices of shape [n, k] (gate and up for SwiGLU)."""
        return 2 if self.swiglu else 1

    @property
    def kernel_kind(self) -> str:
        """The kind kernel_spec.kernel_key and schedules.gated_kernel name it by: gemm_mn_swiglu, gemm_mn, gemm_k."""
        return "gemm_mn_swiglu" if self.swiglu else self.kind

    def spec(self, target_kind: str) -> KernelSpec:
        """The kernel wide-compile builds for this shape on `target_kind` (weights exported as [N, K])."""
        return KernelSpec.planned(self.kernel_kind, self.groups, self.group_size, self.dim, self.dtype, target_kind)

    @property
    def kernel(self) -> str:
        return f"bench_{self.name}"

    @property
    def direct_tokens(self) -> int:
        """Token counts up to which the tensor-core kernel reads the mask itself (knobs.direct_bound)."""
        return self.direct or DIRECT_TOKENS[self.kind]

    @property
    def reorder_bound(self) -> int:
        """Token counts up to which the mask reorder in front of this kernel launches nothing, as LowerGatedLayers
        compiles it: gemm_mn reads it past its direct kernels and the many-token kernels that sort their tokens
        themselves, gemm_k never (its blocks read the mask)."""
        return UNREAD if self.kind == "gemm_k" else max(self.direct_tokens, self.sorts)

    @property
    def reorder(self) -> str:
        """The mask reorder this kernel is measured with (it launches nothing up to `reorder_bound`)."""
        return f"bench_reorder_g{self.groups}_" + ("unread" if self.reorder_bound == UNREAD
                                                   else f"d{self.reorder_bound}")

    @property
    def reorder_always(self) -> str:
        """A mask reorder that runs at every token count (the knob sweep's candidates: some read it where the
        built kernel does not)."""
        return f"bench_reorder_g{self.groups}_always"

    @property
    def fallback(self) -> str:
        """Our kernel forced onto its dense fallback at every token count (the other side of the crossover)."""
        return f"{self.kernel}_dense"

    @property
    def dense(self) -> str:
        """Name of the TVM dense baseline function: x [M, k] @ W[n*weights, k]^T."""
        return f"dense_k{self.k}_n{self.n * self.weights}"

    def to_json(self) -> dict:
        return asdict(self)


LLAMA_8B = [
    Workload("gate_up_g128", "gemm_mn", 112, 128, 4096, swiglu=True),
    Workload("down_g128", "gemm_k", 112, 128, 4096, input_masked=True),
    Workload("gate_up_g32", "gemm_mn", 448, 32, 4096, swiglu=True),
    Workload("down_g32", "gemm_k", 448, 32, 4096, input_masked=True),
    Workload("q_proj_h4", "gemm_mn", 8, 512, 4096, output_masked=False),
    Workload("o_proj_h4", "gemm_k", 8, 512, 4096, input_masked=True),
]
# FFN shapes the shipped tunings never saw (keep them out of the databases): Qwen2.5-7B (hidden 3584, intermediate
# 18944) and Mistral-Nemo (hidden 5120, intermediate 14336), groups of 128; built with the nearest tuned shape's
# knobs (tuning/nearest.py), or with the generic defaults (`wide-bench build --workloads untuned --no-derived`)
UNTUNED = [
    Workload("qwen7b_gate_up", "gemm_mn", 148, 128, 3584, swiglu=True),
    Workload("qwen7b_down", "gemm_k", 148, 128, 3584, input_masked=True),
    Workload("nemo_gate_up", "gemm_mn", 112, 128, 5120, swiglu=True),
    Workload("nemo_down", "gemm_k", 112, 128, 5120, input_masked=True),
]
WORKLOAD_SETS = {"llama8b": LLAMA_8B, "untuned": UNTUNED}


# Decode-kernel knob candidates (warps, K chunks per warp and step[, 16-row tiles per warp[, cp.async ring
# stages[, row tiles per block, whose warps share activation loads through L1[, blocks splitting K (gemm_k)]]]]);
# the sweep times each.
MN_VARIANTS = ((4, 4), (8, 2), (16, 1), (4, 2, 1, 2), (8, 1, 1, 2), (8, 1, 1, 2, 4),
               (8, 1, 1, 2, 1, 2), (4, 4, 1, 0, 1, 2), (16, 2, 1, 0, 1, 2), (8, 2, 1, 0, 1, 4))
K_VARIANTS = ((16, 2), (16, 4), (32, 1), (32, 2), (8, 2, 2), (16, 2, 2), (16, 1, 1, 2),
              (16, 2, 1, 0, 1, 2), (16, 2, 1, 0, 1, 4), (16, 4, 1, 0, 1, 4), (16, 2, 1, 0, 4, 4), (8, 2, 2, 0, 1, 4),
              (16, 1, 1, 2, 1, 4))


# Candidates for the token counts past the direct kernels (schedules.tile_gemm): the gemv kernels over sorted
# 64-token tiles, and the shared-memory tile GEMM's (tokens per block, row tiles per warp, activation ring stages,
# weight chunks prefetched). The sweep picks one per bucket (TILE_BUCKETS) from its PREFILL_SWEEP_TOKENS timings.
TILE_VARIANTS = (("gemv",), (128, 1, 3, 1), (64, 1, 3, 1), (128, 2, 3, 1), (64, 2, 3, 1), (128, 1, 4, 2),
                 (128, 2, 4, 2), (64, 2, 4, 2), (128, 1, 2, 1))
# The Hopper wgmma tile GEMMs ("wgmma", tokens per block, wgmma N / 64, ring stages[, blocks splitting K[, producer
# warps[, persistent blocks[, swapped operands[, L2 prefetch bytes]]]]]), sm_90a; gemm_k needs groups of whole 64-wide K steps or of 32
# K, and a persistent grid does not split K; only gemm_mn swaps its operands (schedules.wgmma_gemm)
WGMMA_VARIANTS = (("wgmma", 128, 4, 4), ("wgmma", 128, 2, 4), ("wgmma", 128, 2, 6), ("wgmma", 64, 4, 5),
                  ("wgmma", 128, 4, 4, 2), ("wgmma", 128, 2, 6, 4), ("wgmma", 64, 4, 5, 4),
                  # warp-specialised: a producer warp per SM sub-partition fills the ring, the warpgroups only wait
                  # and multiply (1 or 2 producer warps were slower: e91c961:docs/results/sweep_h200_wgmma_ws12.json)
                  ("wgmma", 128, 4, 4, 1, 4), ("wgmma", 128, 2, 4, 1, 4), ("wgmma", 128, 2, 6, 1, 4),
                  # ... on a persistent grid of one block per H200 SM (gemm_mn): one ring through all of a block's
                  # tiles, no blocks for tiles past a group's count
                  ("wgmma", 128, 4, 4, 1, 4, 132), ("wgmma", 128, 2, 4, 1, 4, 132),
                  # more blocks for a few hundred tokens or fewer (Q: 8 groups x 4 column blocks): K split over 4
                  # or 8 blocks, 64-channel column blocks
                  ("wgmma", 64, 2, 4, 4), ("wgmma", 64, 1, 6, 4), ("wgmma", 64, 2, 4, 8),
                  # gemm_mn with swapped operands (weight rows wgmma's M, a tile's tokens its N in 8s), so a group's
                  # active tokens are padded to 8, not 64 (e91c961:docs/results/sweep_h200_wgmma_swap.json); 1 or 2
                  # warpgroups, small rings of 32-token tiles for 2-3 blocks an SM
                  ("wgmma", 32, 1, 8, 1, 0, 0, 1), ("wgmma", 32, 1, 5, 1, 0, 0, 1), ("wgmma", 48, 1, 8, 1, 0, 0, 1),
                  ("wgmma", 48, 2, 8, 1, 0, 0, 1), ("wgmma", 80, 1, 6, 1, 0, 0, 1), ("wgmma", 80, 2, 8, 1, 0, 0, 1),
                  ("wgmma", 144, 1, 6, 1, 0, 0, 1), ("wgmma", 144, 2, 6, 1, 0, 0, 1), ("wgmma", 208, 2, 4, 1, 0, 0, 1),
                  ("wgmma", 48, 2, 6, 4, 0, 0, 1),
                  # ... with the weights' copies prefetching 256 bytes into L2 (schedules.wgmma_gemm, knob l2)
                  ("wgmma", 80, 1, 6, 1, 0, 0, 1, 256), ("wgmma", 48, 1, 8, 1, 0, 0, 1, 256),
                  ("wgmma", 32, 1, 8, 1, 0, 0, 1, 256), ("wgmma", 48, 2, 8, 1, 0, 0, 1, 256))
# gemm_k on a persistent grid of one block per H200 SM: whole waves of tiles, then the last wave's K steps shared
# out (stream-K); faster where the last wave holds few tiles (docs/performance.md, 2026-12-03). Out of the spaces
# for a round while picking it for two buckets slowed the kernel's unchanged <= 128-token bucket: that was ptxas
# giving the <= 128 kernel fewer registers for another parameter order, gone since the wgmma kernels are built for
# one block per SM (schedules/launch_bounds.py)
STREAM_K_VARIANTS = (("wgmma", 128, 4, 4, 1, 0, 132), ("wgmma", 128, 2, 6, 1, 0, 132))
WGMMA_VARIANTS += STREAM_K_VARIANTS
# gemm_mn past 512 tokens with its last wave split in K when it would fill at most half the GPU (knob tail, the tenth
# entry: most blocks a tile's K is split over): Q at 4096 tokens takes 123 us at 264 tiles (two waves of 132) and
# 157 us at 266 on the H200 (docs/performance.md, 2026-12-03, third session); only for the bucket past 512 tokens
TAIL_VARIANTS = (("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8), ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 16),
                 ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 8))
WGMMA_VARIANTS += TAIL_VARIANTS
# gemm_k of at most 8 groups (O's head groups) past 512 tokens over tokens ordered by mask pattern (knob order, the
# eleventh entry): two launches in front sort the tokens so that a tile's tokens share the groups they skip
# (schedules/token_order.py); on the H200 O at 4096 tokens 231 -> 191 us (docs/performance.md, 2026-12-04, eighth
# session). In the spaces since its kernels' TMA mbarriers are initialised behind a block barrier (the form without
# it crashed back to back; ninth session)
ORDER_VARIANTS = (("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 1), ("wgmma", 128, 2, 6, 1, 0, 0, 0, 0, 0, 1),
                  ("wgmma", 64, 4, 5, 1, 0, 0, 0, 0, 0, 1))
WGMMA_VARIANTS += ORDER_VARIANTS
# gemm_mn on the per-tile grid with a warpgroup whose 64 rows are all past the group's active count skipping its
# wgmmas (knob mma_skip, the twelfth entry): a group's last token tile holds fewer than 65 active tokens for about
# half the groups, which at 129-512 tokens is a third to a fifth of all tiles (schedules.wgmma_gemm: one branch
# around the K loop); the bases are the gemm_mn picks of the H200 database
SKIP_VARIANTS = (("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 0, 0, 1), ("wgmma", 128, 2, 4, 1, 4, 0, 0, 0, 0, 0, 1),
                 ("wgmma", 128, 2, 6, 4, 0, 0, 0, 0, 0, 0, 1), ("wgmma", 128, 4, 4, 1, 0, 0, 0, 0, 0, 0, 1),
                 ("wgmma", 128, 4, 4, 1, 4, 0, 0, 0, 8, 0, 1))
WGMMA_VARIANTS += SKIP_VARIANTS
TILE_SWEEP_BUCKETS = tuple(f"tiles{b}" for b in TILE_BUCKETS) + ("tiles",)  # their names in a sweep's picks
PREFILL_SWEEP_TOKENS = (65, 128, 256, 512, 1024, 4096)


def variants(w: Workload, tokens: int = 1, wgmma: bool = True) -> tuple:
    """Knob candidates of the kernel that runs `tokens` tokens: a direct kernel's, or past the direct bound the
    tile kernels' (with the wgmma GEMMs where `wgmma` and the shape allows them)."""
    if tokens > w.direct_tokens:
        return TILE_VARIANTS + (tuple(v for v in WGMMA_VARIANTS if wgmma_fits(w, v)) if wgmma else ())
    return MN_VARIANTS if w.kind == "gemm_mn" else K_VARIANTS


SWEEPS = ("all", "tiles", "wgmma")  # --sweep: every knob candidate, the many-token (tile) kernels', or the wgmma ones


def swept_variants(w: Workload, tokens: int, wgmma: bool, sweep: str | None) -> tuple:
    """The candidates a `wide-bench build --sweep SWEEP` directory holds for the kernel that runs `tokens` tokens:
    variants(), or with sweep "wgmma" only the wgmma GEMMs' (none below the direct kernels' bound)."""
    cands = variants(w, tokens, wgmma)
    if sweep == "wgmma":
        return tuple(v for v in cands if v[0] == "wgmma") if tokens > w.direct_tokens else ()
    if sweep == "tiles" and tokens <= w.direct_tokens:
        return ()
    return cands


def wgmma_fits(w: Workload, v: tuple) -> bool:
    """Whether the wgmma tile GEMM builds `w` with tile knobs v (WgmmaMN / WgmmaK.validate)."""
    try:
        tile_knob(v, w.kernel_kind).validate(w.spec("cuda"))
    except ValueError:
        return False
    return True


def tile_name(w: Workload, v: tuple) -> str:
    """The name of tile knobs v of w's kernel (a sweep build's kernel suffix)."""
    return tile_knob(v, w.kernel_kind).name()


def tile_bucket(tokens: int) -> str:
    """Sweep bucket of the many-token kernel that runs `tokens` tokens: tiles128, tiles512 or tiles."""
    return next((name for b, name in zip(TILE_BUCKETS, TILE_SWEEP_BUCKETS) if tokens <= b), TILE_SWEEP_BUCKETS[-1])


def variant_name(w: Workload, tokens: int, v: tuple) -> str:
    """Name of candidate v of the kernel that runs `tokens` tokens (the suffix of its sweep build)."""
    return tile_name(w, v) if tokens > w.direct_tokens else knob_name(v)


def knob_name(v: tuple) -> str:
    """The name of direct-kernel knobs v (a sweep build's kernel suffix)."""
    return GemvKnobs(*v).name()
