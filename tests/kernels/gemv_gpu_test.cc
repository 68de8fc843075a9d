// The small-batch fused GEMV (kernels/cuda/gemv.h) against a float64 CPU reference of the
// same math: each prologue (none, RMSNorm of the fp32 residual, SiLU·mul of gate|up) rounded
// to the activation dtype as the unfused kernels round, then y = a · wᵀ, stored in the dtype
// or accumulated into fp32. Label gpu (skips without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/dtype.h"

namespace llm {
namespace {

struct Case {
  DType dtype;
  cuda::GemvPrologue prologue;
  int n, m, k;
  bool accumulate;
};

std::string Name(const Case& c) {
  const char* p = c.prologue == cuda::GemvPrologue::kNone      ? "none"
                  : c.prologue == cuda::GemvPrologue::kRmsNorm ? "rmsnorm"
                                                               : "silumul";
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + "_" + p + "_n" +
         std::to_string(c.n) + "_m" + std::to_string(c.m) + "_k" + std::to_string(c.k) +
         (c.accumulate ? "_acc" : "");
}

uint16_t ToHalf(DType t, float x) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
float FromHalf(DType t, uint16_t h) { return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h); }

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  LLM_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

class GemvGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(GemvGpu, MatchesFloat64Reference) {
  const Case c = GetParam();
  std::mt19937 rng(c.n * 131 + c.m + c.k);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = c.n, m = c.m, k = c.k;
  const int64_t x_cols = c.prologue == cuda::GemvPrologue::kSiluMul ? 2 * k : k;
  std::vector<float> xf(static_cast<size_t>(n * x_cols)), norm(static_cast<size_t>(k));
  for (float& v : xf) v = dist(rng);
  for (float& v : norm) v = 1.f + 0.3f * dist(rng);
  std::vector<uint16_t> xh(xf.size()), w(static_cast<size_t>(m * k));
  for (size_t i = 0; i < xf.size(); ++i) {
    xh[i] = ToHalf(c.dtype, xf[i]);
    if (c.prologue != cuda::GemvPrologue::kRmsNorm) xf[i] = FromHalf(c.dtype, xh[i]);
  }
  for (uint16_t& v : w) v = ToHalf(c.dtype, 0.05f * dist(rng));
  // The prologue on the host, rounded to the dtype as the device rounds it.
  std::vector<double> act(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < k; ++i) ss += double(xf[t * k + i]) * xf[t * k + i];
    const float inv = 1.f / std::sqrt(float(ss / double(k)) + 1e-5f);
    for (int64_t i = 0; i < k; ++i) {
      float a = 0;
      if (c.prologue == cuda::GemvPrologue::kNone) a = xf[t * k + i];
      if (c.prologue == cuda::GemvPrologue::kRmsNorm) a = norm[i] * (xf[t * k + i] * inv);
      if (c.prologue == cuda::GemvPrologue::kSiluMul) {
        const float g = xf[t * 2 * k + i], u = xf[t * 2 * k + k + i];
        a = g / (1.f + std::exp(-g)) * u;
      }
      act[t * k + i] = FromHalf(c.dtype, ToHalf(c.dtype, a));
    }
  }
  std::vector<float> y0(static_cast<size_t>(n * m));
  for (float& v : y0) v = dist(rng);

  void* dx = c.prologue == cuda::GemvPrologue::kRmsNorm ? static_cast<void*>(Upload(xf))
                                                         : static_cast<void*>(Upload(xh));
  float* dnorm = Upload(norm);
  uint16_t* dw = Upload(w);
  void* dy = nullptr;
  if (c.accumulate) {
    dy = Upload(y0);
  } else {
    dy = Upload(std::vector<uint16_t>(size_t(n * m), 0x7fc0));  // poisoned (NaN)
  }
  cuda::GemvArgs a;
  a.prologue = c.prologue;
  a.x = dx;
  a.norm_weight = dnorm;
  a.eps = 1e-5f;
  a.w = dw;
  a.y = dy;
  a.accumulate = c.accumulate;
  a.y_f32 = c.accumulate;
  a.n = n;
  a.m = m;
  a.k = k;
  a.dtype = c.dtype;
  ASSERT_TRUE(cuda::GemvSupports(a));
  cuda::Gemv(a, nullptr);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(static_cast<size_t>(n * m));
  if (c.accumulate) {
    LLM_CUDA_CHECK(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(got.size());
    LLM_CUDA_CHECK(cudaMemcpy(h.data(), dy, h.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); ++i) got[i] = FromHalf(c.dtype, h[i]);
  }
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < m; ++j) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = act[t * k + i] * FromHalf(c.dtype, w[j * k + i]);
        ref += p;
        mag += std::fabs(p);
      }
      if (c.accumulate) ref += y0[t * m + j];
      const double g = got[t * m + j];
      ASSERT_TRUE(std::isfinite(g)) << "token " << t << " row " << j;
      // fp32 accumulation (order differs from the reference) + one output rounding.
      const double out_ulp = c.accumulate ? 0 : (c.dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024);
      // A prologue recomputed in another order can round an activation to the neighbouring
      // half-precision value: a wider relative term for those.
      const double rel = c.prologue == cuda::GemvPrologue::kNone ? 1e-5 : 2e-4;
      const double tol = rel * mag + out_ulp * std::fabs(ref) + 1e-6;
      worst = std::max(worst, std::fabs(g - ref) / tol);
      ASSERT_LE(std::fabs(g - ref), tol) << "token " << t << " row " << j << " ref " << ref;
    }
  }
  std::printf("  %s: worst error %.2f of tolerance\n", Name(c).c_str(), worst);
  cudaFree(dx);
  cudaFree(dnorm);
  cudaFree(dw);
  cudaFree(dy);
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (DType d : {DType::kBF16, DType::kF16}) {
    for (auto p : {cuda::GemvPrologue::kNone, cuda::GemvPrologue::kRmsNorm,
                   cuda::GemvPrologue::kSiluMul}) {
      out.push_back({d, p, 1, 1000, 512, false});
      out.push_back({d, p, 3, 77, 4096, true});
      out.push_back({d, p, 8, 256, 1384, false});
    }
  }
  out.push_back({DType::kBF16, cuda::GemvPrologue::kNone, 5, 4100, 8, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvGpu, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

TEST(GemvApi, RejectsWhatItCannotRun) {
  cuda::GemvArgs a;
  alignas(16) static uint16_t buf[64];
  a.x = buf;
  a.w = buf;
  a.n = 9;
  a.m = 4;
  a.k = 8;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.n = 1;
  a.k = 12;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.k = 16;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.dtype = DType::kF32;
  EXPECT_FALSE(cuda::GemvSupports(a));
  EXPECT_THROW(cuda::Gemv(a, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace llm
