// The fused paths of the small-batch GEMV (kernels/cuda/gemv/gemv.h), each against its unfused
// form: the SiLU·mul and RoPE epilogues bit-identical to a kStore GEMV followed by
// cuda::SiluMul / cuda::RopeAppendKv, and the folded RMSNorm (a residual GEMV writing the next
// RMSNorm's input and sums of squares, then the GEMV consuming them) against float64
// references. The plain epilogues, every e4m3 code and the argument checks: gemv_gpu_test.cc;
// fixtures in gemv_fixtures.h. Label gpu (skips without a GPU).
//   ninja -C build gemv_fused_gpu_test && (cd build && ctest -L gpu -R gemv_fused)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/dtype.h"
#include "kernels/paged_kv.h"
#include "tests/kernels/gemv_fixtures.h"

namespace llm::test::gemv {
namespace {

// kSiluMul is kStore into gate|up followed by cuda::SiluMul in one kernel, with the same fp32
// sums, roundings and SiLU math: bit-identical, for fp8 and dtype weights (an odd number of
// output columns leaves the last CTA half empty).
TEST(GemvSiluMul, EqualsGemvThenSiluMulBitForBit) {
  std::string why;
  if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  struct SiluCase {
    DType dtype;
    int64_t n, inter, k;
    bool fp8;
  };
  const SiluCase cases[] = {{DType::kBF16, 1, 1001, 4096, true},
                            {DType::kF16, 3, 512, 4112, true},
                            {DType::kBF16, 8, 64, 11008, true},
                            {DType::kF16, 2, 344, 4096, false},
                            {DType::kBF16, 5, 129, 1000, false}};
  for (const SiluCase& c : cases) {
    SCOPED_TRACE(std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " n " +
                 std::to_string(c.n) + " inter " + std::to_string(c.inter) + " k " +
                 std::to_string(c.k) + (c.fp8 ? " fp8" : ""));
    std::mt19937 rng(uint32_t(c.n * 17 + c.inter + c.k));
    const int64_t n = c.n, m = 2 * c.inter, k = c.k;
    uint16_t* dx = Upload(RandomHalf(c.dtype, size_t(n * k), 1.f, rng));
    void* dw = nullptr;
    float* dscale = nullptr;
    if (c.fp8) {
      const Fp8Matrix w8 = RandomFp8(m, k, 0.05f, rng);
      dw = Upload(w8.codes);
      dscale = Upload(w8.scales);
    } else {
      dw = Upload(RandomHalf(c.dtype, size_t(m * k), 0.05f, rng));
    }
    const std::vector<uint16_t> poison(size_t(n * c.inter), 0x7fc0);
    uint16_t* dgate_up = Upload(std::vector<uint16_t>(size_t(n * m), 0x7fc0));
    uint16_t* dact[2] = {Upload(poison), Upload(poison)};
    cuda::GemvArgs a = Args(E::kStore, dx, dw, dscale, dgate_up, n, m, k, c.dtype);  // two kernels
    cuda::Gemv(a, nullptr);
    cuda::SiluMul(dgate_up, dact[0], n, c.inter, c.dtype, nullptr);
    a.epilogue = E::kSiluMul;  // one kernel
    a.y = dact[1];
    ASSERT_TRUE(cuda::GemvSupports(a));
    cuda::Gemv(a, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> want = Download<uint16_t>(dact[0], poison.size());
    const std::vector<uint16_t> got = Download<uint16_t>(dact[1], poison.size());
    size_t differ = 0, nan = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      differ += got[i] != want[i];
      nan += std::isnan(FromHalf(c.dtype, got[i]));
    }
    EXPECT_EQ(differ, 0u);
    EXPECT_EQ(nan, 0u) << "every output written";
    for (void* q :
         {static_cast<void*>(dx), dw, static_cast<void*>(dscale), static_cast<void*>(dgate_up),
          static_cast<void*>(dact[0]), static_cast<void*>(dact[1])})
      cudaFree(q);
  }
}

// kRopeAppendKv is kStore followed by cuda::RopeAppendKv in one kernel, with the same math and
// rounding: q, the K pool and the V pool are bit-identical to the two-kernel path (with and
// without the RMSNorm prologue, with fp8 weights; some tokens without a KV slot).
struct RopeCase {
  DType dtype;
  int n, num_heads, num_kv_heads, head_dim, k;
  bool norm;
  bool fp8 = false;   // e4m3 weights (w_scale): both paths run the fp8 GEMV
  bool fold = false;  // the folded RMSNorm's consumer: x and sums of squares given
};

class GemvRopeGpu : public ::testing::TestWithParam<RopeCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(GemvRopeGpu, EqualsGemvThenRopeAppendKvBitForBit) {
  const RopeCase c = GetParam();
  std::mt19937 rng(c.n * 7 + c.head_dim + c.k);
  const int64_t n = c.n, k = c.k, hd = c.head_dim;
  const int64_t m = int64_t(c.num_heads + 2 * c.num_kv_heads) * hd;
  PagedKvLayout layout;
  layout.num_blocks = 4;
  layout.block_size = 16;
  layout.num_kv_heads = c.num_kv_heads;
  layout.head_dim = hd;
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> resid(static_cast<size_t>(n * k)), gain(static_cast<size_t>(k));
  for (float& v : resid) v = 2.f * dist(rng);
  for (float& v : gain) v = 1.f + 0.2f * dist(rng);
  std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / float(hd));
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    positions[t] = int32_t(rng() % 100000);
    slots[t] = t % 3 == 2 ? -1 : (t * 13 + 5) % (layout.num_blocks * layout.block_size);
  }
  const std::vector<uint16_t> x = RandomHalf(c.dtype, size_t(n * k), 1.f, rng);
  const std::vector<uint16_t> w =
      c.fp8 ? std::vector<uint16_t>() : RandomHalf(c.dtype, size_t(m * k), 0.05f, rng);
  const Fp8Matrix w8 = c.fp8 ? RandomFp8(m, k, 0.05f, rng) : Fp8Matrix{};
  const std::vector<uint16_t> poison(size_t(layout.pool_elements()), 0x7fc0);
  void* dx = c.norm ? static_cast<void*>(Upload(resid)) : static_cast<void*>(Upload(x));
  float* dgain = Upload(gain);
  // The folded RMSNorm's sums of squares: ceil(k / 4) groups per token (the producer's row
  // groups), each that of 4 values of magnitude ~1-2.
  const int64_t num_partials = (k + 3) / 4;
  std::vector<float> partials(size_t(n * num_partials));
  for (float& v : partials) v = 4.f * (1.f + 0.03f * float(rng() % 100));
  float* dpartials = Upload(partials);
  float* dfreq = Upload(inv_freq);
  int32_t* dpos = Upload(positions);
  int64_t* dslots = Upload(slots);
  void* dw = c.fp8 ? static_cast<void*>(Upload(w8.codes)) : static_cast<void*>(Upload(w));
  float* dscale = c.fp8 ? Upload(w8.scales) : nullptr;
  uint16_t* dqkv = Upload(std::vector<uint16_t>(size_t(n * m)));
  uint16_t* dq[2] = {Upload(std::vector<uint16_t>(size_t(n * c.num_heads * hd), 0x7fc0)),
                     Upload(std::vector<uint16_t>(size_t(n * c.num_heads * hd), 0x7fc0))};
  uint16_t* dk[2] = {Upload(poison), Upload(poison)};
  uint16_t* dv[2] = {Upload(poison), Upload(poison)};
  // Two kernels: kStore into q|k|v, then RopeAppendKv.
  cuda::GemvArgs a = Args(E::kStore, dx, dw, dscale, dqkv, n, m, k, c.dtype);
  a.norm_weight = c.norm ? dgain : nullptr;
  a.eps = 1e-5f;
  if (c.fold) {
    a.rms_partials = dpartials;
    a.rms_num_partials = num_partials;
  }
  cuda::Gemv(a, nullptr);
  cuda::RopeAppendKv(dqkv, dpos, dslots, dfreq, n, c.num_heads, c.num_kv_heads, int(hd),
                     PagedKvView<void>{dk[0], dv[0], layout}, c.dtype, dq[0], nullptr);
  // One kernel.
  a.epilogue = E::kRopeAppendKv;
  a.y = dq[1];
  a.rope.positions = dpos;
  a.rope.slot_mapping = dslots;
  a.rope.inv_freq = dfreq;
  a.rope.num_heads = c.num_heads;
  a.rope.num_kv_heads = c.num_kv_heads;
  a.rope.head_dim = int(hd);
  a.rope.layout = layout;
  a.rope.k_cache = dk[1];
  a.rope.v_cache = dv[1];
  ASSERT_TRUE(cuda::GemvSupports(a));
  auto count_diff = [](const std::vector<uint16_t>& p, const std::vector<uint16_t>& q) {
    size_t d = 0;
    for (size_t i = 0; i < p.size(); ++i) d += p[i] != q[i];
    return d;
  };
  const size_t nq = size_t(n * c.num_heads * hd), np = size_t(layout.pool_elements());
  // One wave, then at most 3 CTAs (each walks many row groups: GemvArgs::max_ctas); each
  // also on the ring kernel (GemvArgs::ring) where it applies (no prologue, no fold).
  for (int run = 0; run < 4; ++run) {
    const int ctas = run % 2 == 0 ? 0 : 3;
    a.ring = run >= 2;
    if (a.ring && (a.norm_weight != nullptr || a.rms_partials != nullptr)) continue;
    ASSERT_TRUE(cuda::GemvSupports(a));
    LLM_CUDA_CHECK(cudaMemset(dq[1], 0xff, nq * 2));
    LLM_CUDA_CHECK(cudaMemcpy(dk[1], poison.data(), np * 2, cudaMemcpyHostToDevice));
    LLM_CUDA_CHECK(cudaMemcpy(dv[1], poison.data(), np * 2, cudaMemcpyHostToDevice));
    a.max_ctas = ctas;
    cuda::Gemv(a, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> q0 = Download<uint16_t>(dq[0], nq),
                                q1 = Download<uint16_t>(dq[1], nq);
    EXPECT_EQ(count_diff(q0, q1), 0u) << "q, max_ctas " << ctas << " ring " << a.ring;
    EXPECT_EQ(count_diff(Download<uint16_t>(dk[0], np), Download<uint16_t>(dk[1], np)), 0u)
        << "K, max_ctas " << ctas << " ring " << a.ring;
    EXPECT_EQ(count_diff(Download<uint16_t>(dv[0], np), Download<uint16_t>(dv[1], np)), 0u)
        << "V, max_ctas " << ctas << " ring " << a.ring;
    size_t nan = 0;
    for (uint16_t v : q1) nan += std::isnan(FromHalf(c.dtype, v));
    EXPECT_EQ(nan, 0u) << "every q element written, max_ctas " << ctas;
  }
  for (void* p :
       {dx, static_cast<void*>(dgain), static_cast<void*>(dfreq), static_cast<void*>(dpos),
        static_cast<void*>(dslots), dw, static_cast<void*>(dscale), static_cast<void*>(dqkv),
        static_cast<void*>(dq[0]), static_cast<void*>(dq[1]), static_cast<void*>(dk[0]),
        static_cast<void*>(dk[1]), static_cast<void*>(dv[0]), static_cast<void*>(dv[1]),
        static_cast<void*>(dpartials)})
    cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvRopeGpu,
    ::testing::Values(RopeCase{DType::kBF16, 1, 4, 2, 128, 512, true},
                      RopeCase{DType::kBF16, 3, 8, 8, 64, 1024, false},
                      RopeCase{DType::kF16, 8, 4, 1, 128, 256, true},
                      RopeCase{DType::kF16, 5, 2, 2, 64, 4096, false},
                      RopeCase{DType::kBF16, 1, 4, 2, 128, 4096, false, true},
                      RopeCase{DType::kF16, 3, 8, 8, 64, 4112, false, true},
                      RopeCase{DType::kBF16, 8, 4, 1, 128, 11008, false, true},
                      RopeCase{DType::kBF16, 1, 4, 2, 128, 4096, true, true},
                      RopeCase{DType::kF16, 3, 8, 8, 64, 4112, true, true},
                      RopeCase{DType::kBF16, 1, 4, 2, 128, 4096, false, false, true},
                      RopeCase{DType::kBF16, 3, 8, 2, 64, 4112, false, true, true}),
    [](const auto& info) {
      const RopeCase& c = info.param;
      return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + "_n" + std::to_string(c.n) +
             "_h" + std::to_string(c.num_heads) + "_kv" + std::to_string(c.num_kv_heads) + "_hd" +
             std::to_string(c.head_dim) + (c.norm ? "_rmsnorm" : "") + (c.fp8 ? "_fp8" : "") +
             (c.fold ? "_fold" : "");
    });

// The folded RMSNorm (GemvArgs::rms_partials): a residual GEMV (kAccumulateF32) that also
// writes the next RMSNorm's input dtype(g ⊙ y) and per-group sums of y², then the GEMV that
// consumes them (kStore or kSiluMul), against float64 references computed from the producer's
// own y: y = y0 + x·w1ᵀ, rms_x = dtype(g ⊙ y) bit for bit, each partial the sum of its 4 rows'
// squares, and the consumer's s = inv_rms · Σ rms_x · w2 (inv_rms from all of y); every output
// bit-identical on 1-3 CTAs and with one CTA per group.
struct FoldCase {
  int n;
  int64_t k1, hidden, m2;  // producer x [n, k1] -> residual [n, hidden] -> consumer [n, m2]
  E consumer;
  bool fp8;
};

class GemvFoldGpu : public ::testing::TestWithParam<FoldCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

// Weights for a case: bf16 values, or e4m3 codes with row scales; `rows` the float values the
// CPU twin reads (cpu::LoadRow).
struct FoldWeights {
  void* w = nullptr;
  float* scale = nullptr;
  std::vector<float> rows;
};

FoldWeights MakeFoldWeights(int64_t m, int64_t k, bool fp8, std::mt19937& rng) {
  FoldWeights f;
  const std::vector<uint16_t> w =
      fp8 ? std::vector<uint16_t>() : RandomHalf(DType::kBF16, size_t(m * k), 0.05f, rng);
  const Fp8Matrix w8 = fp8 ? RandomFp8(m, k, 0.05f, rng) : Fp8Matrix{};
  cpu::WeightMatrix wm;
  wm.dtype = fp8 ? DType::kF8E4M3 : DType::kBF16;
  wm.data = fp8 ? static_cast<const void*>(w8.codes.data()) : w.data();
  wm.rows = m;
  wm.cols = k;
  wm.scales = fp8 ? w8.scales.data() : nullptr;
  f.rows.resize(size_t(m * k));
  for (int64_t j = 0; j < m; ++j) cpu::LoadRow(wm, j, f.rows.data() + j * k);
  f.w = fp8 ? static_cast<void*>(Upload(w8.codes)) : static_cast<void*>(Upload(w));
  f.scale = fp8 ? Upload(w8.scales) : nullptr;
  return f;
}

TEST_P(GemvFoldGpu, ProducerAndConsumerMatchFloat64) {
  const FoldCase c = GetParam();
  const DType bf = DType::kBF16;
  std::mt19937 rng(c.n * 17 + c.hidden + c.m2);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = c.n, h = c.hidden, groups = (h + 3) / 4;
  const float eps = 1e-5f;
  const std::vector<uint16_t> x1 = RandomHalf(bf, size_t(n * c.k1), 1.f, rng);
  std::vector<float> y0(static_cast<size_t>(n * h)), gain(static_cast<size_t>(h));
  for (float& v : y0) v = 2.f * dist(rng);
  for (float& v : gain) v = 1.f + 0.3f * dist(rng);
  const FoldWeights w1 = MakeFoldWeights(h, c.k1, c.fp8, rng);
  const bool silu = c.consumer == E::kSiluMul;
  const int64_t outs = silu ? c.m2 / 2 : c.m2;
  const FoldWeights w2 = MakeFoldWeights(c.m2, h, c.fp8, rng);
  uint16_t* dx1 = Upload(x1);
  float* dy = Upload(y0);
  float* dgain = Upload(gain);
  uint16_t* drms_x = Upload(std::vector<uint16_t>(size_t(n * h), 0x7fc0));
  float* dpart = Upload(std::vector<float>(size_t(n * groups), -1.f));
  uint16_t* dout = Upload(std::vector<uint16_t>(size_t(n * outs), 0x7fc0));
  cuda::GemvArgs p = Args(E::kAccumulateF32, dx1, w1.w, w1.scale, dy, n, h, c.k1, bf);
  p.rms_weight = dgain;
  p.rms_x = drms_x;
  p.rms_partials = dpart;
  cuda::GemvArgs q = Args(c.consumer, drms_x, w2.w, w2.scale, dout, n, c.m2, h, bf);
  q.rms_partials = dpart;
  q.rms_num_partials = groups;
  q.eps = eps;
  ASSERT_TRUE(cuda::GemvSupports(p));
  ASSERT_TRUE(cuda::GemvSupports(q));
  auto run = [&](int ctas) {  // y from y0 again, outputs poisoned, both GEMVs; what they wrote
    LLM_CUDA_CHECK(cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
    LLM_CUDA_CHECK(cudaMemset(drms_x, 0xff, size_t(n * h) * 2));
    LLM_CUDA_CHECK(cudaMemset(dpart, 0xff, size_t(n * groups) * 4));
    LLM_CUDA_CHECK(cudaMemset(dout, 0xff, size_t(n * outs) * 2));
    cuda::GemvArgs pp = p, qq = q;
    pp.max_ctas = qq.max_ctas = ctas > 0 ? ctas : 0;
    if (ctas < 0) pp.waves = qq.waves = 0;
    cuda::Gemv(pp, nullptr);
    cuda::Gemv(qq, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> bits;
    for (float v : Download<float>(dy, size_t(n * h))) bits.push_back(std::bit_cast<uint32_t>(v));
    for (uint16_t v : Download<uint16_t>(drms_x, size_t(n * h))) bits.push_back(v);
    for (float v : Download<float>(dpart, size_t(n * groups)))
      bits.push_back(std::bit_cast<uint32_t>(v));
    for (uint16_t v : Download<uint16_t>(dout, size_t(n * outs))) bits.push_back(v);
    return bits;
  };
  const std::vector<uint32_t> first = run(0);
  const std::vector<float> y = Download<float>(dy, size_t(n * h));
  const std::vector<uint16_t> rms_x = Download<uint16_t>(drms_x, size_t(n * h));
  const std::vector<float> part = Download<float>(dpart, size_t(n * groups));
  const std::vector<uint16_t> out = Download<uint16_t>(dout, size_t(n * outs));
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) {
      // The producer: y = y0 + s (fp32 accumulation in another order).
      double s = 0, mag = 0;
      for (int64_t i = 0; i < c.k1; ++i) {
        const double pr = double(FromHalf(bf, x1[t * c.k1 + i])) * w1.rows[j * c.k1 + i];
        s += pr;
        mag += std::fabs(pr);
      }
      const double yv = y[t * h + j];
      ASSERT_LE(std::fabs(yv - (y0[t * h + j] + s)),
                1e-5 * mag + 1e-6 * std::fabs(y0[t * h + j]) + 1e-6)
          << "y token " << t << " row " << j;
      ASSERT_EQ(rms_x[t * h + j], ToHalf(bf, gain[j] * y[t * h + j])) << "rms_x " << t << " " << j;
      ss += yv * yv;
    }
    for (int64_t g = 0; g < groups; ++g) {
      double want = 0;
      for (int64_t j = 4 * g; j < std::min(h, 4 * g + 4); ++j)
        want += double(y[t * h + j]) * y[t * h + j];
      ASSERT_LE(std::fabs(part[t * groups + g] - want), 1e-6 * want + 1e-30) << "partial " << g;
    }
    // The consumer, from the producer's y.
    const double inv = 1.0 / std::sqrt(ss / double(h) + eps);
    std::vector<double> s2(size_t(c.m2)), mag2(size_t(c.m2));
    for (int64_t j = 0; j < c.m2; ++j) {
      for (int64_t i = 0; i < h; ++i) {
        const double pr = double(FromHalf(bf, rms_x[t * h + i])) * w2.rows[j * h + i];
        s2[j] += pr;
        mag2[j] += std::fabs(pr);
      }
      s2[j] *= inv;
      mag2[j] *= inv;
    }
    const double ulp = 1.0 / 128, rel = 1e-5;
    for (int64_t j = 0; j < outs; ++j) {
      const double got = FromHalf(bf, out[t * outs + j]);
      double ref = s2[j], tol = rel * mag2[j] + ulp * std::fabs(s2[j]);
      if (silu) {
        const double g = RoundHalf(bf, s2[j]), u = RoundHalf(bf, s2[outs + j]);
        const double silu_g = g / (1 + std::exp(-g));
        ref = silu_g * u;
        const double dg = rel * mag2[j] + ulp * std::fabs(g),
                     du = rel * mag2[outs + j] + ulp * std::fabs(u);
        tol = 1.1 * std::fabs(u) * dg + std::fabs(silu_g) * du + dg * du + ulp * std::fabs(ref);
      }
      ASSERT_LE(std::fabs(got - ref), tol + 1e-6) << "consumer token " << t << " output " << j;
    }
  }
  for (int ctas : {1, 2, 3, -1}) {
    const std::vector<uint32_t> again = run(ctas);
    size_t differ = 0;
    for (size_t i = 0; i < again.size(); ++i) differ += again[i] != first[i];
    EXPECT_EQ(differ, 0u) << (ctas > 0 ? std::to_string(ctas) + " CTAs" : "one CTA per group");
  }
  for (void* d : {static_cast<void*>(dx1), static_cast<void*>(dy), static_cast<void*>(dgain),
                  static_cast<void*>(drms_x), static_cast<void*>(dpart), static_cast<void*>(dout),
                  w1.w, static_cast<void*>(w1.scale), w2.w, static_cast<void*>(w2.scale)})
    cudaFree(d);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvFoldGpu,
                         ::testing::Values(FoldCase{1, 4096, 4096, 1000, E::kStore, false},
                                           FoldCase{1, 11008, 4096, 2000, E::kSiluMul, false},
                                           FoldCase{3, 2048, 1032, 78, E::kStore,
                                                    false},  // 258 groups
                                           FoldCase{8, 4112, 2048, 256, E::kSiluMul, false},
                                           FoldCase{1, 4096, 4096, 1000, E::kSiluMul, true},
                                           FoldCase{2, 4112, 2048, 78, E::kStore, true},
                                           FoldCase{5, 2048, 1040, 64, E::kSiluMul, true}),
                         [](const auto& info) {
                           // A stream, not a chain of `+` on temporaries: GCC 12 at -O3 reports
                           // false -Wrestrict / -Wstringop-overflow in that chain once inlined
                           // (GCC PR 105329), depending on the translation unit's other code.
                           const FoldCase& c = info.param;
                           std::ostringstream name;
                           name << "n" << c.n << "_k" << c.k1 << "_h" << c.hidden << "_m" << c.m2
                                << (c.consumer == E::kSiluMul ? "_silumul" : "_store")
                                << (c.fp8 ? "_fp8" : "");
                           return name.str();
                         });

// The chained MLP (cuda::GemvChain): o (+ residual, producing the folded RMSNorm), gate|up
// (+ SiLU·mul, consuming it) and down (+ residual, producing the next one) in one persistent
// kernel with grid barriers, against the same three GemvArgs on the register kernel, one
// launch each: every output bit for bit (the residual, the next norm's input, the partials,
// the activation), on grids of 1 to 7 CTAs, the default grid (larger than o's and down's
// groups where hidden is small: CTAs with no item in a phase still meet every barrier) and
// 20 replays of a CUDA graph under programmatic dependent launch (the barrier's counters back
// at zero after every launch).
struct ChainCase {
  int n;
  int64_t q_dim, hidden, inter;
  bool fp8;
};

class GemvChainGpu : public ::testing::TestWithParam<ChainCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(GemvChainGpu, EqualsThreeFoldedGemvsBitForBit) {
  const ChainCase c = GetParam();
  const DType bf = DType::kBF16;
  std::mt19937 rng(c.n * 31 + c.hidden + c.inter);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = c.n, h = c.hidden, groups = (h + 3) / 4;
  const std::vector<uint16_t> attn = RandomHalf(bf, size_t(n * c.q_dim), 1.f, rng);
  std::vector<float> x0(static_cast<size_t>(n * h)), g1(static_cast<size_t>(h)),
      g2(static_cast<size_t>(h));
  for (float& v : x0) v = 2.f * dist(rng);
  for (float& v : g1) v = 1.f + 0.3f * dist(rng);
  for (float& v : g2) v = 1.f + 0.3f * dist(rng);
  const FoldWeights wo = MakeFoldWeights(h, c.q_dim, c.fp8, rng);
  const FoldWeights wgu = MakeFoldWeights(2 * c.inter, h, c.fp8, rng);
  const FoldWeights wd = MakeFoldWeights(h, c.inter, c.fp8, rng);
  uint16_t* dattn = Upload(attn);
  float* dx = Upload(x0);
  float* dx0 = Upload(x0);
  float* dg1 = Upload(g1);
  float* dg2 = Upload(g2);
  uint16_t* dnormed = Upload(std::vector<uint16_t>(size_t(n * h)));
  float* dpart = Upload(std::vector<float>(size_t(n * groups)));
  uint16_t* dact = Upload(std::vector<uint16_t>(size_t(n * c.inter)));
  unsigned* dsync = Upload(std::vector<unsigned>(cuda::kGemvChainSyncWords, 0u));
  cuda::GemvChainArgs ch;
  cuda::GemvArgs& o = ch.phase[0];
  o = Args(E::kAccumulateF32, dattn, wo.w, wo.scale, dx, n, h, c.q_dim, bf);
  o.rms_weight = dg1;
  o.rms_x = dnormed;
  o.rms_partials = dpart;
  cuda::GemvArgs& gu = ch.phase[1];
  gu = Args(E::kSiluMul, dnormed, wgu.w, wgu.scale, dact, n, 2 * c.inter, h, bf);
  gu.rms_partials = dpart;
  gu.rms_num_partials = groups;
  gu.eps = 1e-5f;
  cuda::GemvArgs& down = ch.phase[2];
  down = Args(E::kAccumulateF32, dact, wd.w, wd.scale, dx, n, h, c.inter, bf);
  down.rms_weight = dg2;
  down.rms_x = dnormed;
  down.rms_partials = dpart;
  ch.sync = dsync;
  ASSERT_TRUE(cuda::GemvChainSupports(ch));
  auto reset = [&](cudaStream_t s) {  // the residual from x0, the other outputs poisoned
    LLM_CUDA_CHECK(cudaMemcpyAsync(dx, dx0, size_t(n * h) * 4, cudaMemcpyDeviceToDevice, s));
    LLM_CUDA_CHECK(cudaMemsetAsync(dnormed, 0xff, size_t(n * h) * 2, s));
    LLM_CUDA_CHECK(cudaMemsetAsync(dpart, 0xff, size_t(n * groups) * 4, s));
    LLM_CUDA_CHECK(cudaMemsetAsync(dact, 0xff, size_t(n * c.inter) * 2, s));
  };
  auto outputs = [&] {
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> bits;
    for (float v : Download<float>(dx, size_t(n * h))) bits.push_back(std::bit_cast<uint32_t>(v));
    for (uint16_t v : Download<uint16_t>(dnormed, size_t(n * h))) bits.push_back(v);
    for (float v : Download<float>(dpart, size_t(n * groups)))
      bits.push_back(std::bit_cast<uint32_t>(v));
    for (uint16_t v : Download<uint16_t>(dact, size_t(n * c.inter))) bits.push_back(v);
    return bits;
  };
  // Differing words, and where: the residual, the next norm's input, the partials, the
  // activation.
  const size_t ends[4] = {size_t(n * h), size_t(2 * n * h), size_t(2 * n * h + n * groups),
                          size_t(2 * n * h + n * groups + n * c.inter)};
  auto differ = [&](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    size_t d[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      int part = 0;
      while (i >= ends[part]) ++part;
      ++d[part];
    }
    if (d[0] + d[1] + d[2] + d[3] == 0) return std::string("none");
    return "x " + std::to_string(d[0]) + ", normed " + std::to_string(d[1]) + ", partials " +
           std::to_string(d[2]) + ", act " + std::to_string(d[3]);
  };
  // The reference: the register kernel, one launch per phase.
  reset(nullptr);
  for (const cuda::GemvArgs& g : ch.phase) cuda::Gemv(g, nullptr);
  const std::vector<uint32_t> want = outputs();
  for (int ctas : {1, 2, 3, 7, 0}) {
    reset(nullptr);
    cuda::GemvChainArgs cc = ch;
    cc.max_ctas = ctas;
    cuda::GemvChain(cc, nullptr);
    EXPECT_EQ(differ(outputs(), want), "none")
        << (ctas > 0 ? std::to_string(ctas) : "all") << " CTAs";
    std::vector<unsigned> words = Download<unsigned>(dsync, cuda::kGemvChainSyncWords);
    words[0] = 0;  // the generation word only grows
    EXPECT_EQ(words, std::vector<unsigned>(words.size(), 0u)) << "counters back at zero";
  }
  // Under PDL in a graph: reset, then two chains (the second reads what the first wrote: PDL
  // between them), replayed; against the register kernel's six launches.
  cudaStream_t stream = nullptr;
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::SetProgrammaticLaunch(true);
  cudaGraph_t graph = nullptr;
  LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  reset(stream);
  cuda::GemvChain(ch, stream);
  cuda::GemvChain(ch, stream);  // twice: the second one's inputs are the first one's outputs
  LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cuda::SetProgrammaticLaunch(false);
  reset(nullptr);
  for (int i = 0; i < 2; ++i) {
    for (const cuda::GemvArgs& g : ch.phase) cuda::Gemv(g, nullptr);
  }
  const std::vector<uint32_t> twice = outputs();
  cudaGraphExec_t exec = nullptr;
  LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 20; ++r) {
    LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    ASSERT_EQ(differ(outputs(), twice), "none") << "replay " << r;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  // What it refuses: no counters, a phase out of its role.
  cuda::GemvChainArgs bad = ch;
  bad.sync = nullptr;
  EXPECT_FALSE(cuda::GemvChainSupports(bad));
  EXPECT_THROW(cuda::GemvChain(bad, nullptr), std::invalid_argument);
  bad = ch;
  bad.phase[1].rms_partials = nullptr;
  EXPECT_FALSE(cuda::GemvChainSupports(bad));
  bad = ch;
  bad.phase[2].w_scale = c.fp8 ? nullptr : dg2;
  EXPECT_FALSE(cuda::GemvChainSupports(bad));
  bad = ch;
  bad.phase[2].x = dnormed;  // down must read gate|up's output
  EXPECT_FALSE(cuda::GemvChainSupports(bad));
  for (void* d : {static_cast<void*>(dattn), static_cast<void*>(dx), static_cast<void*>(dx0),
                  static_cast<void*>(dg1), static_cast<void*>(dg2), static_cast<void*>(dnormed),
                  static_cast<void*>(dpart), static_cast<void*>(dact), static_cast<void*>(dsync),
                  wo.w, static_cast<void*>(wo.scale), wgu.w, static_cast<void*>(wgu.scale), wd.w,
                  static_cast<void*>(wd.scale)})
    cudaFree(d);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvChainGpu,
    ::testing::Values(ChainCase{1, 4096, 4096, 11008, false}, ChainCase{1, 4096, 4096, 11008, true},
                      ChainCase{2, 1024, 1032, 2752, false},
                      ChainCase{3, 512, 80, 1008, true},  // 20 groups
                      ChainCase{8, 2048, 2048, 5632, false}, ChainCase{5, 2048, 2048, 5632, true},
                      ChainCase{8, 256, 256, 512, true}, ChainCase{5, 256, 256, 512, true},
                      ChainCase{5, 256, 256, 512, false}, ChainCase{4, 64, 64, 96, false}),
    [](const auto& info) {
      const ChainCase& c = info.param;
      std::ostringstream name;
      name << "n" << c.n << "_q" << c.q_dim << "_h" << c.hidden << "_i" << c.inter
           << (c.fp8 ? "_fp8" : "");
      return name.str();
    });

}  // namespace
}  // namespace llm::test::gemv
