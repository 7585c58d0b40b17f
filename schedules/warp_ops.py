"""Warp- and block-level building blocks the CUDA kernels share (inlined into each kernel's TIR where called).

* `popc(x)`: set bits of an int32 (CUDA `__popc`; TVM 0.27 has no CUDA lowering for tirx.popcount).
* `ballot(flag)`: the warp's flags as a uint32 bit set, bit l = lane l's (`__ballot_sync` over the full warp).
* `lanes_below(bits, lane)`: set bits of a warp bit set below `lane`: a lane's slot among the flagged lanes.
  Worked example: lanes 1, 4 and 6 flagged, bits = 0b1010010; lanes_below(bits, 6) = popc(0b0010010) = 2.
* `block_scan(scan, reg, tx, steps)`: inclusive Hillis-Steele scan of a shared array by the whole block.
  Worked example: scan = [3, 0, 2, 5] over 4 threads, steps 2 -> [3, 3, 5, 10].
* `plus(t0, t)`: t0 + t, leaving t as it is for a literal t0 = 0 (so a kernel that starts at token 0 keeps the
  TIR it had before it took an offset).
"""

from __future__ import annotations

from tvm.script import tirx as T


def popc(x):
    """Set bits of an int32 (CUDA __popc; TVM 0.27 has no CUDA lowering for tirx.popcount)."""
    return T.call_pure_extern("int32", "__popc", x)


def ballot(flag):
    """The warp's flags as a bit set (bit l: lane l's; CUDA __ballot_sync over the full warp)."""
    return T.call_pure_extern("uint32", "__ballot_sync", T.uint32(0xFFFFFFFF), flag)


def lanes_below(bits, lane):
    """Set bits of a warp's uint32 bit set below lane `lane` (int32)."""
    return popc(T.reinterpret("int32", T.bitwise_and(bits, T.shift_left(T.uint32(1), T.Cast("uint32", lane))
                                                      - T.uint32(1))))


@T.macro
def block_scan(scan, reg, tx, steps):
    """Inclusive Hillis-Steele scan of the shared scan[0 .. threads) by the block's `threads` threads (tx), in
    steps >= log2(threads) rounds; reg (local) [1] is scratch. Every thread calls it: its barriers are block-wide."""
    for s in T.unroll(steps):
        reg[1] = T.Select(tx >= (1 << s), scan[T.max(tx - (1 << s), 0)], 0)
        T.tvm_storage_sync("shared")
        scan[tx] = scan[tx] + reg[1]
        T.tvm_storage_sync("shared")


def plus(t0, t):
    """t0 + t, leaving t as it is for the decode kernels' literal t0 = 0 (so their code does not change)."""
    return t if isinstance(t0, int) and t0 == 0 else t0 + t
