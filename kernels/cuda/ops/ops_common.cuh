// Helpers the element-wise op files share (model_ops.cu, rope_append_kv.cu): the dtype check,
// the 16-byte alignment test and the e4m3 store. Device code; include from .cu files only.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/dtype.h"
#include "kernels/fp8.h"

namespace llm::cuda::ops_detail {

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline void CheckDType(DType dtype, const char* op) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    throw std::invalid_argument(std::string(op) + ": dtype must be BF16 or F16, got " +
                                std::string(DTypeName(dtype)));
  }
}

// N codes F32ToE4m3(x / scale) at dst (one 8-byte store for N = 8: dst is then 8-aligned).
template <int N>
__device__ __forceinline__ void StoreE4m3(uint8_t* dst, const float (&x)[N], float scale) {
  uint8_t c[N];
#pragma unroll
  for (int j = 0; j < N; ++j) c[j] = F32ToE4m3(x[j] / scale);
  if constexpr (N == 8) {
    uint2 packed;
    memcpy(&packed, c, 8);
    *reinterpret_cast<uint2*>(dst) = packed;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = c[j];
  }
}

}  // namespace llm::cuda::ops_detail
