// Element conversions and 16-byte vector accesses shared by the CUDA kernels of kernels/cuda
// (model_ops.cu, gemv.cu, the attention kernels): bf16 / fp16 <-> fp32, rounding to nearest
// even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace llm::cuda::vec {

constexpr int kVec = 8;  // elements per 16-byte chunk of a 2-byte type

template <typename T>
__device__ __forceinline__ float ToF32(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}
template <typename T>
__device__ __forceinline__ T FromF32(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// N consecutive elements <-> N floats. N = 8 uses one 16-byte access (the caller guarantees
// 16-byte alignment); N = 1 is the scalar fallback.
template <typename T, int N>
__device__ __forceinline__ void Load(const T* p, float (&x)[N]) {
  if constexpr (N == kVec) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = ToF32(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = ToF32(p[i]);
  }
}
template <typename T, int N>
__device__ __forceinline__ void Store(T* p, const float (&x)[N]) {
  if constexpr (N == kVec) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = FromF32<T>(x[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = FromF32<T>(x[i]);
  }
}
template <int N>
__device__ __forceinline__ void LoadF32(const float* p, float (&x)[N]) {
  if constexpr (N == kVec) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = p[i];
  }
}
template <int N>
__device__ __forceinline__ void StoreF32(float* p, const float (&x)[N]) {
  if constexpr (N == kVec) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = x[i];
  }
}

// The four e4m3 codes of `codes` as two fp16 pairs, exactly (every e4m3 value is an fp16
// value; sm_89+): lo <- bytes 0, 1 and hi <- bytes 2, 3 (the first of each pair in the low
// half). One cvt.f16x2.e4m3x2 per pair, fed the 16-bit halves of the register directly (the
// cuda_fp8.h intrinsic truncates and shifts first: two more integer instructions per pair).
__device__ __forceinline__ void E4m3x4ToHalf2x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(codes));
}

// Rounds x to T and back (what storing to T and reloading gives).
template <typename T>
__device__ __forceinline__ float RoundTo(float x) {
  return ToF32(FromF32<T>(x));
}

}  // namespace llm::cuda::vec
