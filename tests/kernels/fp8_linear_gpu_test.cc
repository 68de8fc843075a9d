// The CUDA backend's FP8 (W8A8) linear layers (--quantization fp8) against CPU references
// (label gpu; skips without a GPU):
//  - cuda::QuantizeRowsE4m3 (weights at load, the attention output per token): codes and
//    scales bit for bit equal to cpu::QuantizeFp8Rows on the same values (bf16, fp16 and
//    fp32 input; 8-wide and scalar paths; rows longer than the kernel's register cache;
//    an all-zero row), and its non-finite count; ties between codes and scales in and out of
//    the fast division's range, bit for bit too;
//  - cuda::AddRmsNormE4m3 and cuda::SiluMulE4m3 (the fused quantization of the GEMM inputs):
//    against the fp32 CPU twin quantized by the CPU rule. The GPU's fp32 operation order
//    differs (the norm's sum; the GPU's silu uses __expf and __fdividef), so a value near a
//    midpoint between two e4m3 codes may round the other way: every code must be within one e4m3
//    step of the CPU's, at most 1% of them may differ at all, and the scale within 1e-5 relative;
//  - cuda::Gemm::LinearFp8 (cuBLASLt, per-row weight and per-token activation scales): against
//    a double-precision sum over the dequantized codes, for bf16 / fp16 / fp32 outputs and the
//    fp32 accumulate (residual) epilogue, in both accumulation modes. Bound per output: the
//    output's own rounding plus 1e-3 of Σ|terms| with cuBLASLt's precise accumulation (fp32
//    with periodic promotion), 1e-2 with the tensor cores' fast accumulation (a narrower
//    accumulator over k up to 14,336; the measured worst case is printed); a dropped scale, a
//    swapped operand or a wrong layout is off by O(|y|).
//   ninja -C build fp8_linear_gpu_test && (cd build && ctest -L gpu -R fp8_linear)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/gemm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "tests/kernels/dev_buf.h"

namespace llm {
namespace {

using test::DevBuf;

class Fp8LinearGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why))
      GTEST_SKIP() << "no GPU, fp8 linear GPU test skipped: " << why;
  }
};

// Values rounded to `t` (bf16 / fp16 / f32): the device bytes and the exact floats.
std::vector<std::byte> Encode(const std::vector<float>& v, DType t, std::vector<float>* exact) {
  std::vector<std::byte> out(v.size() * DTypeSize(t));
  exact->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + i * 4, &v[i], 4);
      (*exact)[i] = v[i];
      continue;
    }
    const uint16_t h = t == DType::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
    std::memcpy(out.data() + i * 2, &h, 2);
    (*exact)[i] = t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
  }
  return out;
}

TEST_F(Fp8LinearGpu, QuantizeRowsEqualsTheCpuRuleBitForBit) {
  std::mt19937 rng(11);
  struct Shape {
    int64_t rows, cols;
  };
  // 20000 columns: past the register cache (2,048 chunks of 8); 20 and 1000: the scalar path
  // (20 % 8 != 0) and an 8-wide row of 125 chunks. From 256 rows of at most 256 chunks a warp
  // quantizes each row (300 x 2048: 8 chunks a lane; 300 x 20: the scalar path; 260 x 2056:
  // one chunk too many, a CTA per row again).
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (Shape s : {Shape{3, 4096}, Shape{5, 20}, Shape{2, 20000}, Shape{4, 1000}, Shape{300, 2048},
                    Shape{300, 20}, Shape{257, 1000}, Shape{260, 2056}}) {
      std::normal_distribution<float> dist(0.f, 1.f);
      std::vector<float> v(size_t(s.rows * s.cols));
      for (int64_t r = 0; r < s.rows; ++r) {
        const float row_scale = std::ldexp(1.f, int(r % 5) * 3 - 6);  // 2^-6 .. 2^6
        for (int64_t c = 0; c < s.cols; ++c) v[size_t(r * s.cols + c)] = dist(rng) * row_scale;
      }
      for (int64_t c = 0; c < s.cols; ++c) v[size_t(c)] = 0.f;  // row 0: all zero (scale 1)
      std::vector<float> exact;
      const std::vector<std::byte> bytes = Encode(v, t, &exact);
      std::vector<uint8_t> want(v.size());
      std::vector<float> want_scale(size_t(s.rows));
      ASSERT_TRUE(
          cpu::QuantizeFp8Rows(exact.data(), s.rows, s.cols, want.data(), want_scale.data()));
      DevBuf din(bytes), dcodes(v.size()), dscale(size_t(s.rows) * 4), dbad(std::vector<int>{0});
      cuda::QuantizeRowsE4m3(din.p, t, s.rows, s.cols, dcodes.as<uint8_t>(), dscale.as<float>(),
                             dbad.as<int>(), nullptr);
      const std::vector<uint8_t> got = dcodes.Download<uint8_t>();
      const std::vector<float> got_scale = dscale.Download<float>();
      const std::string what =
          std::string(DTypeName(t)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols);
      EXPECT_EQ(dbad.Download<int>()[0], 0) << what;
      for (int64_t r = 0; r < s.rows; ++r) {
        ASSERT_EQ(got_scale[size_t(r)], want_scale[size_t(r)]) << what << " row " << r;
      }
      EXPECT_EQ(got_scale[0], 1.f) << what << ": an all-zero row's scale";
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << what << " element " << i;
    }
  }
}

// The kernels divide by a row's scale with a reciprocal and two FMA corrections, and convert with
// the hardware's cvt (quantize_row.cuh): still the CPU rule's IEEE division and rounding bit for
// bit, on the values where a slip would show: fp32 rows whose max spans 2^-130 ... 2^120 and rows
// whose scale (max / 448) is exactly 2^-61, 2^-60, 2^-59, 2^59, 2^60, 2^61 or one ulp beside one
// (the corrections' range is [2^-60, 2^60]), holding each code's midpoint (a tie) times the
// scale and its two fp32 neighbours, the codes' own values, fp32 subnormals, tiny values and
// random ones, through both the CTA-per-row (rows < 256) and the warp-per-row kernels.
TEST_F(Fp8LinearGpu, QuantizeRowsIsExactAtTiesAndAtExtremeScales) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> amaxes;
  for (int e :
       {-130, -120, -100, -70, -61, -60, -59, -20, -3, 0, 5, 30, 58, 59, 60, 61, 62, 90, 120}) {
    amaxes.push_back(std::ldexp(1.f + 0.37f * float(amaxes.size() % 3), e));
  }
  for (int e : {-61, -60, -59, 59, 60, 61}) {
    const float at = kE4m3Max * std::ldexp(1.f, e);  // exact: the scale is 2^e
    amaxes.insert(amaxes.end(), {at, std::nextafter(at, 0.f), std::nextafter(at, 2.f * at)});
  }
  const auto cta_rows = static_cast<int64_t>(amaxes.size());
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{cta_rows, 4096}, {304, 1024}}) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      float* row = v.data() + r * cols;
      const float amax = amaxes[size_t(r) % amaxes.size()];
      const float scale = amax / kE4m3Max;  // the rule's scale for this row
      int64_t c = 0;
      row[c++] = (r % 2 ? -amax : amax);
      for (int code = 0; code < 0x7e && c + 6 <= cols; ++code) {
        const float lo = E4m3ToF32(uint8_t(code)), hi = E4m3ToF32(uint8_t(code + 1));
        const float mid = 0.5f * (lo + hi) * scale;
        row[c++] = mid;
        row[c++] = std::nextafter(mid, 0.f);
        row[c++] = -std::nextafter(mid, 2.f * mid);
        row[c++] = lo * scale;
        row[c++] = std::ldexp(uni(rng), -140);  // an fp32 subnormal
        row[c++] = uni(rng) * scale * 1e-3f;
      }
      for (; c < cols; ++c) row[c] = uni(rng) * amax;
    }
    std::vector<uint8_t> want(v.size());
    std::vector<float> want_scale(static_cast<size_t>(rows));
    ASSERT_TRUE(cpu::QuantizeFp8Rows(v.data(), rows, cols, want.data(), want_scale.data()));
    DevBuf din(v), dcodes(v.size()), dscale(size_t(rows) * 4);
    cuda::QuantizeRowsE4m3(din.p, DType::kF32, rows, cols, dcodes.as<uint8_t>(), dscale.as<float>(),
                           nullptr, nullptr);
    const std::vector<uint8_t> got = dcodes.Download<uint8_t>();
    const std::vector<float> got_scale = dscale.Download<float>();
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(got_scale[size_t(r)], want_scale[size_t(r)]) << rows << "x" << cols << " row " << r;
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = size_t(r * cols + c);
        ASSERT_EQ(int(got[i]), int(want[i]))
            << rows << "x" << cols << " row " << r << " (scale " << want_scale[size_t(r)]
            << ") col " << c << ": value " << v[i];
      }
    }
  }
}

TEST_F(Fp8LinearGpu, QuantizeRowsCountsRowsWithNonFiniteValues) {
  const int64_t cols = 512;
  for (const int64_t rows : {int64_t{6}, int64_t{300}}) {  // a CTA per row; a warp per row
    std::vector<float> v(size_t(rows * cols), 0.25f);
    v[size_t(1 * cols + 7)] = NAN;
    v[size_t(4 * cols + 511)] = INFINITY;
    v[size_t(4 * cols + 3)] = -INFINITY;  // a second bad value in the same row counts once
    DevBuf din(v), dcodes(v.size()), dscale(size_t(rows) * 4), dbad(std::vector<int>{0});
    cuda::QuantizeRowsE4m3(din.p, DType::kF32, rows, cols, dcodes.as<uint8_t>(), dscale.as<float>(),
                           dbad.as<int>(), nullptr);
    EXPECT_EQ(dbad.Download<int>()[0], 2) << rows << " rows";
  }
  const int64_t rows = 6;
  std::vector<float> v(size_t(rows * cols), 0.25f);
  DevBuf din(v), dcodes(v.size()), dscale(size_t(rows) * 4);
  EXPECT_THROW(cuda::QuantizeRowsE4m3(din.p, DType::kF8E4M3, rows, cols, dcodes.as<uint8_t>(),
                                      dscale.as<float>(), nullptr, nullptr),
               std::invalid_argument);
}

// One e4m3 step at the magnitude of code c (the spacing of the binade it is in).
float E4m3Step(uint8_t c) {
  const int e = (c >> 3) & 15;
  return e == 0 ? std::ldexp(1.f, -9) : std::ldexp(1.f, e - 7 - 3);
}

// Codes/scales from the GPU against the CPU rule applied to the fp32 reference rows `ref`
// (see the header: within one step, at most 1% different, scales within 1e-5).
void ExpectNearCpuQuantization(const std::vector<float>& ref, int64_t rows, int64_t cols,
                               const std::vector<uint8_t>& got, const std::vector<float>& got_scale,
                               const std::string& what) {
  std::vector<uint8_t> want(ref.size());
  std::vector<float> want_scale(static_cast<size_t>(rows));
  ASSERT_TRUE(cpu::QuantizeFp8Rows(ref.data(), rows, cols, want.data(), want_scale.data()));
  int64_t differ = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_NEAR(got_scale[size_t(r)], want_scale[size_t(r)], 1e-5 * want_scale[size_t(r)])
        << what << " row " << r;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      if (got[i] == want[i]) continue;
      ++differ;
      const float target = ref[i] / want_scale[size_t(r)];
      ASSERT_LE(std::fabs(E4m3ToF32(got[i]) - target), E4m3Step(want[i]) * 1.0001f)
          << what << " row " << r << " col " << c << ": code " << int(got[i]) << " vs "
          << int(want[i]);
    }
  }
  EXPECT_LE(differ, int64_t(ref.size()) / 100) << what;
  std::printf("  %s: %lld of %zu codes differ from the CPU's (by one step)\n", what.c_str(),
              (long long)differ, ref.size());
}

TEST_F(Fp8LinearGpu, AddRmsNormE4m3MatchesTheCpuNormQuantized) {
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.f, 2.f);
  const float eps = 1e-5f;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int64_t hidden : {512, 4096, 20480, 1000}) {  // 20480: past the register cache
      const int64_t rows = 7;
      std::vector<float> residual(static_cast<size_t>(rows * hidden)),
          weight(static_cast<size_t>(hidden)), delta(residual.size());
      for (float& v : residual) v = dist(rng);
      for (float& v : weight) v = 1.f + 0.1f * dist(rng);
      for (float& v : delta) v = dist(rng);
      std::vector<float> delta_exact;
      const std::vector<std::byte> delta_bytes = Encode(delta, t, &delta_exact);
      // CPU: residual += delta, v = w · (x · inv_rms) in fp32 (the kernel's order).
      std::vector<float> res_ref = residual, ref(residual.size());
      for (int64_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (int64_t i = 0; i < hidden; ++i) {
          float& x = res_ref[size_t(r * hidden + i)];
          x += delta_exact[size_t(r * hidden + i)];
          sum += double(x) * x;
        }
        const float inv_rms = 1.f / std::sqrt(float(sum / double(hidden)) + eps);
        for (int64_t i = 0; i < hidden; ++i) {
          ref[size_t(r * hidden + i)] =
              weight[size_t(i)] * (res_ref[size_t(r * hidden + i)] * inv_rms);
        }
      }
      DevBuf dres(residual), dw(weight), ddelta(delta_bytes), dcodes(residual.size()),
          dscale(size_t(rows) * 4);
      cuda::AddRmsNormE4m3(dres.as<float>(), ddelta.p, dw.as<float>(), dcodes.as<uint8_t>(),
                           dscale.as<float>(), t, nullptr, rows, hidden, eps, nullptr);
      const std::vector<float> res_got = dres.Download<float>();
      for (size_t i = 0; i < res_got.size(); ++i) ASSERT_EQ(res_got[i], res_ref[i]) << i;
      ExpectNearCpuQuantization(ref, rows, hidden, dcodes.Download<uint8_t>(),
                                dscale.Download<float>(),
                                std::string("AddRmsNormE4m3 ") + std::string(DTypeName(t)) +
                                    " hidden " + std::to_string(hidden));
    }
  }
}

TEST_F(Fp8LinearGpu, SiluMulE4m3MatchesTheCpuSiluMulQuantized) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.f, 2.f);
  for (DType t : {DType::kBF16, DType::kF16}) {
    // 172: the scalar path; 300 rows of at most 256 chunks: a warp per row.
    for (const auto& [rows, inter] : {std::pair<int64_t, int64_t>{5, 1376},
                                      {5, 14336},
                                      {5, 20000},
                                      {5, 172},
                                      {300, 768},
                                      {300, 1376},
                                      {300, 172},
                                      {256, 2056}}) {
      std::vector<float> gu(static_cast<size_t>(rows * 2 * inter));
      for (float& v : gu) v = dist(rng);
      std::vector<float> exact;
      const std::vector<std::byte> bytes = Encode(gu, t, &exact);
      std::vector<float> ref(static_cast<size_t>(rows * inter));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < inter; ++i) {
          const float g = exact[size_t(r * 2 * inter + i)],
                      u = exact[size_t(r * 2 * inter + inter + i)];
          ref[size_t(r * inter + i)] = g / (1.f + std::exp(-g)) * u;
        }
      }
      DevBuf din(bytes), dcodes(ref.size()), dscale(size_t(rows) * 4);
      cuda::SiluMulE4m3(din.p, dcodes.as<uint8_t>(), dscale.as<float>(), rows, inter, t, nullptr);
      ExpectNearCpuQuantization(
          ref, rows, inter, dcodes.Download<uint8_t>(), dscale.Download<float>(),
          std::string("SiluMulE4m3 ") + std::string(DTypeName(t)) + " inter " +
              std::to_string(inter) + " rows " + std::to_string(rows));
    }
  }
}

// Random e4m3 operands with their scales, as the executor makes them.
struct Fp8Matrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Fp8Matrix RandomFp8(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = 0.01f * float(1 + r % 7);
    for (int64_t c = 0; c < cols; ++c) v[size_t(r * cols + c)] = dist(rng) * row_scale;
  }
  Fp8Matrix m{std::vector<uint8_t>(v.size()), std::vector<float>(size_t(rows))};
  EXPECT_TRUE(cpu::QuantizeFp8Rows(v.data(), rows, cols, m.codes.data(), m.scales.data()));
  return m;
}

TEST_F(Fp8LinearGpu, CublasLtFp8LinearMatchesTheDequantizedProduct) {
  std::mt19937 rng(14);
  cuda::Gemm precise, fast;
  fast.set_fast_accum(true);
  struct Shape {
    int64_t n, m, k;
  };
  for (Shape s : {Shape{1, 96, 512}, Shape{7, 1376, 512}, Shape{256, 512, 1376},
                  Shape{33, 4096, 4096}, Shape{16, 256, 14336}}) {
    const Fp8Matrix x = RandomFp8(s.n, s.k, rng), w = RandomFp8(s.m, s.k, rng);
    // Reference: y[t, j] = xs[t] · ws[j] · Σ x8 · w8 in double, and Σ|terms| for the bound.
    std::vector<double> ref(size_t(s.n * s.m)), mag(ref.size());
    for (int64_t t = 0; t < s.n; ++t) {
      for (int64_t j = 0; j < s.m; ++j) {
        double sum = 0, abs_sum = 0;
        for (int64_t i = 0; i < s.k; ++i) {
          const double p = double(E4m3ToF32(x.codes[size_t(t * s.k + i)])) *
                           E4m3ToF32(w.codes[size_t(j * s.k + i)]);
          sum += p;
          abs_sum += std::fabs(p);
        }
        const double sc = double(x.scales[size_t(t)]) * w.scales[size_t(j)];
        ref[size_t(t * s.m + j)] = sum * sc;
        mag[size_t(t * s.m + j)] = abs_sum * sc;
      }
    }
    DevBuf dx(x.codes), dxs(x.scales), dw(w.codes), dws(w.scales);
    for (cuda::Gemm* gemm : {&precise, &fast}) {
      const bool is_fast = gemm == &fast;
      const double accum_bound = is_fast ? 1e-2 : 1e-3;
      for (DType out : {DType::kBF16, DType::kF16, DType::kF32}) {
        for (bool accumulate : {false, true}) {
          if (accumulate && out != DType::kF32) continue;
          std::vector<float> start(size_t(s.n * s.m));
          for (size_t i = 0; i < start.size(); ++i)
            start[i] = accumulate ? float(i % 13) - 6.f : 0.f;
          DevBuf dy(out == DType::kF32 ? start.size() * 4 : start.size() * 2);
          if (out == DType::kF32) dy.Upload(start);
          gemm->LinearFp8(dx.p, dxs.as<float>(), dw.p, dws.as<float>(), dy.p, s.n, s.m, s.k, out,
                          accumulate, nullptr);
          std::vector<float> got(start.size());
          if (out == DType::kF32) {
            got = dy.Download<float>();
          } else {
            const std::vector<uint16_t> h = dy.Download<uint16_t>();
            for (size_t i = 0; i < h.size(); ++i) {
              got[i] = out == DType::kBF16 ? Bf16ToF32(h[i]) : F16ToF32(h[i]);
            }
          }
          const double out_ulp = out == DType::kBF16  ? std::ldexp(1.0, -8)
                                 : out == DType::kF16 ? std::ldexp(1.0, -11)
                                                      : std::ldexp(1.0, -24);
          double worst = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const double want = ref[i] + start[i];
            const double err = std::fabs(double(got[i]) - want);
            const double bound = accum_bound * mag[i] + out_ulp * std::fabs(want) + 1e-7;
            worst = std::max(worst, std::max(0.0, err - out_ulp * std::fabs(want)) / mag[i]);
            ASSERT_LE(err, bound) << (is_fast ? "fast " : "precise ") << DTypeName(out)
                                  << (accumulate ? " accumulate" : "") << " n " << s.n << " m "
                                  << s.m << " k " << s.k << " element " << i << ": got " << got[i]
                                  << " want " << want;
          }
          std::printf(
              "  fp8 GEMM %s n %lld m %lld k %lld -> %s%s: worst |error| beyond the "
              "output rounding %.2e of sum|terms|\n",
              is_fast ? "fast" : "precise", (long long)s.n, (long long)s.m, (long long)s.k,
              std::string(DTypeName(out)).c_str(), accumulate ? " (+=)" : "", worst);
        }
      }
    }
  }
  EXPECT_THROW(precise.LinearFp8(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 64, 40,
                                 DType::kF32, false, nullptr),
               std::invalid_argument);  // k % 16 != 0
}

}  // namespace
}  // namespace llm
