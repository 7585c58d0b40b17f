"""wide-bench build with the stream-K toggles of docs/results/experiment_stream_k_fold_keep.patch set (apply the patch
to schedules/wgmma_gemm.py first; the committed code has neither toggle): python3 THIS OUT FOLD KEEP (0 / 1 each),
records of HEAD (the patch changes the tile kernels' code version)."""
import sys
from wide_tvm.cuda_aot import prepare_cuda_aot
prepare_cuda_aot()
import wide_tvm.schedules.wgmma_gemm as wg
wg.STREAM_K_FOLD, wg.STREAM_K_KEEP = sys.argv[2] == "1", sys.argv[3] == "1"
from wide_tvm.cli import bench_main
bench_main(["build", sys.argv[1], "--records-of", "HEAD"])
