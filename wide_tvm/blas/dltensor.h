// What both BLAS externs ask of a DLTensor (header-only; wide_tvm/blas/extern.py puts this folder on the include path).
#ifndef WIDE_TVM_BLAS_DLTENSOR_H_
#define WIDE_TVM_BLAS_DLTENSOR_H_

#include <dlpack/dlpack.h>

#include <cstdint>

namespace wide_blas {

// Row-major contiguous (no strides, or the compact ones; size-1 dims may carry any stride).
inline bool IsCompact(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

// The first element (the data pointer plus the byte offset).
template <typename T = void>
inline T* DataPtr(const DLTensor* t) {
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset);
}

}  // namespace wide_blas

#endif  // WIDE_TVM_BLAS_DLTENSOR_H_
