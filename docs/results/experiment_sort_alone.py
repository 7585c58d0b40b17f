"""The mask-pattern sort (schedules/token_order.py) alone, back to back on the GPU, each order checked against NumPy.

    python docs/results/experiment_sort_alone.py build sortmod             # here: sortmod/sort.so (G = 8), as built
    python3 docs/results/experiment_sort_alone.py run sortmod 4096 skewed 3000   # GPU host (PYTHONPATH=$PWD)

Used to tell whether the crashes of the first ordered O builds were the sort's (2026-12-04, ninth session: 24000
sorts at 1536-9000 tokens all matched `host_order`; the crash was the GEMM's, docs/performance.md). The function is
the sort and the scatter launch of `pattern_order(8)` with perm / smask / place as arguments, built as wide-compile
builds kernels (launch_bounds.as_built: programmatic dependent launch, one block per SM).
Kept as run: it builds the one-block sort of 2026-12-04 (pattern_order's signature then: perm, smask, place). The
two-launch sort since the fourteenth session (2026-12-06) is checked and timed by tools/check_token_order.py.
"""
import os
import sys

GROUPS = 8


def build(out: str) -> None:
    from wide_tvm.cuda_aot import prepare_cuda_aot

    prepare_cuda_aot()
    import tvm
    from tvm.script import tirx as T

    from wide_tvm.schedules.launch_bounds import as_built
    from wide_tvm.schedules.token_order import pattern_order
    from wide_tvm.targets import parse_target

    run = pattern_order(GROUPS)

    @T.prim_func(private=True)
    def sort_only(mask_h: T.handle, perm_h: T.handle, smask_h: T.handle, place_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        mask = T.match_buffer(mask_h, (n, GROUPS), "int32")
        perm = T.match_buffer(perm_h, (n,), "int32")
        smask = T.match_buffer(smask_h, (n, GROUPS), "int32")
        place = T.match_buffer(place_h, (n,), "int32")
        run(mask, perm, smask, place, n)

    os.makedirs(out, exist_ok=True)
    target = parse_target("cuda")
    with target:
        mod = tvm.IRModule({"sort8": as_built(sort_only, True).with_attr("global_symbol", "sort8")})
        tvm.compile(mod, target).export_library(os.path.join(out, "sort.so"))
    print("built", out)


def host_order(mask):
    """token_order.host_order without importing the kernels (the GPU host runs the TVM runtime alone)."""
    import numpy as np

    mask = np.asarray(mask) != 0
    key = (mask * (1 << np.arange(mask.shape[1] - 1, -1, -1))).sum(1)
    shift = 1
    while shift < mask.shape[1]:
        key = key ^ (key >> shift)
        shift *= 2
    return np.argsort(key, kind="stable")


def run(folder: str, tokens: int, kind: str, calls: int) -> None:
    import numpy as np
    import torch
    import tvm

    from wide_tvm.kernel_reference import make_mask
    from wide_tvm.runtime import _ensure_cuda_runtime

    _ensure_cuda_runtime(tvm)
    tv = tvm.runtime.from_dlpack
    f = tvm.runtime.load_module(os.path.join(folder, "sort.so"))["sort8"]
    rng = np.random.default_rng(tokens)
    masks = [make_mask(kind, tokens, GROUPS, rng, 0.5) for _ in range(8)]
    mt = [torch.from_numpy(m).cuda() for m in masks]
    want = [torch.from_numpy(host_order(m).astype(np.int32)).cuda() for m in masks]
    perm = torch.empty(tokens, dtype=torch.int32, device="cuda")
    smask = torch.empty(tokens, GROUPS, dtype=torch.int32, device="cuda")
    place = torch.empty(tokens, dtype=torch.int32, device="cuda")
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    for i in range(calls):  # back to back: no synchronisation until the end
        j = i % len(masks)
        perm.fill_(-1)
        f(tv(mt[j]), tv(perm), tv(smask), tv(place))
        bad += (perm != want[j]).sum() + (smask != mt[j][want[j].long()]).sum()
    torch.cuda.synchronize()
    print(f"sort m={tokens} {kind} calls={calls} wrong entries={int(bad)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build(sys.argv[2])
    elif sys.argv[1:2] == ["run"]:
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(__doc__)
