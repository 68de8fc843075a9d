// Helpers the element-wise op files share (model_ops.cu, rope_append_kv.cu): the dtype check,
// the 16-byte alignment test and the e4m3 store (hardware conversion, exact division). Device code;
// include from .cu files only.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// The e4m3 codes of four floats, byte 0 = a: the hardware conversion (cvt.rn.satfinite.e4m3x2.f32:
// nearest even, saturating to +-448), F32ToE4m3 bit for bit for every input but NaN (whose code
// is the hardware's NaN, 0x7f or 0xff). Two instructions for four values where F32ToE4m3 takes
// about fifteen each (bench/fp8_rows_gpu.cu: SiluMulE4m3 at 512 x 14,336, 34.6 -> 22.6 us on
// the H100).
__device__ __forceinline__ uint32_t E4m3x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return (lo & 0xffffu) | (hi << 16);
}

// x / scale for many x and one scale, for the e4m3 codes: y = 1 / scale (IEEE, once), q = x·y,
// then twice q += (x - scale·q)·y by FMA (Markstein's correction: from a faithful q, with y the
// correctly rounded reciprocal and the residual exact, one step gives the correctly rounded
// quotient; the first step makes q faithful). Five FMAs where IEEE division is a longer
// sequence with a range check and a slow-path call per value. The argument needs a normal
// residual: with scale in [2^-60, 2^60] and |x| <= 448·scale (a row's values over its own scale)
// that holds for every quotient of 2^-10 or more, the least whose code is not zero, so the codes
// are IEEE division's bit for bit (fp8_linear_gpu_test checks ties and extreme scales). Other
// scales (and a non-finite one) divide. The branch is uniform over a row.
struct E4m3Divisor {
  float scale, recip;
  bool fast;
  __device__ __forceinline__ explicit E4m3Divisor(float s)
      : scale(s), recip(1.f / s), fast(s >= 0x1p-60f && s <= 0x1p60f) {}
  __device__ __forceinline__ float Div(float x) const {
    if (!fast) return x / scale;
    float q = x * recip;
    q = fmaf(fmaf(-scale, q, x), recip, q);
    // (-0 + 0 is +0: a zero quotient takes x's sign back, as the division keeps it.)
    return copysignf(fmaf(fmaf(-scale, q, x), recip, q), x);
  }
};

// N codes F32ToE4m3(x / scale) at dst (one 8-byte store for N = 8: dst is then 8-aligned);
// Scale: a float (IEEE division) or an E4m3Divisor.
template <int N, typename Scale>
__device__ __forceinline__ void StoreE4m3(uint8_t* dst, const float (&x)[N], const Scale& scale) {
  float q[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if constexpr (std::is_same_v<Scale, float>) {
      q[j] = x[j] / scale;
    } else {
      q[j] = scale.Div(x[j]);
    }
  }
  if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(E4m3x4(q[0], q[1], q[2], q[3]), E4m3x4(q[4], q[5], q[6], q[7]));
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = uint8_t(E4m3x4(q[j], 0.f, 0.f, 0.f) & 0xffu);
  }
}

}  // namespace llm::cuda::ops_detail
