"""Parse the user's --target into a TVM Target, with one clear error for anything else."""

from __future__ import annotations

import json
import re

from .errors import WideError

_CUDA_LIMITS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def parse_target(spec: str):
    """`llvm`, `cuda` (sm_90), `cuda:sm_80`, a TVM tag (`nvidia/nvidia-h100`) or a target JSON dict."""
    import tvm

    spec = spec.strip()
    try:
        if spec == "llvm":
            return tvm.target.Target({"kind": "llvm"})
        if spec == "cuda":
            return tvm.target.Target({"kind": "cuda", "arch": "sm_90", **_CUDA_LIMITS})
        match = re.fullmatch(r"cuda:(sm_\d+a?)", spec)
        if match:
            return tvm.target.Target({"kind": "cuda", "arch": match.group(1), **_CUDA_LIMITS})
        if spec.startswith("{"):
            return tvm.target.Target(json.loads(spec))
        if "/" in spec:
            return tvm.target.Target(spec)
    except Exception as err:  # noqa: BLE001 - TVM raises many types for bad targets
        raise WideError(f"unknown target {spec!r}: {str(err).strip().splitlines()[-1]}") from None
    raise WideError(f"unknown target {spec!r}; use llvm, cuda, cuda:sm_XX, a TVM tag such as "
                    "nvidia/nvidia-h100, or a target JSON dict")


def target_folder(target) -> str:
    """Folder name under tuning_logs/ for a target: `llvm`, `cuda-sm90`, ..."""
    if target.kind.name == "cuda":
        arch = str(target.attrs.get("arch", "sm_90")).replace("_", "")
        return f"cuda-{arch}"
    return target.kind.name
