// Element conversions and 16-byte vector accesses shared by the CUDA kernels of kernels/cuda
// (model_ops.cu, gemv.cu, rmsnorm.cu, fill.cu, the attention kernels): bf16 / fp16 <-> fp32,
// rounding to nearest even, one element or a packed pair (the mma operand format), and e4m3 ->
// fp16 pairs; each defined here once.
// Test and bench: through their kernels (tests/kernels/*_gpu_test.cc, bench/*_gpu.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

// Two floats as one packed 32-bit pair of T (low half = first, rounding to nearest even): the
// mma A / B operand format.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// A packed pair of T as a pair of the mma type M: as is, or (fp8 caches: M = fp16) through
// fp32, saturated to ±65504 so that no finite value becomes infinite.
template <typename T, typename M>
__device__ __forceinline__ uint32_t ToMmaPair(uint32_t x) {
  if constexpr (std::is_same_v<T, M>) {
    return x;
  } else {
    const T* e = reinterpret_cast<const T*>(&x);
    constexpr float kMax = 65504.f;
    return PackPair<M>(fminf(fmaxf(ToF32(e[0]), -kMax), kMax),
                       fminf(fmaxf(ToF32(e[1]), -kMax), kMax));
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

// The four e4m3 codes of `codes` (byte 0 first) as floats, exactly: E4m3x4ToHalf2x2, then
// fp16 -> fp32.
__device__ __forceinline__ void E4m3x4ToF32(uint32_t codes, float* f) {
  uint32_t lo, hi;
  E4m3x4ToHalf2x2(codes, lo, hi);
  const float2 a = __half22float2(reinterpret_cast<const __half2&>(lo));
  const float2 b = __half22float2(reinterpret_cast<const __half2&>(hi));
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

// Two e4m3 codes (the low two bytes, low byte first) -> their exact fp16 values, packed,
// through the cuda_fp8.h intrinsic (prefill_attention_v3_mma.cu's tile dequantization). It
// costs two integer instructions per pair more than E4m3x4ToHalf2x2; v3 still uses it
// (switching would change v3's code: a change to measure on a GPU, not a refactor).
__device__ __forceinline__ uint32_t E4m3x2ToHalf2(uint32_t codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// Rounds x to T and back (what storing to T and reloading gives).
template <typename T>
__device__ __forceinline__ float RoundTo(float x) {
  return ToF32(FromF32<T>(x));
}

}  // namespace llm::cuda::vec
