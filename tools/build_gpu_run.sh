#!/usr/bin/env bash
# Build here (no GPU; ~12 minutes on 2 cores) everything tools/gpu_dense_run.sh runs on the GPU host, into DIR
# (default gpu_run, git-ignored by .git/info/exclude), then stage the runtime-only TVM bundle into .gpu/:
#   tools/build_gpu_run.sh [DIR]
# and on the GPU host, carrying .gpu and DIR:  . .gpu/env.sh && tools/gpu_dense_run.sh DIR $OUT
set -euo pipefail
dir=${1:-gpu_run}
grep -qx "/$dir/" "$(git rev-parse --git-dir)/info/exclude" 2>/dev/null || echo "/$dir/" >> "$(git rev-parse --git-dir)/info/exclude"
rm -rf "$dir"
wide-bench dense-build "$dir/dense" --target cuda                    # every dense shape of Llama-3.1-8B
wide-bench model-build "$dir/model" --target cuda                    # the 2-layer Llama-shape model, gated and dense
python tools/build_gpu_check.py "$dir/check" --examples              # whole compiled models against PyTorch
rm -f "$dir"/check/*.pt2 "$dir"/check/*.onnx                         # (not needed there)
python tools/build_gpu_generation.py "$dir/gen"                       # the fp16 example with --generation
wide-bench e2e-build "$dir/e2e"                                       # 32 Llama-3.1-8B layers, generation, gated + dense
wide-bench build "$dir/bench"                                         # the gated kernels, cuBLAS, our cuBLASLt dense
wide-bench build "$dir/untuned" --workloads untuned                  # Qwen2.5-7B / Mistral-Nemo FFNs, nearest knobs
wide-bench build "$dir/untuned_defaults" --workloads untuned --no-derived   # the same on the generic defaults
../shared/gpu/stage runtime
du -sh "$dir" .gpu
