// cpu::Linear against the double-precision reference for every weight dtype and awkward
// shapes (rows not a multiple of the 4-row tile, cols not a multiple of 8, 1..70 tokens).
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

namespace llm::cpu {
namespace {

struct Case {
  DType dtype;
  int64_t rows, cols, num_tokens;
};

class LinearTest : public ::testing::TestWithParam<Case> {};

TEST_P(LinearTest, MatchesReference) {
  const Case c = GetParam();
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(c.num_tokens * c.cols));
  for (float& v : x) v = dist(rng);
  std::vector<float> w32(static_cast<size_t>(c.rows * c.cols));
  std::vector<uint16_t> w16(w32.size());
  for (size_t i = 0; i < w32.size(); ++i) {
    const float v = dist(rng);
    w32[i] = v;
    w16[i] = c.dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
  }
  WeightMatrix w{c.dtype, c.dtype == DType::kF32 ? (const void*)w32.data() : w16.data(), c.rows,
                 c.cols};
  std::vector<float> got(static_cast<size_t>(c.num_tokens * c.rows), std::nanf(""));
  std::vector<float> want(got.size());
  Linear(x.data(), w, got.data(), c.num_tokens);
  LinearReference(x.data(), w, want.data(), c.num_tokens);
  // fp32 accumulation over `cols` terms of magnitude <= 1: error ~ sqrt(cols) * eps * |sum|.
  const double tol = 1e-5 * std::sqrt(static_cast<double>(c.cols)) * 4;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " never written";
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "output " << i;
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                              {5, 7},
                              {17, 64},
                              {64, 172},
                              {250, 1003},
                              {96, 2048}}) {
      for (int64_t tokens : {1, 2, 3, 33, 70}) cases.push_back({t, rows, cols, tokens});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest, ::testing::ValuesIn(Cases()));

// Batch invariance: a token's outputs are bit-identical whether it is computed alone or
// among others (the engine's same-tokens-alone-or-batched guarantee rests on this).
TEST(Linear, BitIdenticalAloneOrBatched) {
  const int64_t rows = 67, cols = 300, tokens = 9;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(tokens * cols)), w(static_cast<size_t>(rows * cols));
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = F32ToBf16(w[i]);
  for (const WeightMatrix m : {WeightMatrix{DType::kF32, w.data(), rows, cols},
                               WeightMatrix{DType::kBF16, wb.data(), rows, cols}}) {
    std::vector<float> batched(static_cast<size_t>(tokens * rows));
    Linear(x.data(), m, batched.data(), tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> alone(static_cast<size_t>(rows));
      Linear(x.data() + t * cols, m, alone.data(), 1);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(alone[r], batched[t * rows + r]) << "token " << t << " row " << r;
      }
    }
  }
}

TEST(LoadRow, ConvertsEachDtype) {
  const std::vector<float> f = {1.5f, -2.25f, 0.f, 1e-3f};
  std::vector<uint16_t> b, h;
  for (float v : f) {
    b.push_back(F32ToBf16(v));
    h.push_back(F32ToF16(v));
  }
  std::vector<float> out(4);
  LoadRow({DType::kBF16, b.data(), 1, 4}, 0, out.data());
  EXPECT_FLOAT_EQ(out[1], -2.25f);
  LoadRow({DType::kF16, h.data(), 1, 4}, 0, out.data());
  EXPECT_FLOAT_EQ(out[0], 1.5f);
  EXPECT_NEAR(out[3], 1e-3f, 1e-6f);
}

TEST(DType, RoundTripsAndRounding) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(65504.f), 0x7bff);
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);                 // overflow to inf
  EXPECT_FLOAT_EQ(F16ToF32(0x0001), 5.9604645e-8f);  // smallest subnormal
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
  for (float v : {0.1f, -3.7f, 1234.5f, 6.1e-5f}) {
    EXPECT_NEAR(F16ToF32(F32ToF16(v)), v, std::fabs(v) * 1e-3f);
    EXPECT_NEAR(Bf16ToF32(F32ToBf16(v)), v, std::fabs(v) * 8e-3f);
  }
}

}  // namespace
}  // namespace llm::cpu
