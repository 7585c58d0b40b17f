// wide_cublaslt_matmul: dense fp16 / bf16 / fp32 matmul through cuBLASLt, as a TVM FFI function linked into a compiled
// library (wide_tvm/blas/extern.py builds it with nvcc; passes/blas_dispatch.py calls it).
//
// Contract (destination-passing, row-major, contiguous tensors, fp32 accumulation):
//   a   [..., M, K]                         the activations
//   b   [N, K] (trans_b=1) or [K, N] (0)    a weight shared by every row of `a`, or
//       [..., N, K] / [..., K, N]           a batch with the same leading dims as `a` (attention's matmuls)
//   out [..., M, N], ws [bytes] uint8       the result and cuBLASLt's workspace, both allocated by TVM
//   algo                                    which of cuBLASLt's heuristic candidates to run (0: its first pick)
// Example: a [1, 7, 4096] fp16, b [1024, 4096], trans_b=1 -> out [1, 7, 1024] = a @ b.T (one GEMM, M = 7).
//
// The GEMM runs on TVM's current CUDA stream (TVMFFIEnvGetStream) and does no allocation, no synchronisation and
// no host<->device copy, so it can be captured in a CUDA graph. A plan (descriptors and the chosen algorithm) is
// made once per shape, dtype, alignment and workspace size and then reused (thread-safe).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "dltensor.h"

namespace {

using wide_blas::DataPtr;
using wide_blas::IsCompact;

#define WIDE_CHECK_LT(expr)                                                                      \
  do {                                                                                           \
    cublasStatus_t status_ = (expr);                                                             \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      TVM_FFI_THROW(RuntimeError) << "cuBLASLt: " #expr ": " << cublasLtGetStatusString(status_); \
    }                                                                                            \
  } while (0)

struct Gemm {
  int64_t batch, m, n, k;
};

int64_t Alignment(const void* ptr) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  int64_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

Gemm GemmOf(const DLTensor* a, const DLTensor* b, const DLTensor* out, bool trans_b) {
  if (a->ndim < 2 || out->ndim != a->ndim) {
    TVM_FFI_THROW(ValueError) << "wide_cublaslt_matmul: a must be [..., M, K] and out [..., M, N] (ranks " << a->ndim
                              << ", " << out->ndim << ")";
  }
  int64_t k = a->shape[a->ndim - 1];
  int64_t n = trans_b ? b->shape[b->ndim - 2] : b->shape[b->ndim - 1];
  int64_t kb = trans_b ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2];
  int64_t lead = 1;
  for (int i = 0; i < a->ndim - 2; ++i) lead *= a->shape[i];
  int64_t m = a->shape[a->ndim - 2];
  if (kb != k || out->shape[out->ndim - 1] != n || out->shape[out->ndim - 2] != m) {
    TVM_FFI_THROW(ValueError) << "wide_cublaslt_matmul: shapes do not agree (K " << k << " vs " << kb << ", N " << n
                              << ")";
  }
  if (b->ndim == 2) return Gemm{1, lead * m, n, k};  // one weight: every row of a is one row of the GEMM
  if (b->ndim != a->ndim) TVM_FFI_THROW(ValueError) << "wide_cublaslt_matmul: b must be 2-D or batched like a";
  for (int i = 0; i < a->ndim - 2; ++i) {
    if (a->shape[i] != b->shape[i] || out->shape[i] != a->shape[i]) {
      TVM_FFI_THROW(ValueError) << "wide_cublaslt_matmul: batch dims of a, b and out differ";
    }
  }
  return Gemm{lead, m, n, k};
}

using PlanKey = std::tuple<int, int, uint8_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           std::array<int64_t, 3>, int64_t>;

// Descriptors and the chosen algorithm of one GEMM shape (never freed: a model has a bounded set of shapes).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t weight = nullptr, act = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algo;
};

cublasLtHandle_t Handle(int device) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t handle;
  WIDE_CHECK_LT(cublasLtCreate(&handle));
  handles[device] = handle;
  return handle;
}

cublasLtMatrixLayout_t Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t layout;
  WIDE_CHECK_LT(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    WIDE_CHECK_LT(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    WIDE_CHECK_LT(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                   sizeof(stride)));
  }
  return layout;
}

// cuBLASLt is column-major: a row-major [R, C] tensor is a column-major [C, R] one. So out^T [N, M] =
// op(b) [N, K] x a^T [K, M], with b as cuBLASLt's A operand and a as its B operand.
const Plan& GetPlan(cublasLtHandle_t handle, const PlanKey& key, cudaDataType_t type, bool trans_b, const Gemm& g,
                    int64_t ws_bytes, const std::array<int64_t, 3>& align, int64_t algo_rank) {
  static std::mutex mu;
  static std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  WIDE_CHECK_LT(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_w = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_n = CUBLAS_OP_N;
  WIDE_CHECK_LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)));
  WIDE_CHECK_LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  int64_t w_stride = g.batch > 1 ? g.n * g.k : 0;
  plan->weight = trans_b ? Layout(type, g.k, g.n, g.k, g.batch, w_stride) : Layout(type, g.n, g.k, g.n, g.batch, w_stride);
  plan->act = Layout(type, g.k, g.m, g.k, g.batch, g.m * g.k);
  plan->out = Layout(type, g.n, g.m, g.n, g.batch, g.m * g.n);
  cublasLtMatmulPreference_t pref;
  WIDE_CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = static_cast<uint64_t>(ws_bytes);
  WIDE_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  uint32_t align_w = static_cast<uint32_t>(align[1]), align_a = static_cast<uint32_t>(align[0]),
           align_o = static_cast<uint32_t>(align[2]);
  WIDE_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w,
                                                     sizeof(align_w)));
  WIDE_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                                     sizeof(align_a)));
  WIDE_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_o,
                                                     sizeof(align_o)));
  WIDE_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_o,
                                                     sizeof(align_o)));
  cublasLtMatmulHeuristicResult_t results[8];
  int count = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->weight, plan->act, plan->out,
                                                         plan->out, pref, 8, results, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || count == 0) {
    TVM_FFI_THROW(RuntimeError) << "cuBLASLt has no algorithm for a " << g.batch << " x " << g.m << " x " << g.n
                                << " x " << g.k << " matmul: " << cublasLtGetStatusString(status);
  }
  plan->algo = results[algo_rank < count ? algo_rank : count - 1].algo;
  return *(plans[key] = std::move(plan));
}

void Matmul(DLTensor* a, DLTensor* b, int64_t trans_b, int64_t algo_rank, DLTensor* out, DLTensor* ws) {
  if (a->device.device_type != kDLCUDA) TVM_FFI_THROW(ValueError) << "wide_cublaslt_matmul: tensors must be on CUDA";
  if (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits || a->dtype.code != out->dtype.code ||
      a->dtype.bits != out->dtype.bits || a->dtype.lanes != 1) {
    TVM_FFI_THROW(TypeError) << "wide_cublaslt_matmul: a, b and out must have one dtype";
  }
  cudaDataType_t type;
  if (a->dtype.code == kDLFloat && a->dtype.bits == 16) {
    type = CUDA_R_16F;
  } else if (a->dtype.code == kDLBfloat && a->dtype.bits == 16) {
    type = CUDA_R_16BF;
  } else if (a->dtype.code == kDLFloat && a->dtype.bits == 32) {
    type = CUDA_R_32F;  // exact fp32 (no TF32), as torch.matmul computes by default
  } else {
    TVM_FFI_THROW(TypeError) << "wide_cublaslt_matmul: float16, bfloat16 or float32 only";
  }
  if (!IsCompact(a) || !IsCompact(b) || !IsCompact(out)) {
    TVM_FFI_THROW(ValueError) << "wide_cublaslt_matmul: tensors must be contiguous";
  }
  Gemm g = GemmOf(a, b, out, trans_b != 0);
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  int64_t ws_bytes = 1;
  for (int i = 0; i < ws->ndim; ++i) ws_bytes *= ws->shape[i];
  const void *pa = DataPtr(a), *pb = DataPtr(b);
  void *po = DataPtr(out), *pw = DataPtr(ws);
  std::array<int64_t, 3> align{Alignment(pa), Alignment(pb), Alignment(po)};
  int device = a->device.device_id;
  PlanKey key{device, static_cast<int>(type), static_cast<uint8_t>(trans_b != 0), g.batch, g.m, g.n, g.k,
              ws_bytes, align, algo_rank};
  cublasLtHandle_t handle = Handle(device);
  const Plan& plan = GetPlan(handle, key, type, trans_b != 0, g, ws_bytes, align, algo_rank);
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  float alpha = 1.0f, beta = 0.0f;
  WIDE_CHECK_LT(cublasLtMatmul(handle, plan.desc, &alpha, pb, plan.weight, pa, plan.act, &beta, po, plan.out, po,
                               plan.out, &plan.algo, pw, static_cast<size_t>(ws_bytes), stream));
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(wide_cublaslt_matmul, Matmul);
