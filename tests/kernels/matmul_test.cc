// cpu::Linear against the double-precision reference for every weight dtype (FP8 e4m3 with
// per-row scales included; bf16 / f16 row-major and packed (kernels/cpu/matmul_half.h); int8:
// tests/kernels/matmul_int8_test.cc) and awkward shapes (rows not a multiple of the 4-row tile
// or the 16-row group, cols odd or not a multiple of 8, 1..70 tokens, and 600 tokens over
// several column panels and token blocks).
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/matmul_half.h"
#include "kernels/cpu/matmul_int8.h"
#include "kernels/fp8.h"

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
  std::vector<uint8_t> w8(w32.size());
  std::vector<float> scales(static_cast<size_t>(c.rows));
  if (c.dtype == DType::kF8E4M3) {
    ASSERT_TRUE(QuantizeFp8Rows(w32.data(), c.rows, c.cols, w8.data(), scales.data()));
    w.data = w8.data();
    w.scales = scales.data();
  }
  std::vector<float> want(static_cast<size_t>(c.num_tokens * c.rows));
  LinearReference(x.data(), w, want.data(), c.num_tokens);
  // fp32 accumulation over `cols` terms of magnitude <= 1: error ~ sqrt(cols) * eps * |sum|.
  const double tol = 1e-5 * std::sqrt(static_cast<double>(c.cols)) * 4;
  std::vector<uint16_t> packed_storage;
  std::vector<WeightMatrix> layouts = {w};
  if ((c.dtype == DType::kBF16 || c.dtype == DType::kF16) && HalfKernelWantsPacked()) {
    packed_storage.resize(size_t(HalfPackedBytes(c.rows, c.cols) / 2));
    layouts.push_back(PackHalf(w, packed_storage.data()));
  }
  for (const WeightMatrix& m : layouts) {
    SCOPED_TRACE(m.packed ? "packed" : "row-major");
    std::vector<float> got(want.size(), std::nanf(""));
    Linear(x.data(), m, got.data(), c.num_tokens);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " never written";
      ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "output " << i;
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                              {5, 7},
                              {17, 64},
                              {64, 172},
                              {250, 1003},
                              {96, 2048}}) {
      for (int64_t tokens : {1, 2, 3, 33, 70}) cases.push_back({t, rows, cols, tokens});
    }
    cases.push_back({t, 40, 1003, 600});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest, ::testing::ValuesIn(Cases()));

// Batch invariance: a token's outputs are bit-identical whether it is computed alone or
// among others (the engine's same-tokens-alone-or-batched guarantee rests on this).
void ExpectBitIdenticalAloneOrBatched(int64_t cols);
// FP8 batches widen each row chunk once and take another code path than a lone token: every
// column count exercises its vector bodies and scalar tails.
TEST(Linear, BitIdenticalAloneOrBatched) {
  for (const int64_t cols : {int64_t{17}, int64_t{64}, int64_t{300}, int64_t{1003}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    ExpectBitIdenticalAloneOrBatched(cols);
  }
}

void ExpectBitIdenticalAloneOrBatched(int64_t cols) {
  const int64_t rows = 67, tokens = 9;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(tokens * cols)), w(static_cast<size_t>(rows * cols));
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  std::vector<uint16_t> wb(w.size()), wh(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    wb[i] = F32ToBf16(w[i]);
    wh[i] = F32ToF16(w[i]);
  }
  std::vector<uint8_t> w8(w.size());
  std::vector<float> s8(static_cast<size_t>(rows));
  ASSERT_TRUE(QuantizeFp8Rows(w.data(), rows, cols, w8.data(), s8.data()));
  std::vector<int8_t> wi(w.size());
  std::vector<float> si(static_cast<size_t>(rows));
  ASSERT_TRUE(QuantizeInt8Rows(w.data(), rows, cols, wi.data(), si.data()));
  std::vector<WeightMatrix> matrices = {
      WeightMatrix{DType::kF32, w.data(), rows, cols},
      WeightMatrix{DType::kBF16, wb.data(), rows, cols},
      WeightMatrix{DType::kF16, wh.data(), rows, cols},
      WeightMatrix{DType::kF8E4M3, w8.data(), rows, cols, s8.data()},
      WeightMatrix{DType::kI8, wi.data(), rows, cols, si.data()}};
  std::vector<uint16_t> pb(size_t(HalfPackedBytes(rows, cols) / 2)), ph(pb.size());
  if (HalfKernelWantsPacked()) {
    matrices.push_back(PackHalf(matrices[1], pb.data()));
    matrices.push_back(PackHalf(matrices[2], ph.data()));
  }
  for (const WeightMatrix& m : matrices) {
    SCOPED_TRACE(std::string(DTypeName(m.dtype)) + (m.packed ? " packed" : ""));
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

// FP8 weights: the quantizer's codes and scales, and the kernel's exact dequantization. Every
// finite e4m3 code (all 254 of them, in one row with a power-of-two scale, so each product
// with x = 1 is exact) sums to what E4m3ToF32 says, and a one-hot x reads each code back.
TEST(Fp8Weights, KernelDequantizesEveryCodeExactly) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(uint8_t(c));  // NaN codes are never written
  const int64_t cols = int64_t(codes.size());             // 254: vector body and a tail
  const float scale = 0.25f;
  const WeightMatrix w{DType::kF8E4M3, codes.data(), 1, cols, &scale};
  for (int64_t k = 0; k < cols; ++k) {
    std::vector<float> x(static_cast<size_t>(cols), 0.f);
    x[k] = 1.f;
    float y = NAN;
    Linear(x.data(), w, &y, 1);
    ASSERT_EQ(y, E4m3ToF32(codes[k]) * scale) << "code " << int(codes[k]);
  }
}

TEST(Fp8Weights, QuantizerScalesEachRowToItsMaximum) {
  const int64_t rows = 3, cols = 5;
  const std::vector<float> w = {0.5f,  -1.f,   0.25f, 0.f, 0.125f,  // max 1
                                0.f,   0.f,    0.f,   0.f, 0.f,     // all zero: scale 1
                                448.f, -896.f, 1e-6f, 3.f, 7.f};    // max 896: scale 2
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> s(static_cast<size_t>(rows));
  ASSERT_TRUE(QuantizeFp8Rows(w.data(), rows, cols, q.data(), s.data()));
  EXPECT_EQ(s[0], 1.f / 448.f);
  EXPECT_EQ(s[1], 1.f);
  EXPECT_EQ(s[2], 2.f);
  // The row maximum maps to the largest code (-448: 0xfe), zeros to zero, and every code is
  // the nearest-even e4m3 of w / scale, within half a step of w (3 mantissa bits: 2^-4 of
  // |w| for normal codes, half the smallest subnormal, scale · 2^-10, below them).
  EXPECT_EQ(q[1], 0xfe);
  EXPECT_EQ(q[11], 0xfe);
  for (int64_t i = 5; i < 10; ++i) EXPECT_EQ(q[size_t(i)], 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      EXPECT_EQ(q[i], F32ToE4m3(w[i] / s[size_t(r)])) << i;
      const float back = E4m3ToF32(q[i]) * s[size_t(r)];
      EXPECT_LE(std::fabs(back - w[i]), std::max(std::fabs(w[i]) / 16, s[size_t(r)] / 1024)) << i;
    }
  }
  // The weights the matrix stands for are what LoadRow gives back.
  const WeightMatrix m{DType::kF8E4M3, q.data(), rows, cols, s.data()};
  std::vector<float> row(static_cast<size_t>(cols));
  LoadRow(m, 2, row.data());
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(row[size_t(c)], E4m3ToF32(q[size_t(10 + c)]) * 2.f);
}

TEST(Fp8Weights, QuantizerRejectsNonFiniteWeights) {
  std::vector<uint8_t> q(4);
  std::vector<float> s(2);
  const std::vector<float> nan = {1.f, 2.f, std::nanf(""), 0.f};
  const std::vector<float> inf = {1.f, INFINITY, 0.f, 0.f};
  EXPECT_FALSE(QuantizeFp8Rows(nan.data(), 2, 2, q.data(), s.data()));
  EXPECT_FALSE(QuantizeFp8Rows(inf.data(), 2, 2, q.data(), s.data()));
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

// The packed 16-bit layout holds every value where LoadRow finds it (odd columns, a partial
// group of rows).
TEST(LoadRow, ReadsPackedHalfMatrices) {
  const int64_t rows = 21, cols = 35;
  std::vector<uint16_t> w(size_t(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = F32ToBf16(float(i) * 0.25f - 40.f);
  for (const DType t : {DType::kBF16, DType::kF16}) {
    const WeightMatrix m{t, w.data(), rows, cols};
    std::vector<uint16_t> storage(size_t(HalfPackedBytes(rows, cols) / 2));
    EXPECT_EQ(std::ssize(storage), 32 * 36);  // rows to 32, columns to 36
    const WeightMatrix p = PackHalf(m, storage.data());
    EXPECT_TRUE(p.packed);
    EXPECT_EQ(p.num_bytes(), 32 * 36 * 2);
    std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(PackedHalfValue(p, r, c), w[size_t(r * cols + c)]);
      LoadRow(m, r, a.data());
      LoadRow(p, r, b.data());
      ASSERT_EQ(a, b);
    }
  }
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
