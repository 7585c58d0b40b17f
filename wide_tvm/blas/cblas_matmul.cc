// wide_cblas_matmul: dense fp32 (and fp16 / bf16, computed in fp32) matmul through OpenBLAS (the scipy-openblas32 wheel's cblas, symbols prefixed
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
//
// fp16 / bf16 (the wheel has no half-precision GEMM): `a` is widened to fp32 once per call, each split unit widens
// only its own slice of `b` (a weight is read once, in its own dtype) into a per-thread buffer, multiplies in fp32
// and rounds its output block to the dtype (round to nearest even), as torch's CPU matmul accumulates in fp32.
#include <cblas.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/runtime/c_backend_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "dltensor.h"

namespace {

using wide_blas::DataPtr;
using wide_blas::IsCompact;

// Multiply-adds below which a call runs on the calling thread alone (a parallel launch costs a few microseconds).
constexpr int64_t kParallelWork = 64 * 1024;
constexpr int64_t kColumnBlock = 16;  // output columns per split unit: whole cache lines of C and of B^T rows

enum class Type { kF32, kF16, kBF16 };

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    while (!(man & 0x400u)) {
      man <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past the largest half: inf
  if (mag < 0x38800000u) {  // subnormal half (or zero)
    if (mag < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t man = (mag & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(mag >> 23);  // 14 .. 24: the value in units of 2^-24
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((mag - 0x38000000u) >> 13), rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float BF16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBF16(float f) {  // round to nearest even; nan stays nan
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x | 0x400000u) >> 16);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#if defined(__x86_64__)
// 8 lanes at a time where the CPU has them (F16C / AVX2: x86-64-v3; chosen at run time, the library may run on an
// older CPU than it was built on); the same rounding as the scalar code (F16C's round-to-nearest-even)
__attribute__((target("avx2,f16c"))) void WidenF16Avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  for (; i < n; ++i) d[i] = HalfToFloat(s[i]);
}

__attribute__((target("avx2,f16c"))) void NarrowF16Avx2(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = FloatToHalf(s[i]);
}

__attribute__((target("avx2"))) void WidenBF16Avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))), 16);
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) d[i] = BF16ToFloat(s[i]);
}

bool HasAvx2F16c() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}
#endif

// dst[0 : n] = src[offset : offset + n] widened to fp32
void Widen(const void* src, int64_t offset, float* dst, int64_t n, Type t) {
  if (t == Type::kF32) {
    std::memcpy(dst, static_cast<const float*>(src) + offset, static_cast<size_t>(n) * 4);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
#if defined(__x86_64__)
  if (HasAvx2F16c()) return t == Type::kF16 ? WidenF16Avx2(s, dst, n) : WidenBF16Avx2(s, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = t == Type::kF16 ? HalfToFloat(s[i]) : BF16ToFloat(s[i]);
}

// dst[offset : offset + n] = src[0 : n] rounded to the dtype (round to nearest even)
void Narrow(const float* src, void* dst, int64_t offset, int64_t n, Type t) {
  if (t == Type::kF32) {
    std::memcpy(static_cast<float*>(dst) + offset, src, static_cast<size_t>(n) * 4);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst) + offset;
#if defined(__x86_64__)
  if (t == Type::kF16 && HasAvx2F16c()) return NarrowF16Avx2(src, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = t == Type::kF16 ? FloatToHalf(src[i]) : FloatToBF16(src[i]);
}

// out[batch][M, N] = a[batch][M, K] @ op(b[batch or shared]), split into units along `axis`. `a` is fp32 (widened
// by the caller); `b` and `out` are in `type`, widened / rounded block by block.
struct Job {
  const float* a;
  const void* b;
  void* out;
  int64_t batch, m, n, k;
  bool trans_b, shared_b;
  enum Axis { kBatch, kRows, kColumns } axis;
  Type type = Type::kF32;

  int64_t Units() const {
    return axis == kBatch ? batch : axis == kRows ? m : (n + kColumnBlock - 1) / kColumnBlock;
  }

  // rows [m0, m1) x columns [n0, n1) of batch entry `e`
  void Block(int64_t e, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    if (m0 >= m1 || n0 >= n1) return;
    if (type != Type::kF32) return HalfBlock(e, m0, m1, n0, n1);
    const float* pa = a + e * m * k + m0 * k;
    const float* pb = static_cast<const float*>(b) + (shared_b ? 0 : e * n * k) + (trans_b ? n0 * k : n0);
    float* po = static_cast<float*>(out) + e * m * n + m0 * n + n0;
    Gemm(pa, pb, po, m1 - m0, n1 - n0, trans_b ? k : n, n);
  }

  // The same block with `b` widened into a per-thread buffer ([cols, K] or [K, cols]) and `out` rounded from one.
  void HalfBlock(int64_t e, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    thread_local std::vector<float> wb, ob;
    int64_t rows = m1 - m0, cols = n1 - n0, base = shared_b ? 0 : e * n * k;
    wb.resize(static_cast<size_t>(cols * k));
    ob.resize(static_cast<size_t>(rows * cols));
    if (trans_b) {  // b [N, K]: the block's rows, each contiguous
      Widen(b, base + n0 * k, wb.data(), cols * k, type);
    } else {  // b [K, N]: each of the K rows' slice of the block's columns
      for (int64_t i = 0; i < k; ++i) Widen(b, base + i * n + n0, wb.data() + i * cols, cols, type);
    }
    Gemm(a + e * m * k + m0 * k, wb.data(), ob.data(), rows, cols, trans_b ? k : cols, cols);
    for (int64_t r = 0; r < rows; ++r) Narrow(ob.data() + r * cols, out, e * m * n + (m0 + r) * n + n0, cols, type);
  }

  // po[rows, cols] (row stride ldo) = pa[rows, k] @ op(pb) (b's row stride ldb)
  void Gemm(const float* pa, const float* pb, float* po, int64_t rows_, int64_t cols_, int64_t ldb_,
            int64_t ldo_) const {
    auto rows = static_cast<blasint>(rows_), cols = static_cast<blasint>(cols_);
    auto kk = static_cast<blasint>(k), ldb = static_cast<blasint>(ldb_), ldo = static_cast<blasint>(ldo_);
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
  Type type;
  if (a->dtype.code == kDLFloat && a->dtype.bits == 32) {
    type = Type::kF32;
  } else if (a->dtype.code == kDLFloat && a->dtype.bits == 16) {
    type = Type::kF16;
  } else if (a->dtype.code == kDLBfloat && a->dtype.bits == 16) {
    type = Type::kBF16;
  } else {
    TVM_FFI_THROW(TypeError) << "wide_cblas_matmul: float32, float16 or bfloat16 only";
  }
  for (const DLTensor* t : {a, b, out}) {
    if (t->device.device_type != kDLCPU) TVM_FFI_THROW(ValueError) << "wide_cblas_matmul: tensors must be on the CPU";
    if (t->dtype.code != a->dtype.code || t->dtype.bits != a->dtype.bits || t->dtype.lanes != 1) {
      TVM_FFI_THROW(TypeError) << "wide_cblas_matmul: a, b and out must have one dtype";
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
  void* po = DataPtr(out);
  if (lead * m == 0 || n == 0) return;
  if (k == 0) {
    std::vector<float> zeros(static_cast<size_t>(lead * m * n), 0.0f);
    Narrow(zeros.data(), po, 0, lead * m * n, type);
    return;
  }
  std::vector<float> a32;  // fp16 / bf16: the activations widened once
  const float* pa = DataPtr<float>(a);
  if (type != Type::kF32) {
    a32.resize(static_cast<size_t>(lead * m * k));
    Widen(DataPtr(a), 0, a32.data(), lead * m * k, type);
    pa = a32.data();
  }
  bool shared_b = b->ndim == 2;
  Job job{pa, DataPtr(b), po, shared_b ? 1 : lead, shared_b ? lead * m : m, n, k, trans_b != 0, shared_b,
          Job::kColumns, type};
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
