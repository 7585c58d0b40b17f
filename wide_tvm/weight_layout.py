"""Weight layouts the gated kernels read, and the one-time repacking the compiler applies to stored weights.

* "nk": W [N, K] as exported (a Linear's weight).
* "kn": W^T [K, N] (a group's K-slice is one contiguous block, its rows N elements apart).
* "kp": W^T in panels of 16 columns [N / 16, K, 16] (CPU gemm_k): a group's K-slice of one panel is one
  contiguous run of gs x 16 elements, so a task's columns stream without [K, N]'s row stride (Llama's N = 4096
  fp32: 16 KB, a new 4 KB page, TLB entry and L1 set conflict for every row).
* "tc": tensor-core fragment tiles [N / 16, 16 * K] (CUDA fp16 kernels). Row tile r holds W[16r : 16r + 16, :]
  in the order (K chunk c of 32, half h, lane, 8 elements), lane = 4 * g + q carrying
  W[16r + 8h + g, 32c + 8q : 32c + 8q + 8] -- exactly the 16-byte vector that lane loads into its mma
  fragment (see schedules/gemv.py). A warp's load of one (c, h) is then 512 contiguous bytes, and a row
  tile's stream over K is one contiguous 16 * K block, instead of 16 rows 2K bytes apart.

Works on NumPy arrays and torch tensors alike (the GPU benchmark packs torch tensors on the device), and
imports neither TVM nor the kernels.
"""

from __future__ import annotations

TC_ROWS = 16  # rows per tile (the mma M)
TC_CHUNK = 32  # K elements per chunk (4 lanes x 8)
PANEL = 16  # columns per "kp" panel (one AVX-512 vector of fp32)
LAYOUTS = ("nk", "kn", "tc", "kp")


def cpu_k_layout(n: int) -> str:
    """The layout the CPU gemm_k reads a weight of N = n outputs in: "kp" panels where N has whole ones, else [K, N]."""
    return "kp" if n % PANEL == 0 else "kn"


def _permute(t, axes):
    return t.permute(*axes) if hasattr(t, "permute") else t.transpose(axes)


def pack(w_nk, layout: str):
    """W [N, K] -> its stored form in `layout` (a new contiguous array/tensor)."""
    if layout == "nk":
        return w_nk
    if layout == "kn":
        t = _permute(w_nk, (1, 0))
        return t.contiguous() if hasattr(t, "contiguous") else t.copy()
    if layout == "kp":
        n, k = w_nk.shape
        if n % PANEL:
            raise ValueError(f"a [{n}, {k}] weight cannot be cut into panels of {PANEL} columns: N must be a "
                             f"multiple of {PANEL}")
        t = _permute(w_nk.reshape(n // PANEL, PANEL, k), (0, 2, 1))
        return t.contiguous() if hasattr(t, "contiguous") else t.copy()
    if layout != "tc":
        raise ValueError(f"unknown weight layout {layout!r}; expected one of {LAYOUTS}")
    n, k = w_nk.shape
    if n % TC_ROWS or k % TC_CHUNK:
        raise ValueError(f"a [{n}, {k}] weight cannot be tiled for tensor cores: N must be a multiple of "
                         f"{TC_ROWS} and K of {TC_CHUNK}")
    t = w_nk.reshape(n // TC_ROWS, 2, 8, k // TC_CHUNK, 4, 8)  # (tile, h, g, chunk, q, v)
    t = _permute(t, (0, 3, 1, 2, 4, 5))  # (tile, chunk, h, g, q, v)
    return t.reshape(n // TC_ROWS, TC_ROWS * k)


def unpack(stored, layout: str, n: int, k: int):
    """The inverse of `pack`: the stored form back to W [N, K]."""
    if layout == "nk":
        return stored
    if layout == "kn":
        return _permute(stored, (1, 0))
    if layout == "kp":
        return _permute(stored, (0, 2, 1)).reshape(n, k)
    t = stored.reshape(n // TC_ROWS, k // TC_CHUNK, 2, 8, 4, 8)
    return _permute(t, (0, 2, 3, 1, 4, 5)).reshape(n, k)


def stored_shape(layout: str, n: int, k: int) -> tuple[int, ...]:
    return {"nk": (n, k), "kn": (k, n), "tc": (n // TC_ROWS, TC_ROWS * k), "kp": (n // PANEL, k, PANEL)}[layout]
