#!/usr/bin/env bash
# On the GPU host (runtime-only TVM bundle): every check and benchmark of the dense-matmul dispatch, built here by
# tools/build_gpu_run.sh gpu_run; then, carrying .gpu and gpu_run:  . .gpu/env.sh && tools/gpu_dense_run.sh gpu_run OUT_DIR [STEP...]
# STEP: check (whole compiled models against PyTorch), dense (every dense shape against torch.matmul), model (the
# 2-layer Llama-shape model against PyTorch), gated (the gated kernels beside cuBLAS and our cuBLASLt dense),
# untuned (Qwen2.5-7B / Mistral-Nemo FFNs on the nearest tuned shape's knobs, and on the generic defaults); all by
# default. Each writes OUT_DIR/STEP.json (untuned: untuned.json and untuned_defaults.json).
set -uo pipefail
build=${1:?build folder}; out=${2:?output folder}; shift 2
steps=${*:-check dense model gated untuned}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bench='import sys; from wide_tvm.cli import bench_main; sys.exit(bench_main(sys.argv[1:]))'
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for step in $steps; do
  echo "== $step"
  case $step in
    check) python3 tools/gpu_check.py "$build/check" --json "$out/check.json" | grep -v "^  example" ;;
    dense) python3 -c "$bench" dense-run "$build/dense" --json "$out/dense.json" ;;
    model) python3 -c "$bench" model-run "$build/model" --json "$out/model.json" ;;
    gated) python3 -c "$bench" run "$build/bench" --json "$out/gated.json" --tokens 1 4 16 64 256 1024 4096 \
             --sparsity 0.5 --masks random ;;
    untuned) for d in untuned untuned_defaults; do
               python3 -c "$bench" run "$build/$d" --json "$out/$d.json" --tokens 1 4 16 64 256 1024 4096 \
                 --sparsity 0.5 --masks random
             done ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
