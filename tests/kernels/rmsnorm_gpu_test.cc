// GPU RMSNorm against the CPU reference (label gpu; skips without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/rmsnorm.h"
#include "kernels/dtype.h"

namespace llm {
namespace {

class RmsNormGpu : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  LLM_CUDA_CHECK(cudaMalloc(&d, host.size() * sizeof(T)));
  LLM_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

TEST_P(RmsNormGpu, MatchesCpuReference) {
  const auto [num_tokens, hidden] = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> x(size_t(num_tokens) * hidden), w(hidden), expected(x.size());
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  cpu::RmsNorm(x.data(), w.data(), expected.data(), num_tokens, hidden, 1e-5f);

  float* dx = ToDevice(x);
  float* dw = ToDevice(w);
  std::vector<float> poison(x.size(), std::nanf(""));
  float* dout = ToDevice(poison);  // poisoned: a row the kernel skips shows up as NaN
  cuda::RmsNormF32(dx, dw, dout, num_tokens, hidden, 1e-5f, nullptr);
  std::vector<float> got(x.size());
  LLM_CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << i;
    ASSERT_NEAR(got[i], expected[i], 1e-4f * (1.f + std::fabs(expected[i]))) << i;
  }

  // bf16 in/out: compare against the reference on the bf16-rounded input, within bf16 ulp.
  std::vector<uint16_t> xb(x.size()), outb(x.size(), 0x7fc0);
  std::vector<float> xr(x.size()), expected_b(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = F32ToBf16(x[i]);
    xr[i] = Bf16ToF32(xb[i]);
  }
  cpu::RmsNorm(xr.data(), w.data(), expected_b.data(), num_tokens, hidden, 1e-5f);
  uint16_t* dxb = ToDevice(xb);
  uint16_t* doutb = ToDevice(outb);
  cuda::RmsNormBf16(dxb, dw, doutb, num_tokens, hidden, 1e-5f, nullptr);
  LLM_CUDA_CHECK(cudaMemcpy(outb.data(), doutb, outb.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < outb.size(); ++i) {
    const float g = Bf16ToF32(outb[i]);
    ASSERT_FALSE(std::isnan(g)) << i;
    ASSERT_NEAR(g, expected_b[i], 1e-2f * (1.f + std::fabs(expected_b[i]))) << i;
  }
  for (void* p : {(void*)dx, (void*)dw, (void*)dout, (void*)dxb, (void*)doutb}) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormGpu,
                         ::testing::Values(std::pair{1, 64}, std::pair{7, 4096},
                                           std::pair{33, 1000}, std::pair{128, 8192}));

}  // namespace
}  // namespace llm
