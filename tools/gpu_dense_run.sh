#!/usr/bin/env bash
# On the GPU host (runtime-only TVM bundle): every check and benchmark of the dense-matmul dispatch, built here by
# tools/build_gpu_run.sh gpu_run; then, carrying .gpu and gpu_run:  . .gpu/env.sh && tools/gpu_dense_run.sh gpu_run OUT_DIR [STEP...]
# STEP: check (whole compiled models against PyTorch), generation (greedy generation on the paged KV cache against
# PyTorch), e2e (wide-bench e2e: the 32-layer engine gated / dense against PyTorch eager and torch.compile; not in
# the default list: minutes), dense (every dense shape against torch.matmul), model (the
# 2-layer Llama-shape model against PyTorch), gated (the gated kernels and their dense fallbacks beside cuBLAS and our
# cuBLASLt dense, random and skewed masks; `wide-tune --target cuda --crossover gated.json` imports the crossovers),
# untuned (Qwen2.5-7B / Mistral-Nemo FFNs on the nearest tuned shape's knobs, and on the generic defaults); all by
# default. Each writes OUT_DIR/STEP.json (untuned: untuned.json and untuned_defaults.json).
set -uo pipefail
build=${1:?build folder}; out=${2:?output folder}; shift 2
steps=${*:-check generation dense model gated untuned}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bench='import sys; from wide_tvm.cli import bench_main; sys.exit(bench_main(sys.argv[1:]))'
crossover_tokens="1 2 4 8 16 32 64 128 256 512 1024 2048 4096"  # (each kernel's gated path and dense fallback)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for step in $steps; do
  echo "== $step"
  case $step in
    check) python3 tools/gpu_check.py "$build/check" --json "$out/check.json" | grep -v "^  example" ;;
    generation) python3 tools/gpu_generation_check.py "$build/gen/gen_fp16.so" --json "$out/generation.json"
                python3 tools/gpu_generation_check.py "$build/gen/gen_fp16_nograph.so" \
                  --json "$out/generation_nograph.json" | grep "decode step" ;;
    e2e) python3 -c "$bench" e2e "$build/e2e" --json "$out/e2e.json" --rows ours_gated ours_dense torch_compile \
           torch_eager ours_gated@0.25 ours_gated@0.75 ours_gated_nograph --compile-prompts 4096 --compile-batches 1 \
           --timeout 300 ;;
    dense) python3 -c "$bench" dense-run "$build/dense" --json "$out/dense.json" ;;
    model) python3 -c "$bench" model-run "$build/model" --json "$out/model.json" ;;
    gated) python3 -c "$bench" run "$build/bench" --json "$out/gated.json" --tokens $crossover_tokens \
             --sparsity 0.5 --masks random
           python3 -c "$bench" run "$build/bench" --json "$out/gated_skewed.json" --tokens 1 4 16 64 256 1024 4096 \
             --sparsity 0.5 --masks skewed ;;
    untuned) python3 -c "$bench" run "$build/untuned" --json "$out/untuned.json" --tokens $crossover_tokens \
               --sparsity 0.5 --masks random
             python3 -c "$bench" run "$build/untuned_defaults" --json "$out/untuned_defaults.json" \
               --tokens 1 4 16 64 256 1024 4096 --sparsity 0.5 --masks random ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
