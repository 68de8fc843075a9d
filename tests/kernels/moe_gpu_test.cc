// The mixture-of-experts kernels (kernels/cuda/moe/moe.h) against their CPU twins: routing and
// grouping equal to cpu::MoeRoute / cpu::GroupByExpert, the grouped GEMM against a float64
// product of the same bf16 / fp16 operands (and of the same e4m3 codes: fp8 experts), a whole MoE
// MLP against the CPU's arithmetic on the device's rounded intermediates, and the chain captured in
// a CUDA graph and replayed on other routings. Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "tests/kernels/dev_buf.h"

namespace llm::cuda {
namespace {

using test::DevBuf;

// Each test runs on every kernel set (moe.h: MoeKernels).
class MoeGpuTest : public ::testing::TestWithParam<MoeKernels> {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceAvailable(&why)) GTEST_SKIP() << "no GPU, MoE GPU test skipped: " << why;
  }
  // The grouped GEMM tests' (out_f32, MoeGemm::wgmma_cols) runs: both output types, and on kV4
  // and kV5 both CTA widths of their warpgroup-MMA tiles.
  static std::vector<std::pair<bool, int>> OutputsAndCtaCols() {
    if (GetParam() < MoeKernels::kV4) return {{true, 0}, {false, 0}};
    return {{true, 128}, {false, 128}, {true, 256}, {false, 256}};
  }
};

// Device arrays of a MoeRouting for num_pairs pairs over num_experts experts.
struct Routing {
  DevBuf experts, weights, offsets, sorted_pairs, pair_rows, tile_expert, tile_begin, num_tiles;
  MoeRouting r;
  Routing(int64_t pairs, int64_t num_experts)
      : experts(size_t(pairs) * 4),
        weights(size_t(pairs) * 4),
        offsets(size_t(num_experts + 1) * 4),
        sorted_pairs(size_t(pairs) * 4),
        pair_rows(size_t(pairs) * 4),
        tile_expert(size_t(MoeMaxTiles(pairs, num_experts)) * 4),
        tile_begin(size_t(MoeMaxTiles(pairs, num_experts)) * 4),
        num_tiles(4) {
    r = {experts.as<int32_t>(),      weights.as<float>(),     offsets.as<int32_t>(),
         sorted_pairs.as<int32_t>(), pair_rows.as<int32_t>(), tile_expert.as<int32_t>(),
         tile_begin.as<int32_t>(),   num_tiles.as<int32_t>()};
  }
};

std::vector<float> Normal(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Values rounded to dtype, as their 16-bit codes and as floats.
struct Half {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Half Round(const std::vector<float>& v, DType dtype) {
  Half h;
  for (float x : v) {
    const uint16_t b = dtype == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x);
    h.bits.push_back(b);
    h.values.push_back(dtype == DType::kBF16 ? Bf16ToF32(b) : F16ToF32(b));
  }
  return h;
}

// A grouped GEMM's operands in dtype (MoeGemm without fp8).
MoeGemm Gemm(const void* x, bool gather, int top_k, const void* w, DType dtype, void* out,
             bool out_f32, int64_t n, int64_t k, int64_t pairs, int experts) {
  MoeGemm g;
  g.x = x;
  g.gather = gather;
  g.top_k = top_k;
  g.w = w;
  g.dtype = dtype;
  g.out = out;
  g.out_f32 = out_f32;
  g.n = n;
  g.k = k;
  g.num_pairs = pairs;
  g.num_experts = experts;
  return g;
}

TEST_P(MoeGpuTest, RoutingAndGroupingEqualTheCpu) {
  struct Case {
    int tokens, experts, top_k;
  };
  for (const Case c : {Case{300, 8, 2}, Case{257, 128, 8}, Case{64, 256, 8}, Case{5, 3, 3},
                       Case{1, 128, 8}, Case{4, 128, 8}, Case{16, 8, 2}, Case{3, 256, 10},
                       Case{2, 4, 4}, Case{5, 128, 8}, Case{300, 4, 2}}) {
    for (const bool normalize : {true, false}) {
      std::vector<float> logits = Normal(size_t(c.tokens) * c.experts, 2.f, c.experts + c.tokens);
      // Ties: token 0 has three equal largest logits, token 1 all equal.
      for (int e = 0; e < std::min(3, c.experts); ++e) logits[size_t(e) * 2 % c.experts] = 9.f;
      if (c.tokens > 1) {
        std::fill(logits.begin() + c.experts, logits.begin() + 2 * c.experts, 0.5f);
      }
      const int64_t pairs = int64_t(c.tokens) * c.top_k;
      std::vector<int32_t> want_e(static_cast<size_t>(pairs));
      std::vector<float> want_w(static_cast<size_t>(pairs));
      cpu::MoeRoute(logits.data(), c.tokens, c.experts, c.top_k, normalize, want_e.data(),
                    want_w.data());
      const cpu::ExpertGroups want =
          cpu::GroupByExpert(want_e.data(), want_w.data(), c.tokens, c.top_k, c.experts);
      DevBuf d_logits(logits);
      Routing r(pairs, c.experts);
      MoeRoute(d_logits.as<float>(), c.tokens, c.experts, c.top_k, normalize, r.r, nullptr,
               GetParam());
      const auto got_e = r.experts.Download<int32_t>();
      const auto got_w = r.weights.Download<float>();
      ASSERT_EQ(got_e, want_e) << c.tokens << " tokens, " << c.experts << " experts";
      for (int64_t p = 0; p < pairs; ++p) {
        ASSERT_NEAR(got_w[size_t(p)], want_w[size_t(p)], 1e-5f * want_w[size_t(p)] + 1e-9f)
            << "pair " << p;
      }
      const auto offsets = r.offsets.Download<int32_t>();
      ASSERT_EQ(std::vector<int64_t>(offsets.begin(), offsets.end()), want.offsets);
      const auto sorted = r.sorted_pairs.Download<int32_t>();
      const auto rows = r.pair_rows.Download<int32_t>();
      for (int64_t i = 0; i < pairs; ++i) {
        ASSERT_EQ(sorted[size_t(i)] / c.top_k, want.tokens[size_t(i)]) << "row " << i;
        ASSERT_EQ(rows[size_t(sorted[size_t(i)])], i);
      }
      // The tiles: each expert's rows in MoeTileRows pieces (kV4's 300 x top 2 of 4: 128), in
      // expert order.
      const int tile_rows = MoeTileRows(pairs, c.experts, GetParam());
      std::vector<int32_t> want_te, want_tb;
      for (int e = 0; e < c.experts; ++e) {
        for (int64_t b = want.offsets[size_t(e)]; b < want.offsets[size_t(e) + 1]; b += tile_rows) {
          want_te.push_back(e);
          want_tb.push_back(int32_t(b));
        }
      }
      const int tiles = r.num_tiles.Download<int32_t>()[0];
      ASSERT_EQ(tiles, int(want_te.size()));
      ASSERT_LE(tiles, MoeMaxTiles(pairs, c.experts));
      auto te = r.tile_expert.Download<int32_t>(), tb = r.tile_begin.Download<int32_t>();
      EXPECT_EQ(std::vector<int32_t>(te.begin(), te.begin() + tiles), want_te);
      EXPECT_EQ(std::vector<int32_t>(tb.begin(), tb.begin() + tiles), want_tb);
    }
  }
}

// out[row] = in(row) · W[expert]ᵀ against float64 sums of the same rounded operands.
TEST_P(MoeGpuTest, GroupedGemmMatchesAFloat64Product) {
  struct Case {
    int tokens, experts, top_k, n, k;
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    // Up to 8 tokens kV2 takes its GEMV path, from 9 the tiles; from 33 rows per expert on
    // average kV4's warpgroup-MMA tiles (kV5's from 9 tokens: the first and fourth cases have
    // 19 and 0.6 rows per expert), from 128 on 128-row tiles (the last four: n past a 128 /
    // 256-output block, k past a 64-element panel, experts of several tiles, last tiles whose
    // second 64 rows are empty).
    for (const Case c :
         {Case{77, 8, 2, 200, 72}, Case{300, 16, 4, 128, 256}, Case{1, 8, 2, 64, 64},
          Case{9, 128, 8, 96, 40}, Case{8, 128, 8, 96, 40}, Case{3, 8, 2, 64, 2056},
          Case{8, 4, 2, 136, 64}, Case{150, 4, 2, 200, 72}, Case{200, 4, 2, 136, 520},
          Case{300, 4, 2, 200, 72}, Case{520, 2, 2, 264, 136}}) {
      const int64_t pairs = int64_t(c.tokens) * c.top_k;
      DevBuf d_logits(Normal(size_t(c.tokens) * c.experts, 1.f, 5));
      Routing r(pairs, c.experts);
      MoeRoute(d_logits.as<float>(), c.tokens, c.experts, c.top_k, true, r.r, nullptr, GetParam());
      const auto sorted = r.sorted_pairs.Download<int32_t>();
      const auto experts = r.experts.Download<int32_t>();
      const Half w = Round(Normal(size_t(c.experts) * c.n * c.k, 0.1f, 6), dtype);
      DevBuf d_w(w.bits);
      for (const bool gather : {true, false}) {
        const int64_t in_rows = gather ? c.tokens : pairs;
        const Half x = Round(Normal(size_t(in_rows) * c.k, 1.f, 7), dtype);
        DevBuf d_x(x.bits);
        for (const auto& [out_f32, cols] : OutputsAndCtaCols()) {
          DevBuf d_out(size_t(pairs) * c.n * (out_f32 ? 4 : 2));
          MoeGemm g = Gemm(d_x.p, gather, c.top_k, d_w.p, dtype, d_out.p, out_f32, c.n, c.k, pairs,
                           c.experts);
          g.wgmma_cols = cols;
          MoeGroupedGemm(g, r.r, nullptr, GetParam());
          std::vector<float> got(size_t(pairs) * c.n);
          if (out_f32) {
            got = d_out.Download<float>();
          } else {
            const auto bits = d_out.Download<uint16_t>();
            for (size_t i = 0; i < bits.size(); ++i)
              got[i] = dtype == DType::kBF16 ? Bf16ToF32(bits[i]) : F16ToF32(bits[i]);
          }
          double worst = 0;
          for (int64_t row = 0; row < pairs; ++row) {
            const int32_t pair = sorted[size_t(row)];
            const int64_t src = gather ? pair / c.top_k : row;
            const int32_t e = experts[size_t(pair)];
            for (int j = 0; j < c.n; ++j) {
              double ref = 0, mag = 0;
              for (int i = 0; i < c.k; ++i) {
                const double a = x.values[size_t(src * c.k + i)],
                             b = w.values[(size_t(e) * c.n + j) * c.k + i];
                ref += a * b;
                mag += std::fabs(a * b);
              }
              // Rounding to the output type: half an ulp, 2^-8 (bf16) / 2^-11 (fp16) of |ref|.
              const double half_ulp = dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
              const double tol = 2e-5 * mag + (out_f32 ? 0 : std::fabs(ref) * half_ulp) + 1e-6;
              const double err = std::fabs(got[size_t(row * c.n + j)] - ref);
              worst = std::max(worst, err / tol);
              ASSERT_LE(err, tol) << "row " << row << " col " << j << " expert " << e
                                  << (gather ? " gather" : "") << " n " << c.n << " k " << c.k
                                  << " cols " << cols;
            }
          }
          EXPECT_LE(worst, 1.0);
        }
      }
    }
  }
}

// fp8 experts (--quantization fp8): e4m3 weight codes with a scale per row of each expert,
// weight-only (x in dtype: the GEMV) and W8A8 (x as e4m3 codes with a scale per row: the
// m16n8k32 tiles; kV4's wider steps wgmma k32), against float64 sums of the same codes' values. The
// tiles' bound is looser: the FP8 tensor cores add their products with fewer than fp32's bits
// before the accumulator.
TEST_P(MoeGpuTest, GroupedGemmFp8MatchesAFloat64Product) {
  struct Case {
    int tokens, experts, top_k, n, k;
  };
  const DType dtype = DType::kBF16;
  for (const Case c : {Case{77, 8, 2, 200, 80}, Case{300, 16, 4, 128, 256}, Case{1, 8, 2, 64, 64},
                       Case{5, 128, 8, 96, 48}, Case{3, 8, 2, 64, 2064}, Case{9, 4, 2, 136, 32},
                       Case{150, 4, 2, 200, 80}, Case{200, 4, 2, 136, 528},
                       Case{300, 4, 2, 200, 80}, Case{520, 2, 2, 264, 144}}) {
    const int64_t pairs = int64_t(c.tokens) * c.top_k;
    DevBuf d_logits(Normal(size_t(c.tokens) * c.experts, 1.f, 5));
    Routing r(pairs, c.experts);
    MoeRoute(d_logits.as<float>(), c.tokens, c.experts, c.top_k, true, r.r, nullptr, GetParam());
    const auto sorted = r.sorted_pairs.Download<int32_t>();
    const auto experts = r.experts.Download<int32_t>();
    const std::vector<float> w = Normal(size_t(c.experts) * c.n * c.k, 0.1f, 6);
    std::vector<uint8_t> w8(w.size());
    std::vector<float> w_scale(size_t(c.experts) * c.n);
    ASSERT_TRUE(
        cpu::QuantizeFp8Rows(w.data(), int64_t(c.experts) * c.n, c.k, w8.data(), w_scale.data()));
    DevBuf d_w(w8), d_ws(w_scale);
    for (const bool w8a8 : {false, true}) {
      for (const bool gather : {true, false}) {
        const int64_t in_rows = gather ? c.tokens : pairs;
        const Half x = Round(Normal(size_t(in_rows) * c.k, 1.f, 7), dtype);
        // W8A8: the inputs' codes and row scales; their values are what the sums see.
        std::vector<uint8_t> x8(x.values.size());
        std::vector<float> x_scale(static_cast<size_t>(in_rows));
        ASSERT_TRUE(cpu::QuantizeFp8Rows(x.values.data(), in_rows, c.k, x8.data(), x_scale.data()));
        std::vector<double> xv(x.values.begin(), x.values.end());
        if (w8a8) {
          for (size_t i = 0; i < xv.size(); ++i) {
            xv[i] = double(E4m3ToF32(x8[i])) * x_scale[i / size_t(c.k)];
          }
        }
        DevBuf d_x(x.bits), d_x8(x8), d_xs(x_scale);
        for (const auto& [out_f32, cols] : OutputsAndCtaCols()) {
          DevBuf d_out(size_t(pairs) * c.n * (out_f32 ? 4 : 2));
          MoeGemm g = Gemm(w8a8 ? d_x8.p : d_x.p, gather, c.top_k, d_w.p, dtype, d_out.p, out_f32,
                           c.n, c.k, pairs, c.experts);
          g.wgmma_cols = cols;
          g.w_scale = d_ws.as<float>();
          g.x_scale = w8a8 ? d_xs.as<float>() : nullptr;
          MoeGroupedGemm(g, r.r, nullptr, GetParam());
          std::vector<float> got(size_t(pairs) * c.n);
          if (out_f32) {
            got = d_out.Download<float>();
          } else {
            const auto bits = d_out.Download<uint16_t>();
            for (size_t i = 0; i < bits.size(); ++i) got[i] = Bf16ToF32(bits[i]);
          }
          for (int64_t row = 0; row < pairs; ++row) {
            const int32_t pair = sorted[size_t(row)];
            const int64_t src = gather ? pair / c.top_k : row;
            const int32_t e = experts[size_t(pair)];
            for (int j = 0; j < c.n; ++j) {
              const size_t wrow = size_t(e) * c.n + j;
              double ref = 0, mag = 0;
              for (int i = 0; i < c.k; ++i) {
                const double a = xv[size_t(src * c.k + i)];
                const double b = double(E4m3ToF32(w8[wrow * c.k + i])) * w_scale[wrow];
                ref += a * b;
                mag += std::fabs(a * b);
              }
              const double tol =
                  (w8a8 ? 1e-3 : 2e-5) * mag + (out_f32 ? 0 : std::fabs(ref) / 256) + 1e-6;
              ASSERT_NEAR(got[size_t(row * c.n + j)], ref, tol)
                  << "row " << row << " col " << j << " expert " << e << (w8a8 ? " W8A8" : "")
                  << (gather ? " gather" : "") << " n " << c.n << " k " << c.k << " cols " << cols;
            }
          }
        }
      }
    }
  }
}

// A MoE MLP of 2 (Mixtral-like) or 8 of 128 (Qwen3-MoE-like) experts: route, gate|up gathered,
// SiLU·mul, down, combine into the residual, against the CPU's sums over the device's
// rounded gate|up and activations.
TEST_P(MoeGpuTest, MoeMlpMatchesTheCpuArithmetic) {
  struct Case {
    int tokens, experts, top_k, hidden, inter;
  };
  const DType dtype = DType::kBF16;
  for (const Case c :
       {Case{61, 8, 2, 64, 160}, Case{700, 128, 8, 128, 64}, Case{1, 128, 8, 256, 96},
        Case{5, 128, 8, 128, 64}, Case{300, 8, 2, 128, 200}, Case{600, 4, 2, 128, 200}}) {
    const int64_t pairs = int64_t(c.tokens) * c.top_k;
    const std::vector<float> logits = Normal(size_t(c.tokens) * c.experts, 1.5f, 11);
    const Half x = Round(Normal(size_t(c.tokens) * c.hidden, 1.f, 12), dtype);
    const Half w_gu = Round(Normal(size_t(c.experts) * 2 * c.inter * c.hidden, 0.08f, 13), dtype);
    const Half w_d = Round(Normal(size_t(c.experts) * c.hidden * c.inter, 0.08f, 14), dtype);
    const std::vector<float> resid0 = Normal(size_t(c.tokens) * c.hidden, 1.f, 15);
    DevBuf d_logits(logits), d_x(x.bits), d_gu(w_gu.bits), d_d(w_d.bits), d_resid(resid0);
    DevBuf gate_up(size_t(pairs) * 2 * c.inter * 2), act(size_t(pairs) * c.inter * 2),
        down(size_t(pairs) * c.hidden * 4);
    Routing r(pairs, c.experts);
    MoeRoute(d_logits.as<float>(), c.tokens, c.experts, c.top_k, true, r.r, nullptr, GetParam());
    MoeGroupedGemm(Gemm(d_x.p, true, c.top_k, d_gu.p, dtype, gate_up.p, false, 2 * c.inter,
                        c.hidden, pairs, c.experts),
                   r.r, nullptr, GetParam());
    SiluMul(gate_up.p, act.p, pairs, c.inter, dtype, nullptr);
    MoeGroupedGemm(Gemm(act.p, false, c.top_k, d_d.p, dtype, down.p, true, c.hidden, c.inter, pairs,
                        c.experts),
                   r.r, nullptr, GetParam());
    MoeCombine(down.as<float>(), r.r, c.tokens, c.top_k, c.hidden, d_resid.as<float>(), true,
               nullptr);
    const auto got = d_resid.Download<float>();
    // The CPU: routing, then per token and expert (ascending) the expert's output from the
    // device's bf16 activations of that pair, weighted and summed, added to the residual.
    std::vector<int32_t> ce(static_cast<size_t>(pairs));
    std::vector<float> cw(static_cast<size_t>(pairs));
    cpu::MoeRoute(logits.data(), c.tokens, c.experts, c.top_k, true, ce.data(), cw.data());
    const auto act_bits = act.Download<uint16_t>();
    const auto rows = r.pair_rows.Download<int32_t>();
    for (int t = 0; t < c.tokens; ++t) {
      std::vector<int> slots(static_cast<size_t>(c.top_k));
      for (int j = 0; j < c.top_k; ++j) slots[size_t(j)] = j;
      std::sort(slots.begin(), slots.end(), [&](int a, int b) {
        return ce[size_t(t) * c.top_k + a] < ce[size_t(t) * c.top_k + b];
      });
      for (int h = 0; h < c.hidden; ++h) {
        double sum = 0, mag = 0;
        for (int j : slots) {
          const int64_t p = int64_t(t) * c.top_k + j;
          const int e = ce[size_t(p)];
          double y = 0, ymag = 0;
          for (int i = 0; i < c.inter; ++i) {
            const double a = Bf16ToF32(act_bits[size_t(rows[size_t(p)]) * c.inter + i]);
            const double b = w_d.values[(size_t(e) * c.hidden + h) * c.inter + i];
            y += a * b;
            ymag += std::fabs(a * b);
          }
          sum += y * cw[size_t(p)];
          mag += ymag * cw[size_t(p)];
        }
        const double want = resid0[size_t(t) * c.hidden + h] + sum;
        ASSERT_NEAR(got[size_t(t) * c.hidden + h], want, 3e-5 * mag + 1e-5 * std::fabs(want))
            << "token " << t << " col " << h << " (" << c.experts << " experts)";
      }
    }
    // And the activations are silu(gate) · up of the gathered token through its expert.
    const auto gu_bits = gate_up.Download<uint16_t>();
    const auto sorted = r.sorted_pairs.Download<int32_t>();
    for (int64_t row = 0; row < pairs; row += 1 + pairs / 512) {  // every tile's rows
      const int32_t p = sorted[size_t(row)];
      const int e = ce[size_t(p)], t = p / c.top_k;
      for (int i = 0; i < c.inter; i += 7) {
        double g = 0, u = 0;
        for (int q = 0; q < c.hidden; ++q) {
          const double xv = x.values[size_t(t) * c.hidden + q];
          g += xv * w_gu.values[(size_t(e) * 2 * c.inter + i) * c.hidden + q];
          u += xv * w_gu.values[(size_t(e) * 2 * c.inter + c.inter + i) * c.hidden + q];
        }
        const double got_g = Bf16ToF32(gu_bits[size_t(row) * 2 * c.inter + i]);
        ASSERT_NEAR(got_g, g, std::fabs(g) / 128 + 1e-3) << "row " << row << " gate " << i;
        const double got_u = Bf16ToF32(gu_bits[size_t(row) * 2 * c.inter + c.inter + i]);
        ASSERT_NEAR(got_u, u, std::fabs(u) / 128 + 1e-3) << "row " << row << " up " << i;
      }
    }
  }
}

// MoeCombineRmsNorm (the MoE sum added by the next RMSNorm: decode steps) equals MoeCombine then
// AddRmsNorm bit for bit, the residual and the normalized rows, for bf16 / fp16, top 2 of 8 and
// top 8 of 128, every token or a gathered few (`rows`, as the final norm: the other tokens'
// residuals stay as they were).
TEST_P(MoeGpuTest, CombineRmsNormEqualsTheCombineThenTheNorm) {
  struct Case {
    int tokens, experts, top_k, hidden;
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Case c : {Case{1, 128, 8, 2048}, Case{7, 8, 2, 4096}, Case{4, 128, 8, 136}}) {
      const int64_t pairs = int64_t(c.tokens) * c.top_k;
      const std::vector<float> logits = Normal(size_t(c.tokens) * c.experts, 1.5f, 21);
      const std::vector<float> down = Normal(size_t(pairs) * c.hidden, 0.7f, 22);
      const std::vector<float> resid0 = Normal(size_t(c.tokens) * c.hidden, 1.f, 23);
      const std::vector<float> norm_w = Normal(size_t(c.hidden), 1.f, 24);
      Routing r(pairs, c.experts);
      DevBuf d_logits(logits), d_down(down), d_w(norm_w);
      MoeRoute(d_logits.as<float>(), c.tokens, c.experts, c.top_k, true, r.r, nullptr, GetParam());
      const size_t out_bytes = size_t(c.tokens) * c.hidden * 2;
      // All tokens.
      DevBuf want_resid(resid0), got_resid(resid0), want_out(out_bytes), got_out(out_bytes);
      MoeCombine(d_down.as<float>(), r.r, c.tokens, c.top_k, c.hidden, want_resid.as<float>(), true,
                 nullptr);
      AddRmsNorm(want_resid.as<float>(), nullptr, d_w.as<float>(), want_out.p, dtype, nullptr,
                 c.tokens, c.hidden, 1e-6f, nullptr);
      MoeCombineRmsNorm(got_resid.as<float>(), d_down.as<float>(), r.r, c.top_k, d_w.as<float>(),
                        got_out.p, dtype, nullptr, c.tokens, c.hidden, 1e-6f, nullptr);
      const auto want_x = want_resid.Download<float>();
      ASSERT_EQ(got_resid.Download<float>(), want_x) << c.tokens << " tokens";
      const auto want_y = want_out.Download<uint16_t>();
      ASSERT_EQ(got_out.Download<uint16_t>(), want_y) << c.tokens << " tokens";
      // A gathered few (distinct): the last token, then the first.
      const std::vector<int32_t> rows =
          c.tokens > 1 ? std::vector<int32_t>{c.tokens - 1, 0} : std::vector<int32_t>{0};
      const int num_rows = int(rows.size());
      DevBuf d_rows(rows), few_resid(resid0), few_out(size_t(num_rows) * c.hidden * 2);
      MoeCombineRmsNorm(few_resid.as<float>(), d_down.as<float>(), r.r, c.top_k, d_w.as<float>(),
                        few_out.p, dtype, d_rows.as<int32_t>(), num_rows, c.hidden, 1e-6f, nullptr);
      const auto fx = few_resid.Download<float>();
      const auto fy = few_out.Download<uint16_t>();
      for (int t = 0; t < c.tokens; ++t) {
        const bool gathered = t == 0 || t == c.tokens - 1;
        for (int h = 0; h < c.hidden; ++h) {
          const size_t at = size_t(t) * c.hidden + h;
          ASSERT_EQ(fx[at], gathered ? want_x[at] : resid0[at]) << "token " << t << " col " << h;
        }
      }
      for (int i = 0; i < num_rows; ++i) {
        for (int h = 0; h < c.hidden; ++h) {
          ASSERT_EQ(fy[size_t(i) * c.hidden + h], want_y[size_t(rows[size_t(i)]) * c.hidden + h])
              << "gathered row " << i << " col " << h;
        }
      }
    }
  }
}

// MoeGemm::silu_mul (kV3 / kV4 GEMV): SiLU(gate) · up written by the gate|up GEMV equals the GEMV
// into dtype followed by SiluMul, bit for bit (the same sums, rounded to dtype, then the same
// fp32 arithmetic), for bf16 / fp16 and weight-only fp8 experts; every rows-per-pass variant (1,
// 2, 3 -> 4, 8 tokens) and several passes (fp8 weight-only at 20 tokens: 8 rows a pass); an
// inter of 76 (the last CTA's warps past it return) and k = 2064 (the ring wraps: 129 chunks
// of fp8, 258 of 16-bit weights). Other sets refuse the flag.
TEST_P(MoeGpuTest, FusedSiluMulEqualsTheGemvThenSiluMul) {
  const int experts = 16, top_k = 4, inter = 76, hidden = 2064;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::vector<float> w = Normal(size_t(experts) * 2 * inter * hidden, 0.03f, 42);
    std::vector<uint8_t> w8(w.size());
    std::vector<float> w_scale(size_t(experts) * 2 * inter);
    ASSERT_TRUE(cpu::QuantizeFp8Rows(w.data(), int64_t(experts) * 2 * inter, hidden, w8.data(),
                                     w_scale.data()));
    const Half w16 = Round(w, dtype);
    DevBuf d_w16(w16.bits), d_w8(w8), d_ws(w_scale);
    for (const bool fp8 : {false, true}) {
      for (const int tokens : {1, 2, 3, 8, 20}) {
        if (tokens > kMoeGemvMaxTokens && !fp8) continue;  // 16-bit experts: tiles from 9 tokens
        const int64_t pairs = int64_t(tokens) * top_k;
        DevBuf d_logits(Normal(size_t(tokens) * experts, 1.f, 40 + tokens));
        Routing r(pairs, experts);
        MoeRoute(d_logits.as<float>(), tokens, experts, top_k, true, r.r, nullptr, GetParam());
        const Half x = Round(Normal(size_t(tokens) * hidden, 1.f, 41), dtype);
        DevBuf d_x(x.bits);
        DevBuf gate_up(size_t(pairs) * 2 * inter * 2), act(size_t(pairs) * inter * 2),
            fused(size_t(pairs) * inter * 2);
        MoeGemm g = Gemm(d_x.p, true, top_k, fp8 ? d_w8.p : d_w16.p, dtype, gate_up.p, false,
                         2 * inter, hidden, pairs, experts);
        g.w_scale = fp8 ? d_ws.as<float>() : nullptr;
        MoeGroupedGemm(g, r.r, nullptr, GetParam());
        SiluMul(gate_up.p, act.p, pairs, inter, dtype, nullptr);
        g.out = fused.p;
        g.silu_mul = true;
        if (GetParam() < MoeKernels::kV3) {
          EXPECT_FALSE(MoeFusesSiluMul(g, GetParam()));
          EXPECT_THROW(MoeGroupedGemm(g, r.r, nullptr, GetParam()), std::invalid_argument);
          continue;
        }
        ASSERT_TRUE(MoeFusesSiluMul(g, GetParam()));
        MoeGroupedGemm(g, r.r, nullptr, GetParam());
        const auto want = act.Download<uint16_t>(), got = fused.Download<uint16_t>();
        EXPECT_EQ(got, want) << tokens << " tokens" << (fp8 ? ", fp8 weights" : "")
                             << (dtype == DType::kF16 ? ", fp16" : ", bf16");
        EXPECT_NE(std::count(got.begin(), got.end(), uint16_t(0)), std::ssize(got));
      }
    }
  }
  // fp32 outputs and W8A8 tiles have no fused form.
  Routing r(8, 4);
  DevBuf buf(4096);
  MoeGemm g = Gemm(buf.p, true, 2, buf.p, DType::kBF16, buf.p, true, 64, 64, 8, 4);
  g.silu_mul = true;
  EXPECT_THROW(MoeGroupedGemm(g, r.r, nullptr, MoeKernels::kV3), std::invalid_argument);
  g.out_f32 = false;
  g.w_scale = buf.as<float>();
  g.x_scale = buf.as<float>();
  EXPECT_THROW(MoeGroupedGemm(g, r.r, nullptr, MoeKernels::kV3), std::invalid_argument);
}

// The chain captured once in a CUDA graph (sizes from the host's token count only) and
// replayed on new logits gives what eager launches give, bit for bit, and so do eager launches
// with programmatic dependent launch (launch.h; the executor's default on sm_90): 80 tokens
// (tiles, kV5's warpgroup-MMA ones; seed 33 gives 4 experts 80 rows each, 2 tiles), 300 (kV4's
// warpgroup-MMA tiles: 37.5 rows per expert on average; seed 33: 300 rows each), 1100 (137.5 on
// average: 128-row tiles) and 4 (kV2's GEMV).
void CaptureAndReplay(int tokens, MoeKernels kernels) {
  const int experts = 32, top_k = 4, hidden = 64, inter = 96;
  const int64_t pairs = int64_t(tokens) * top_k;
  const DType dtype = DType::kBF16;
  const Half x = Round(Normal(size_t(tokens) * hidden, 1.f, 21), dtype);
  const Half w_gu = Round(Normal(size_t(experts) * 2 * inter * hidden, 0.1f, 22), dtype);
  const Half w_d = Round(Normal(size_t(experts) * hidden * inter, 0.1f, 23), dtype);
  DevBuf d_logits(size_t(tokens) * experts * 4), d_x(x.bits), d_gu(w_gu.bits), d_d(w_d.bits);
  DevBuf gate_up(size_t(pairs) * 2 * inter * 2), act(size_t(pairs) * inter * 2),
      down(size_t(pairs) * hidden * 4), out(size_t(tokens) * hidden * 4);
  Routing r(pairs, experts);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto chain = [&] {
    MoeRoute(d_logits.as<float>(), tokens, experts, top_k, true, r.r, stream, kernels);
    MoeGroupedGemm(Gemm(d_x.p, true, top_k, d_gu.p, dtype, gate_up.p, false, 2 * inter, hidden,
                        pairs, experts),
                   r.r, stream, kernels);
    SiluMul(gate_up.p, act.p, pairs, inter, dtype, stream);
    MoeGroupedGemm(
        Gemm(act.p, false, top_k, d_d.p, dtype, down.p, true, hidden, inter, pairs, experts), r.r,
        stream, kernels);
    MoeCombine(down.as<float>(), r.r, tokens, top_k, hidden, out.as<float>(), false, stream);
  };
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  chain();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (uint32_t seed : {31u, 32u, 33u}) {
    // Seed 33: every token on experts 0-3 (one expert's rows span several tiles).
    std::vector<float> logits = Normal(size_t(tokens) * experts, 2.f, seed);
    if (seed == 33) {
      for (int t = 0; t < tokens; ++t)
        for (int e = 0; e < 4; ++e) logits[size_t(t) * experts + e] = 20.f + float(e);
    }
    d_logits.Upload(logits);
    chain();
    const auto eager = out.Download<float>();
    SetProgrammaticLaunch(true);
    chain();
    const auto eager_pdl = out.Download<float>();
    SetProgrammaticLaunch(false);
    EXPECT_EQ(eager_pdl, eager) << "seed " << seed << ", " << tokens << " tokens, with PDL";
    LLM_CUDA_CHECK(cudaMemset(out.p, 0, out.bytes));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    const auto replayed = out.Download<float>();
    EXPECT_EQ(replayed, eager) << "seed " << seed << ", " << tokens << " tokens";
    EXPECT_NE(std::count(eager.begin(), eager.end(), 0.f), std::ssize(eager));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_P(MoeGpuTest, CapturedChainReplaysOnOtherRoutings) {
  for (const int tokens : {80, 300, 1100, 4}) CaptureAndReplay(tokens, GetParam());
}

TEST_P(MoeGpuTest, BadArgumentsAreRefused) {
  Routing r(16, 8);
  EXPECT_THROW(MoeRoute(nullptr, 8, 300, 2, true, r.r, nullptr), std::invalid_argument);
  EXPECT_THROW(MoeRoute(nullptr, 8, 8, 9, true, r.r, nullptr), std::invalid_argument);
  DevBuf buf(4096);
  EXPECT_THROW(
      MoeGroupedGemm(Gemm(buf.p, true, 2, buf.p, DType::kBF16, buf.p, false, 12, 64, 16, 8), r.r,
                     nullptr),
      std::invalid_argument);
  EXPECT_THROW(MoeGroupedGemm(Gemm(buf.p, true, 2, buf.p, DType::kF32, buf.p, false, 64, 64, 16, 8),
                              r.r, nullptr),
               std::invalid_argument);
  // fp8: k a multiple of 16; e4m3 inputs need e4m3 weights.
  MoeGemm fp8 = Gemm(buf.p, true, 2, buf.p, DType::kBF16, buf.p, false, 64, 40, 16, 8);
  fp8.w_scale = buf.as<float>();
  EXPECT_THROW(MoeGroupedGemm(fp8, r.r, nullptr), std::invalid_argument);
  MoeGemm a8 = Gemm(buf.p, true, 2, buf.p, DType::kBF16, buf.p, false, 64, 64, 16, 8);
  a8.x_scale = buf.as<float>();
  EXPECT_THROW(MoeGroupedGemm(a8, r.r, nullptr), std::invalid_argument);
  // kV4's outputs per CTA: 0 (its pick), 128 or 256.
  MoeGemm wide = Gemm(buf.p, true, 2, buf.p, DType::kBF16, buf.p, false, 64, 64, 16, 8);
  wide.wgmma_cols = 64;
  EXPECT_THROW(MoeGroupedGemm(wide, r.r, nullptr, MoeKernels::kV4), std::invalid_argument);
  MoeRouting missing = r.r;
  missing.pair_rows = nullptr;
  EXPECT_THROW(MoeCombine(buf.as<float>(), missing, 8, 2, 64, buf.as<float>(), true, nullptr),
               std::invalid_argument);
}

// (Literals: GCC 12 warns falsely about "v" + std::to_string(...) here.)
const char* SetName(MoeKernels k) {
  switch (k) {
    case MoeKernels::kV1:
      return "v1";
    case MoeKernels::kV2:
      return "v2";
    case MoeKernels::kV3:
      return "v3";
    case MoeKernels::kV4:
      return "v4";
    case MoeKernels::kV5:
      return "v5";
  }
  return "unknown";
}

INSTANTIATE_TEST_SUITE_P(Kernels, MoeGpuTest,
                         ::testing::Values(MoeKernels::kV1, MoeKernels::kV2, MoeKernels::kV3,
                                           MoeKernels::kV4, MoeKernels::kV5),
                         [](const auto& info) { return std::string(SetName(info.param)); });

}  // namespace
}  // namespace llm::cuda
