"""Hopper (sm_90a) warpgroup tile GEMMs for gated projections over many tokens: the shared shape rules and knobs.

The kernels are composed like ThunderKittens' H100 matmul, one module a part:

* `wgmma_ring.py` (producer + mainloop): a block is one warpgroup (128 threads) per 64 tokens of its token tile and
  owns NB = 64 x `rows` weight rows (gate and up side by side for SwiGLU). K walks in 64-wide steps through an
  S-deep ring in dynamic shared memory, both operands K-major with the 128-byte swizzle, described to
  `wgmma.mma_async` by matrix descriptors. The ring is fed by every thread (cp.async, a block barrier a step) or,
  knob `producer`, by producer warps that hand each slot over through full / empty mbarriers.
* `wgmma_tiles.py` (gemm_mn's tile schedulers): the per-tile grid, the persistent grid (knob `persistent`), the
  split tail wave (knob `tail`).
* `wgmma_stream_k.py` (gemm_k's schedulers): K split over blocks (knob `ksplit`, raised at run time), the persistent
  stream-K grid (knob `persistent`).
* `wgmma_epilogue.py`: the stores (a tile staged through the ring for 16-byte stores, SwiGLU) and the second
  launches (zeros of skipped (token, group) pairs, sums of K-split partials in a fixed order: deterministic).
* `wgmma_mn.py` / `wgmma_k.py`: the two GEMMs composed from those parts.

Knobs (wide_tvm/knobs.py: WgmmaMN, WgmmaK): `tokens` per block, `rows` (wgmma N / 64), ring
`stages`, `ksplit`, `producer` warps, `persistent` blocks, `swap` (gemm_mn: weight rows as wgmma's M, a tile's tokens
its N in 8s), `l2` (gemm_mn: L2 prefetch bytes of the weight copies), `tail` (gemm_mn: most blocks a last-wave tile's
K is split over), `order` (gemm_k of <= 8 groups: tokens ordered by mask pattern, schedules/token_order.py),
`mma_skip` (gemm_mn: a warpgroup whose rows are all inactive runs the K loop without its wgmmas). What each measured:
docs/decisions.md.

Worked example (Llama-3.1-8B gate/up, groups of 128, SwiGLU, 4096 tokens at 50 %): knobs tokens=128, rows=4 give
NB = 256 weight rows = 128 channels of gate + 128 of up (wgmma_n), so each group's 2048 active tokens run as 16
token tiles x 1 column block; 112 groups x 16 = 1792 blocks of 256 threads, each walking K = 4096 in 64 steps.
"""

from __future__ import annotations



# A gemm_k split count: the SMs of an H100 / H200 (one wave of blocks per resident block an SM), the most blocks
# splitting K and the fewest K steps a raised split leaves each, and the shared memory of an SM (2 KB more a
# block: the static list buffers and the per-block reserve)
WAVE_SMS = 132
MAX_KSPLIT = 8
MIN_SPLIT_STEPS = 16
SM_SHARED_BYTES = 228 * 1024

