// wide_cblas_matmul: dense fp32 matmul through OpenBLAS (the scipy-openblas32 wheel's cblas, symbols prefixed
// `scipy_`), as a TVM FFI function linked into a compiled CPU library (wide_tvm/blas/extern.py builds it with the
// host C++ compiler; passes/blas_dispatch.py calls it).
//
// Contract (destination-passing, row-major, contiguous tensors):
//   a   [..., M, K]                         the activations
//   b   [N, K] (trans_b=1) or [K, N] (0)    a weight shared by every row of `a`, or
//       [..., N, K] / [..., K, N]           a batch with the same leading dims as `a` (attention's matmuls)
//   out [..., M, N]
// Example: a [1, 7, 2048] fp32, b [256, 2048], trans_b=1 -> out [1, 7, 256] = a @ b.T (one sgemm, M = 7).
//
// Threads: OpenBLAS runs single-threaded and the work is split over TVM's own thread pool
// (TVMBackendParallelLaunch), by batch entry, or by output columns / rows in blocks. Two pools on the same cores
// (TVM's workers spin-wait after each kernel while OpenBLAS's start) made a whole 2-layer model 1.4-1.9x slower.
// Each output element is computed by one sgemm / sgemv call whatever the split, so results do not depend on the
// number of threads' partition of K (there is none) and are the same run to run.
#include <cblas.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/runtime/c_backend_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "dltensor.h"

namespace {

using wide_blas::DataPtr;
using wide_blas::IsCompact;

// Multiply-adds below which a call runs on the calling thread alone (a parallel launch costs a few microseconds).
constexpr int64_t kParallelWork = 64 * 1024;
constexpr int64_t kColumnBlock = 16;  // output columns per split unit: whole cache lines of C and of B^T rows

// out[batch][M, N] = a[batch][M, K] @ op(b[batch or shared]), split into units along `axis`.
struct Job {
  const float* a;
  const float* b;
  float* out;
  int64_t batch, m, n, k;
  bool trans_b, shared_b;
  enum Axis { kBatch, kRows, kColumns } axis;

  int64_t Units() const {
    return axis == kBatch ? batch : axis == kRows ? m : (n + kColumnBlock - 1) / kColumnBlock;
  }

  // rows [m0, m1) x columns [n0, n1) of batch entry `e`
  void Block(int64_t e, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    if (m0 >= m1 || n0 >= n1) return;
    const float* pa = a + e * m * k + m0 * k;
    const float* pb = (shared_b ? b : b + e * n * k) + (trans_b ? n0 * k : n0);
    float* po = out + e * m * n + m0 * n + n0;
    auto rows = static_cast<blasint>(m1 - m0), cols = static_cast<blasint>(n1 - n0);
    auto kk = static_cast<blasint>(k), ldb = static_cast<blasint>(trans_b ? k : n), ldo = static_cast<blasint>(n);
    if (rows == 1) {  // one token: a matrix-vector product (sgemm's M = 1 path is ~3x slower)
      if (trans_b) {
        scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, cols, kk, 1.0f, pb, ldb, pa, 1, 0.0f, po, 1);
      } else {
        scipy_cblas_sgemv(CblasRowMajor, CblasTrans, kk, cols, 1.0f, pb, ldb, pa, 1, 0.0f, po, 1);
      }
      return;
    }
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, rows, cols, kk, 1.0f, pa,
                      kk, pb, ldb, 0.0f, po, ldo);
  }

  void Units(int64_t u0, int64_t u1) const {
    if (axis == kBatch) {
      for (int64_t e = u0; e < u1; ++e) Block(e, 0, m, 0, n);
    } else if (axis == kRows) {
      Block(0, u0, u1, 0, n);
    } else {
      Block(0, 0, m, u0 * kColumnBlock, std::min(n, u1 * kColumnBlock));
    }
  }
};

int RunTask(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  const Job& job = *static_cast<const Job*>(cdata);
  int64_t units = job.Units(), tasks = penv->num_task;
  int64_t per = (units + tasks - 1) / tasks;
  job.Units(std::min(units, task_id * per), std::min(units, (task_id + 1) * per));
  return 0;
}

void Matmul(DLTensor* a, DLTensor* b, int64_t trans_b, DLTensor* out) {
  static std::once_flag single_threaded;
  std::call_once(single_threaded, [] { scipy_openblas_set_num_threads(1); });
  for (const DLTensor* t : {a, b, out}) {
    if (t->device.device_type != kDLCPU) TVM_FFI_THROW(ValueError) << "wide_cblas_matmul: tensors must be on the CPU";
    if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
      TVM_FFI_THROW(TypeError) << "wide_cblas_matmul: a, b and out must be float32";
    }
    if (!IsCompact(t)) TVM_FFI_THROW(ValueError) << "wide_cblas_matmul: tensors must be contiguous";
  }
  if (a->ndim < 2 || out->ndim != a->ndim || (b->ndim != 2 && b->ndim != a->ndim)) {
    TVM_FFI_THROW(ValueError) << "wide_cblas_matmul: a [..., M, K], b 2-D or batched like a, out [..., M, N]";
  }
  int64_t k = a->shape[a->ndim - 1], m = a->shape[a->ndim - 2];
  int64_t n = trans_b ? b->shape[b->ndim - 2] : b->shape[b->ndim - 1];
  int64_t kb = trans_b ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2];
  int64_t lead = 1;
  for (int i = 0; i < a->ndim - 2; ++i) {
    lead *= a->shape[i];
    if (out->shape[i] != a->shape[i] || (b->ndim > 2 && b->shape[i] != a->shape[i])) {
      TVM_FFI_THROW(ValueError) << "wide_cblas_matmul: batch dims of a, b and out differ";
    }
  }
  if (kb != k || out->shape[out->ndim - 1] != n || out->shape[out->ndim - 2] != m) {
    TVM_FFI_THROW(ValueError) << "wide_cblas_matmul: shapes do not agree (K " << k << " vs " << kb << ")";
  }
  float* po = DataPtr<float>(out);
  if (lead * m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(po, po + lead * m * n, 0.0f);
    return;
  }
  bool shared_b = b->ndim == 2;
  Job job{DataPtr<float>(a), DataPtr<float>(b), po, shared_b ? 1 : lead, shared_b ? lead * m : m, n, k,
          trans_b != 0, shared_b, Job::kColumns};
  if (!shared_b && lead > 1) {
    job.axis = Job::kBatch;
  } else if (job.m > n) {
    job.axis = Job::kRows;
  }
  if (job.batch * job.m * n * k < kParallelWork) {
    job.Units(0, job.Units());
    return;
  }
  if (TVMBackendParallelLaunch(RunTask, &job, 0) != 0) {
    TVM_FFI_THROW(RuntimeError) << "wide_cblas_matmul: TVM's parallel launch failed";
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(wide_cblas_matmul, Matmul);
