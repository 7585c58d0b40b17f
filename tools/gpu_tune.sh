#!/usr/bin/env bash
# wide-tune on a GPU host from this source tree, without installing it (the GPU host has no package index):
# lays the wide_tvm package out in a scratch folder (schedules/, passes/, frontends/ as its subpackages, as
# pyproject.toml maps them) and runs wide-tune there with the arguments given; pass an absolute --out.
# With the staged TVM bundle:  . .gpu/env.sh && tools/gpu_tune.sh --llama8b --target cuda --out "$OUT/cuda-sm90"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pkg=$(mktemp -d)
cp -r "$root/wide_tvm" "$pkg/"
for d in schedules passes frontends; do cp -r "$root/$d" "$pkg/wide_tvm/$d"; done
export PATH="/usr/local/cuda/bin:$PATH" PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
cd "$pkg"
exec python3 -c 'import sys; from wide_tvm.cli import tune_main; sys.exit(tune_main(sys.argv[1:]))' "$@"
