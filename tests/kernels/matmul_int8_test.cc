// The 8-bit CPU linear layer (kernels/cpu/matmul_int8.h): every kernel this CPU runs (AVX-512
// VNNI on packed weights, AVX2, portable) against LinearInt8Reference (the same quantization of
// x, exact integer block sums, double accumulation) over awkward shapes (cols not a multiple of
// 32 or 64, rows not a multiple of the 4-row tile or the 16-row group, 1..9 tokens, batches
// spanning several column panels and token blocks); a token's result alone equals its result
// in a batch bit for bit (batch invariance); the VNNI kernel equals the portable one bit for
// bit; the packed layout holds the codes; the weight quantization's rule and its error against
// fp32; NaN inputs give NaN outputs. A kernel this CPU lacks is skipped with a message.
#include "kernels/cpu/matmul_int8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace llm::cpu {
namespace {

constexpr Int8Kernel kKernels[] = {Int8Kernel::kAvx512Vnni, Int8Kernel::kAvx2,
                                   Int8Kernel::kPortable};

struct Quantized {
  std::vector<float> w32;
  std::vector<int8_t> codes;
  std::vector<float> scales;
  WeightMatrix m;
};

Quantized RandomWeights(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.05f);
  Quantized q;
  q.w32.resize(size_t(rows * cols));
  for (float& v : q.w32) v = dist(rng);
  q.codes.resize(q.w32.size());
  q.scales.resize(size_t(rows));
  EXPECT_TRUE(QuantizeInt8Rows(q.w32.data(), rows, cols, q.codes.data(), q.scales.data()));
  q.m = {DType::kI8, q.codes.data(), rows, cols, q.scales.data()};
  return q;
}

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  x[0] = 40.f;  // an outlier: its block's scale is large, the other blocks' are not
  return x;
}

// The matrix kernel k reads: packed (in `storage`) for VNNI, row-major otherwise.
WeightMatrix ForKernel(const Quantized& q, Int8Kernel k, std::vector<uint8_t>& storage) {
  if (k != Int8Kernel::kAvx512Vnni) return q.m;
  storage.assign(size_t(Int8PackedBytes(q.m.rows, q.m.cols)), 0);
  return PackInt8(q.m, storage.data());
}

class Int8KernelTest : public ::testing::TestWithParam<Int8Kernel> {
 protected:
  void SetUp() override {
    if (!Int8KernelSupported(GetParam())) {
      GTEST_SKIP() << "this CPU has no " << Int8KernelName(GetParam())
                   << " (best here: " << Int8KernelName(BestInt8Kernel()) << ")";
    }
  }
};

TEST_P(Int8KernelTest, MatchesTheReferenceOfTheSameQuantization) {
  struct Case {
    int64_t rows, cols, tokens;
  };
  for (const Case c : {Case{33, 172, 1}, Case{16, 64, 3}, Case{7, 100, 9}, Case{64, 2085, 5},
                       Case{5, 31, 2}, Case{18, 4096, 1}, Case{4, 1, 4}, Case{129, 256, 8},
                       Case{100, 600, 7}, Case{40, 3000, 200}}) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols << ", " << c.tokens << " tokens");
    const Quantized w = RandomWeights(c.rows, c.cols, uint32_t(c.rows * 7 + c.cols));
    std::vector<uint8_t> storage;
    const WeightMatrix m = ForKernel(w, GetParam(), storage);
    const std::vector<float> x = RandomX(c.tokens * c.cols, uint32_t(c.cols));
    std::vector<float> got(size_t(c.tokens * c.rows), std::nanf("")), want(got.size());
    LinearInt8(x.data(), m, got.data(), c.tokens, GetParam());
    LinearInt8Reference(x.data(), w.m, want.data(), c.tokens);
    // fp32 sums of the lanes (or blocks): a few ulps of the sum of their magnitudes, bounded
    // here by the sum of |x| · |w| of the row.
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t r = 0; r < c.rows; ++r) {
        double mag = 0;
        for (int64_t i = 0; i < c.cols; ++i) {
          mag += std::fabs(double(x[size_t(t * c.cols + i)]) * w.codes[size_t(r * c.cols + i)] *
                           w.scales[size_t(r)]);
        }
        const size_t at = size_t(t * c.rows + r);
        ASSERT_FALSE(std::isnan(got[at])) << "row " << r << " token " << t << " never written";
        ASSERT_NEAR(got[at], want[at], 2e-6 * mag + 1e-30) << "row " << r << " token " << t;
      }
    }
    // Through cpu::Linear (the kAuto kernel) as the model calls it.
    if (GetParam() == BestInt8Kernel()) {
      std::vector<float> via_linear(got.size());
      Linear(x.data(), m, via_linear.data(), c.tokens);
      EXPECT_EQ(via_linear, got);
    }
  }
}

TEST_P(Int8KernelTest, ATokensResultDoesNotDependOnItsBatch) {
  const int64_t rows = 37, cols = 300, tokens = 11;
  const Quantized w = RandomWeights(rows, cols, 5);
  std::vector<uint8_t> storage;
  const WeightMatrix m = ForKernel(w, GetParam(), storage);
  const std::vector<float> x = RandomX(tokens * cols, 6);
  std::vector<float> batch(size_t(tokens * rows));
  LinearInt8(x.data(), m, batch.data(), tokens, GetParam());
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> alone(static_cast<size_t>(rows));
    LinearInt8(x.data() + t * cols, m, alone.data(), 1, GetParam());
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(alone[size_t(r)], batch[size_t(t * rows + r)]) << "token " << t << " row " << r;
    }
  }
}

TEST_P(Int8KernelTest, NonFiniteInputsGiveNaN) {
  const Quantized w = RandomWeights(8, 96, 9);
  std::vector<uint8_t> storage;
  const WeightMatrix m = ForKernel(w, GetParam(), storage);
  std::vector<float> x = RandomX(2 * 96, 10);
  x[5] = std::nanf("");
  x[96 + 70] = INFINITY;
  std::vector<float> y(16);
  LinearInt8(x.data(), m, y.data(), 2, GetParam());
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

// The packed layout: every code where PackedInt8Code and LoadRow find it, the padding outside.
TEST(Int8Packing, HoldsEveryCode) {
  const Quantized w = RandomWeights(21, 70, 3);
  std::vector<uint8_t> storage(size_t(Int8PackedBytes(21, 70)));
  EXPECT_EQ(std::ssize(storage), 32 * 96);  // rows to 32, columns to 96
  const WeightMatrix m = PackInt8(w.m, storage.data());
  EXPECT_TRUE(m.packed);
  std::vector<float> packed_row(70), plain_row(70);
  for (int64_t r = 0; r < 21; ++r) {
    for (int64_t c = 0; c < 70; ++c)
      ASSERT_EQ(PackedInt8Code(m, r, c), w.codes[size_t(r * 70 + c)]);
    LoadRow(m, r, packed_row.data());
    LoadRow(w.m, r, plain_row.data());
    ASSERT_EQ(packed_row, plain_row);
  }
  EXPECT_EQ(PackedInt8Code(m, 30, 90), 0);
  EXPECT_EQ(m.num_bytes(), 32 * 96 + 21 * 4);
}

// The VNNI kernel does the portable kernel's arithmetic (int32 block sums, the blocks in order
// by fma, the row scale last): equal bit for bit, decode and batch.
TEST(Int8Packing, VnniEqualsThePortableKernelBitForBit) {
  if (!Int8KernelSupported(Int8Kernel::kAvx512Vnni)) {
    GTEST_SKIP() << "this CPU has no avx512-vnni (best here: " << Int8KernelName(BestInt8Kernel())
                 << ")";
  }
  for (const int64_t tokens : {1, 2, 50}) {
    const Quantized w = RandomWeights(75, 1100, 7);
    std::vector<uint8_t> storage;
    const WeightMatrix m = ForKernel(w, Int8Kernel::kAvx512Vnni, storage);
    const std::vector<float> x = RandomX(tokens * 1100, 8);
    std::vector<float> vnni(size_t(tokens * 75)), portable(vnni.size());
    LinearInt8(x.data(), m, vnni.data(), tokens, Int8Kernel::kAvx512Vnni);
    LinearInt8(x.data(), w.m, portable.data(), tokens, Int8Kernel::kPortable);
    EXPECT_EQ(vnni, portable) << tokens << " tokens";
  }
  // Packed weights refuse a kernel that cannot read them.
  const Quantized w = RandomWeights(4, 32, 1);
  std::vector<uint8_t> storage;
  const WeightMatrix m = ForKernel(w, Int8Kernel::kAvx512Vnni, storage);
  std::vector<float> x(32, 1.f), y(4);
  EXPECT_THROW(LinearInt8(x.data(), m, y.data(), 1, Int8Kernel::kAvx2), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Int8KernelTest, ::testing::ValuesIn(kKernels),
                         [](const auto& info) {
                           std::string name = Int8KernelName(info.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The weights' rule: scale = max|w| / 127, codes nearest-even in [-127, 127]; an all-zero row
// has scale 1; a NaN or infinity is refused. Error against the fp32 weights, per weight, at
// most half a step; and the whole product's error against fp32 (x unquantized) is small.
TEST(Int8Quantization, RowsAndTheErrorAgainstFp32) {
  // Row 1's scale is exactly 1 (max 127): its ties are exact, -63.5 -> -64 and 2.5 -> 2.
  const std::vector<float> src = {0.f, 0.f, 0.f, 0.f, 127.f, -63.5f, 2.5f, -127.f};
  std::vector<int8_t> codes(8);
  std::vector<float> scales(2);
  ASSERT_TRUE(QuantizeInt8Rows(src.data(), 2, 4, codes.data(), scales.data()));
  EXPECT_EQ(scales[0], 1.f);
  EXPECT_EQ(scales[1], 1.f);
  EXPECT_EQ(codes, (std::vector<int8_t>{0, 0, 0, 0, 127, -64, 2, -127}));
  std::vector<float> bad = {1.f, std::nanf("")};
  EXPECT_FALSE(QuantizeInt8Rows(bad.data(), 1, 2, codes.data(), scales.data()));
  bad[1] = -INFINITY;
  EXPECT_FALSE(QuantizeInt8Rows(bad.data(), 1, 2, codes.data(), scales.data()));

  const int64_t rows = 256, cols = 2048;
  const Quantized w = RandomWeights(rows, cols, 11);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = w.codes[size_t(i)] * w.scales[size_t(i / cols)];
    ASSERT_LE(std::fabs(v - w.w32[size_t(i)]), 0.5f * w.scales[size_t(i / cols)] * 1.0001f);
  }
  const std::vector<float> x = RandomX(cols, 12);
  std::vector<float> y8(static_cast<size_t>(rows)), y32(static_cast<size_t>(rows));
  LinearInt8(x.data(), w.m, y8.data(), 1);
  const WeightMatrix f32{DType::kF32, w.w32.data(), rows, cols};
  LinearReference(x.data(), f32, y32.data(), 1);
  double err = 0, ref = 0;
  for (int64_t r = 0; r < rows; ++r) {
    err += (y8[size_t(r)] - y32[size_t(r)]) * double(y8[size_t(r)] - y32[size_t(r)]);
    ref += double(y32[size_t(r)]) * y32[size_t(r)];
  }
  const double rel = std::sqrt(err / ref);
  std::printf("  int8 (rows) x int8 (blocks of 32) vs fp32, 256 x 2048: relative RMS error %.4f\n",
              rel);
  EXPECT_LT(rel, 0.02);
}

}  // namespace
}  // namespace llm::cpu
