// Shared fixtures of the small-batch GEMV GPU tests (kernels/cuda/gemv/gemv.h):
// gemv_gpu_test.cc (each epilogue vs a float64 reference, every e4m3 code, a PDL chain in a CUDA
// graph, the argument checks) and gemv_fused_gpu_test.cc (the fused SiLU·mul, RoPE and folded
// RMSNorm paths). GemvArgs for a case, half-precision conversions, device upload / download,
// random half-precision values and random e4m3 weights with row scales (cpu::QuantizeFp8Rows).
// Header-only: each test executable includes it.
//   ninja -C build gemv_gpu_test gemv_fused_gpu_test && (cd build && ctest -L gpu -R gemv_)
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/dtype.h"

namespace llm::test::gemv {

using E = cuda::GemvEpilogue;

// The arguments every case sets (w_scale null: dtype weights); the rest keep their defaults.
inline cuda::GemvArgs Args(E epilogue, const void* x, const void* w, const float* w_scale, void* y,
                           int64_t n, int64_t m, int64_t k, DType dtype) {
  cuda::GemvArgs a;
  a.epilogue = epilogue;
  a.x = x;
  a.w = w;
  a.w_scale = w_scale;
  a.y = y;
  a.n = n;
  a.m = m;
  a.k = k;
  a.dtype = dtype;
  return a;
}

inline uint16_t ToHalf(DType t, float x) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
inline float FromHalf(DType t, uint16_t h) {
  return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
}
inline float RoundHalf(DType t, double x) { return FromHalf(t, ToHalf(t, float(x))); }

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  LLM_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> Download(const void* d, size_t count) {
  std::vector<T> h(count);
  LLM_CUDA_CHECK(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

inline std::vector<uint16_t> RandomHalf(DType t, size_t count, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> v(count);
  for (uint16_t& e : v) e = ToHalf(t, scale * dist(rng));
  return v;
}

// Weights as --quantization fp8 stores them: N(0, scale²) weights [rows, cols] quantized by
// cpu::QuantizeFp8Rows into e4m3 codes and one fp32 scale per row.
struct Fp8Matrix {
  std::vector<uint8_t> codes;  // [rows, cols]
  std::vector<float> scales;   // [rows]
};

inline Fp8Matrix RandomFp8(int64_t rows, int64_t cols, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = scale * dist(rng);
  Fp8Matrix q{std::vector<uint8_t>(w.size()), std::vector<float>(static_cast<size_t>(rows))};
  EXPECT_TRUE(cpu::QuantizeFp8Rows(w.data(), rows, cols, q.codes.data(), q.scales.data()));
  return q;
}

}  // namespace llm::test::gemv
