// The fused element-wise ops of kernels/cuda/ops/model_ops.cu and rope_append_kv.cu against their
// CPU twins (label gpu; skips without a GPU): EmbeddingGather, AddRmsNorm (residual add + optional
// row gather), RopeAppendKv (cpu::ApplyRope + cpu::AppendKv), SiluMul; bf16 and fp16; head_dim 64 /
// 128
// (+ a 24 that takes the scalar path), GQA ratios 1 / 4 / 8, block sizes 8 / 16 / 32.
//
// Error bound: the CPU reference runs in fp32 on the SAME bf16/fp16-rounded inputs, so the
// only differences are fp32 operation order (~1e-6 relative) and the kernel's one rounding of
// each output; a rounding that lands on the other side of a midpoint costs at most one ulp:
// 2^-7 relative for bf16, 2^-10 for fp16. Bound used: |got - ref| <= ulp_rel · |ref| + 1e-5
// (outputs near 0 after cancellation, where fp32 and sincosf-vs-std::cos differences of a few
// 1e-7 · |input| are not covered by a relative term; inputs are O(1)). A wrong angle, head, slot or
// pair is off by O(|ref|). V is copied, so it must match bit for bit; EmbeddingGather is exact (a
// widening).
//
// Poisons: outputs start as NaN; cache slots that no token writes (including those of
// slot -1 tokens, which are otherwise valid slots) must still be NaN afterwards.
//   ninja -C build model_ops_gpu_test && (cd build && ctest -L gpu -R model_ops)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/dtype.h"
#include "tests/kernels/dev_buf.h"

namespace llm {
namespace {

uint16_t ToBits(float x, DType t) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
float FromBits(uint16_t h, DType t) { return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h); }
uint16_t NanBits(DType t) { return t == DType::kBF16 ? 0x7fc0 : 0x7e00; }
const char* Name(DType t) { return t == DType::kBF16 ? "bf16" : "f16"; }

// One ulp of the output type, relative; plus an absolute floor for fp16 subnormals.
float Tolerance(float ref, DType t) {
  return t == DType::kBF16 ? std::ldexp(1.f, -7) * std::fabs(ref) + 1e-5f
                           : std::ldexp(1.f, -10) * std::fabs(ref) + 1e-5f;
}

using test::DevBuf;

// Random values rounded to the dtype: bits for the GPU, the exact floats for the CPU.
void RandomRounded(size_t n, DType t, float scale, std::mt19937& rng, std::vector<uint16_t>* bits,
                   std::vector<float>* vals) {
  std::normal_distribution<float> dist(0.f, scale);
  bits->resize(n);
  vals->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*bits)[i] = ToBits(dist(rng), t);
    (*vals)[i] = FromBits((*bits)[i], t);
  }
}

class ModelOpsGpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU, model ops GPU test skipped: " << why;
  }
};

TEST_P(ModelOpsGpu, EmbeddingGatherIsExact) {
  const DType t = GetParam();
  std::mt19937 rng(1);
  const int64_t vocab = 97;
  for (int64_t hidden : {64, 4096, 1000, 36}) {  // 1000 and 36: not multiples of 8 (scalar)
    std::vector<uint16_t> bits;
    std::vector<float> vals;
    RandomRounded(size_t(vocab * hidden), t, 1.f, rng, &bits, &vals);
    std::vector<int32_t> ids = {0, 96, 5, 5, 42, 17, 96};
    DevBuf dtable(bits), dids(ids), dout(std::vector<float>(ids.size() * hidden, NAN));
    cuda::EmbeddingGather(dtable.p, t, dids.as<int32_t>(), int64_t(ids.size()), hidden,
                          dout.as<float>(), nullptr);
    const std::vector<float> got = dout.Download<float>();
    for (size_t r = 0; r < ids.size(); ++r) {
      for (int64_t i = 0; i < hidden; ++i) {
        ASSERT_EQ(got[r * hidden + i], vals[ids[r] * hidden + i])
            << Name(t) << " hidden " << hidden << " row " << r << " i " << i;
      }
    }
  }
}

// AddRmsNorm with and without delta, with and without a row gather; hidden 12288 exceeds the
// kernel's register cache (8192 at 8-wide chunks) and 1000 takes the scalar path.
TEST_P(ModelOpsGpu, AddRmsNormMatchesCpu) {
  const DType t = GetParam();
  std::mt19937 rng(2);
  const float eps = 1e-5f;
  for (int64_t hidden : {64, 4096, 1000, 12288}) {
    for (bool has_delta : {false, true}) {
      for (bool gather : {false, true}) {
        const int64_t num_tokens = 9;
        std::normal_distribution<float> dist(0.f, 3.f);
        std::vector<float> residual(static_cast<size_t>(num_tokens * hidden)),
            weight(static_cast<size_t>(hidden));
        for (float& v : residual) v = dist(rng);
        for (float& v : weight) v = 1.f + 0.2f * dist(rng);
        std::vector<uint16_t> dbits;
        std::vector<float> dvals;
        RandomRounded(residual.size(), t, 1.f, rng, &dbits, &dvals);
        std::vector<int32_t> rows;
        if (gather) {
          rows = {8, 0, 3};
        } else {
          rows.resize(size_t(num_tokens));
          std::iota(rows.begin(), rows.end(), 0);
        }
        const int64_t num_rows = int64_t(rows.size());

        // CPU: residual rows += delta (only the rows that are normalised), then RmsNorm.
        std::vector<float> res_ref = residual, normed(static_cast<size_t>(num_rows * hidden));
        for (int64_t i = 0; i < num_rows; ++i) {
          float* r = res_ref.data() + rows[i] * hidden;
          if (has_delta) cpu::AddInPlace(r, dvals.data() + rows[i] * hidden, hidden);
          cpu::RmsNorm(r, weight.data(), normed.data() + i * hidden, 1, hidden, eps);
        }

        DevBuf dres(residual), dw(weight), ddelta(dbits), drows(rows);
        DevBuf dout(std::vector<uint16_t>(size_t(num_rows * hidden), NanBits(t)));
        cuda::AddRmsNorm(dres.as<float>(), has_delta ? ddelta.p : nullptr, dw.as<float>(), dout.p,
                         t, gather ? drows.as<int32_t>() : nullptr, num_rows, hidden, eps, nullptr);
        const std::vector<uint16_t> out = dout.Download<uint16_t>();
        const std::vector<float> res_got = dres.Download<float>();
        const std::string what = std::string(Name(t)) + " hidden " + std::to_string(hidden) +
                                 (has_delta ? " delta" : "") + (gather ? " gather" : "");
        for (size_t i = 0; i < res_got.size(); ++i) {
          ASSERT_EQ(res_got[i], res_ref[i]) << what << " residual " << i;  // same fp32 add
        }
        for (size_t i = 0; i < out.size(); ++i) {
          const float g = FromBits(out[i], t);
          ASSERT_FALSE(std::isnan(g)) << what << " out " << i;
          ASSERT_NEAR(g, normed[i], Tolerance(normed[i], t)) << what << " out " << i;
        }
      }
    }
  }
}

// SiluMul, and GeluTanhMul (GeGLU, Gemma) against cpu::GeluTanhMul.
TEST_P(ModelOpsGpu, SiluMulAndGeluTanhMulMatchCpu) {
  const DType t = GetParam();
  std::mt19937 rng(3);
  for (bool gelu : {false, true}) {
    for (auto [num_tokens, inter] :
         {std::pair<int64_t, int64_t>{1, 64}, {7, 11008}, {3, 1000}, {5, 13}, {300, 256}}) {
      std::vector<uint16_t> bits;
      std::vector<float> vals;
      RandomRounded(size_t(num_tokens * 2 * inter), t, 3.f, rng, &bits, &vals);
      std::vector<float> ref(static_cast<size_t>(num_tokens * inter));
      for (int64_t r = 0; r < num_tokens; ++r) {
        const float* row = vals.data() + r * 2 * inter;
        if (gelu) {
          cpu::GeluTanhMul(row, row + inter, ref.data() + r * inter, inter);
        } else {
          cpu::SiluMul(row, row + inter, ref.data() + r * inter, inter);
        }
      }
      DevBuf din(bits), dout(std::vector<uint16_t>(ref.size(), NanBits(t)));
      if (gelu) {
        cuda::GeluTanhMul(din.p, dout.p, num_tokens, inter, t, nullptr);
      } else {
        cuda::SiluMul(din.p, dout.p, num_tokens, inter, t, nullptr);
      }
      const std::vector<uint16_t> out = dout.Download<uint16_t>();
      for (size_t i = 0; i < out.size(); ++i) {
        const float g = FromBits(out[i], t);
        ASSERT_FALSE(std::isnan(g)) << Name(t) << " inter " << inter << " i " << i;
        ASSERT_NEAR(g, ref[i], Tolerance(ref[i], t)) << Name(t) << " inter " << inter << " i " << i;
      }
    }
  }
}

// AddNormedDelta (Gemma's sandwich norms): residual += RmsNorm(delta) · weight, as the CPU's
// cpu::RmsNorm of the delta then cpu::AddInPlace, within fp32 rounding.
TEST_P(ModelOpsGpu, AddNormedDeltaMatchesCpu) {
  const DType t = GetParam();
  std::mt19937 rng(9);
  for (int64_t hidden : {64, 1000, 3840}) {
    const int64_t n = 5;
    std::normal_distribution<float> dist(0.f, 3.f);
    std::vector<float> residual(static_cast<size_t>(n * hidden)),
        weight(static_cast<size_t>(hidden));
    for (float& v : residual) v = dist(rng);
    for (float& v : weight) v = 1.f + 0.2f * dist(rng);
    std::vector<uint16_t> dbits;
    std::vector<float> dvals;
    RandomRounded(residual.size(), t, 2.f, rng, &dbits, &dvals);
    std::vector<float> ref = residual, normed(residual.size());
    cpu::RmsNorm(dvals.data(), weight.data(), normed.data(), n, hidden, 1e-6f);
    cpu::AddInPlace(ref.data(), normed.data(), n * hidden);
    DevBuf dres(residual), dw(weight), ddelta(dbits);
    cuda::AddNormedDelta(dres.as<float>(), ddelta.p, dw.as<float>(), t, n, hidden, 1e-6f, nullptr);
    const std::vector<float> got = dres.Download<float>();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], 1e-5f * (1.f + std::fabs(ref[i]))) << Name(t) << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, ModelOpsGpu, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(Name(info.param)); });

// ---- RopeAppendKv --------------------------------------------------------------------------
struct RopeCase {
  DType dtype;
  int head_dim;
  int num_heads;
  int num_kv_heads;
  int block_size;
  bool bias = false;     // QkvPrologue: q/k/v biases (Qwen2)
  bool qk_norm = false;  // QkvPrologue: per-head q/k RMSNorms (Qwen3)
};

std::string RopeName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  return std::string(Name(c.dtype)) + "_hd" + std::to_string(c.head_dim) + "_h" +
         std::to_string(c.num_heads) + "_kv" + std::to_string(c.num_kv_heads) + "_bs" +
         std::to_string(c.block_size) + (c.bias ? "_bias" : "") + (c.qk_norm ? "_qknorm" : "");
}

class RopeAppendKvGpu : public ::testing::TestWithParam<RopeCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why))
      GTEST_SKIP() << "no GPU, RopeAppendKv GPU test skipped: " << why;
  }
};

TEST_P(RopeAppendKvGpu, MatchesApplyRopeAndAppendKv) {
  const RopeCase c = GetParam();
  const DType t = c.dtype;
  const int hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t num_tokens = 37, num_blocks = 11;
  const PagedKvLayout layout{num_blocks, c.block_size, nkv, hd};
  std::mt19937 rng(4 + hd + nh * 7 + c.block_size);

  std::vector<uint16_t> qkv_bits;
  std::vector<float> qkv;
  const int64_t row = int64_t(nh + 2 * nkv) * hd;
  RandomRounded(size_t(num_tokens * row), t, 1.f, rng, &qkv_bits, &qkv);
  std::vector<int32_t> positions(static_cast<size_t>(num_tokens));
  std::uniform_int_distribution<int32_t> pos_dist(0, 8191);
  for (int32_t& p : positions) p = pos_dist(rng);
  // Distinct random slots over the pool; every 5th token is padding (-1).
  std::vector<int64_t> all_slots(static_cast<size_t>(num_blocks * c.block_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) slots[i] = i % 5 == 3 ? -1 : all_slots[i];
  std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
  for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(500000.f, -2.f * i / float(hd));

  // CPU: split q | k | v, [add biases, normalize q and k heads,] rotate q and k, append k, v.
  std::vector<float> q(size_t(num_tokens) * nh * hd), k(size_t(num_tokens) * nkv * hd), v(k.size());
  for (int64_t tk = 0; tk < num_tokens; ++tk) {
    const float* src = qkv.data() + tk * row;
    std::copy(src, src + nh * hd, q.begin() + tk * nh * hd);
    std::copy(src + nh * hd, src + (nh + nkv) * hd, k.begin() + tk * nkv * hd);
    std::copy(src + (nh + nkv) * hd, src + row, v.begin() + tk * nkv * hd);
  }
  std::normal_distribution<float> wdist(1.f, 0.3f);
  std::vector<float> bias(static_cast<size_t>(row)), q_norm(static_cast<size_t>(hd)),
      k_norm(static_cast<size_t>(hd));
  for (float& b : bias) b = wdist(rng) - 1.f;
  for (float& w : q_norm) w = wdist(rng);
  for (float& w : k_norm) w = wdist(rng);
  if (c.bias) {
    cpu::AddBias(q.data(), bias.data(), num_tokens, nh * hd);
    cpu::AddBias(k.data(), bias.data() + nh * hd, num_tokens, nkv * hd);
    cpu::AddBias(v.data(), bias.data() + (nh + nkv) * hd, num_tokens, nkv * hd);
  }
  if (c.qk_norm) {
    cpu::RmsNorm(q.data(), q_norm.data(), q.data(), num_tokens * nh, hd, 1e-6f);
    cpu::RmsNorm(k.data(), k_norm.data(), k.data(), num_tokens * nkv, hd, 1e-6f);
  }
  cpu::ApplyRope(q.data(), num_tokens, nh, hd, positions.data(), inv_freq.data());
  cpu::ApplyRope(k.data(), num_tokens, nkv, hd, positions.data(), inv_freq.data());
  std::vector<float> kref(size_t(layout.pool_elements()), NAN), vref(kref.size(), NAN);
  cpu::AppendKv(k.data(), v.data(), slots.data(), num_tokens,
                PagedKvView<float>{kref.data(), vref.data(), layout});

  // QkvPrologue::head_warps: the warp-per-head kernel where it applies (per-head norms at
  // head_dim 64 / 128 / 256), against the same reference; both kernels' outputs are compared too.
  const bool warps_apply = c.qk_norm && (hd == 64 || hd == 128 || hd == 256);
  std::vector<uint16_t> first_q, first_k;
  for (const bool head_warps : {false, true}) {
    if (head_warps && !warps_apply) break;
    DevBuf dqkv(qkv_bits), dpos(positions), dslots(slots), dfreq(inv_freq);
    DevBuf dq(std::vector<uint16_t>(q.size(), NanBits(t)));
    DevBuf dk(std::vector<uint16_t>(kref.size(), NanBits(t)));
    DevBuf dv(std::vector<uint16_t>(kref.size(), NanBits(t)));
    DevBuf dbias(bias), dqn(q_norm), dkn(k_norm);
    cuda::QkvPrologue pre;
    pre.head_warps = head_warps;
    if (c.bias) pre.bias = dbias.as<float>();
    if (c.qk_norm) {
      pre.q_norm = dqn.as<float>();
      pre.k_norm = dkn.as<float>();
    }
    cuda::RopeAppendKv(dqkv.p, dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(),
                       num_tokens, nh, nkv, hd, PagedKvView<void>{dk.p, dv.p, layout}, t, dq.p,
                       nullptr, {}, pre);
    const std::vector<uint16_t> qg = dq.Download<uint16_t>(), kg = dk.Download<uint16_t>(),
                                vg = dv.Download<uint16_t>();
    for (size_t i = 0; i < q.size(); ++i) {
      const float g = FromBits(qg[i], t);
      ASSERT_FALSE(std::isnan(g)) << "q " << i;
      ASSERT_NEAR(g, q[i], Tolerance(q[i], t)) << "q " << i;
    }
    for (size_t i = 0; i < kref.size(); ++i) {
      if (std::isnan(kref[i])) {  // a slot nobody writes: still the poison
        ASSERT_EQ(kg[i], NanBits(t)) << "k written at unowned pool element " << i;
        ASSERT_EQ(vg[i], NanBits(t)) << "v written at unowned pool element " << i;
        continue;
      }
      const float g = FromBits(kg[i], t);
      ASSERT_FALSE(std::isnan(g)) << "k " << i;
      ASSERT_NEAR(g, kref[i], Tolerance(kref[i], t)) << "k " << i;
      if (c.bias) {  // v + bias, rounded once
        ASSERT_NEAR(FromBits(vg[i], t), vref[i], Tolerance(vref[i], t)) << "v " << i;
      } else {
        ASSERT_EQ(vg[i], ToBits(vref[i], t)) << "v " << i;  // a copy: bit exact
      }
    }
    if (!head_warps) {
      first_q = qg;
      first_k = kg;
    } else {
      size_t differ = 0;
      for (size_t i = 0; i < qg.size(); ++i) differ += qg[i] != first_q[i];
      for (size_t i = 0; i < kg.size(); ++i) differ += kg[i] != first_k[i];
      std::printf("  warp-per-head RoPE: %zu of %zu q/k values differ from the CTA kernel's\n",
                  differ, qg.size() + kg.size());
    }
  }
}

std::vector<RopeCase> RopeCases() {
  std::vector<RopeCase> cases;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int hd : {64, 128}) {
      for (auto [nh, nkv] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{16, 2}}) {
        for (int bs : {8, 16, 32}) cases.push_back({t, hd, nh, nkv, bs});
      }
    }
    cases.push_back({t, 24, 4, 2, 16});  // half = 12: the scalar path
    for (int hd : {24, 64, 128}) {
      cases.push_back({t, hd, 8, 2, 16, true, false});
      cases.push_back({t, hd, 8, 2, 16, false, true});
      cases.push_back({t, hd, 16, 4, 16, true, true});
    }
    // Qwen3-30B-A3B's heads (32 q, 4 kv at head_dim 128) and head_dim 256, per-head norms: the
    // warp-per-head kernel.
    cases.push_back({t, 128, 32, 4, 16, false, true});
    cases.push_back({t, 256, 8, 2, 16, true, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeAppendKvGpu, ::testing::ValuesIn(RopeCases()), RopeName);

// ScatterCopies against std::memcpy per segment: 13 segments of sizes 0, 4, 12, 16, 20, ...
// (16-byte words and 4-byte tails), one of 1 MiB + 4 bytes (many CTAs per segment), from
// 16-byte aligned offsets of one staging buffer into separate destinations poisoned with 0xAB
// bytes, which must stay untouched past each segment's end.
TEST(ScatterCopiesGpu, EqualsMemcpyPerSegment) {
  std::string why;
  if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {
      0, 4, 12, 16, 20, 28, 64, 100, 4096, 4100, 1 << 20, (1 << 20) + 4, 8};
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t b : sizes) {
    offsets.push_back(total);
    total += (b + 15) / 16 * 16 + 16 * int64_t(rng() % 3);
  }
  std::vector<uint8_t> stage(static_cast<size_t>(total));
  for (uint8_t& v : stage) v = uint8_t(rng());
  DevBuf src(stage);
  std::vector<std::unique_ptr<DevBuf>> dst;
  std::vector<cuda::CopySegment> segs;
  const std::vector<uint8_t> poison_pad(64, 0xAB);
  for (size_t i = 0; i < sizes.size(); ++i) {
    dst.push_back(std::make_unique<DevBuf>(std::vector<uint8_t>(size_t(sizes[i]) + 64, 0xAB)));
    segs.push_back({offsets[i], dst.back()->p, sizes[i]});
  }
  cuda::ScatterCopies(src.p, segs.data(), int(segs.size()), nullptr);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> got = dst[i]->Download<uint8_t>();
    ASSERT_EQ(std::memcmp(got.data(), stage.data() + offsets[i], size_t(sizes[i])), 0)
        << "segment " << i << " (" << sizes[i] << " bytes)";
    ASSERT_EQ(std::memcmp(got.data() + sizes[i], poison_pad.data(), 64), 0)
        << "segment " << i << " wrote past its end";
  }
  // Misaligned or oversized requests are refused before anything runs.
  cuda::CopySegment bad{8, dst[1]->p, 4};
  EXPECT_THROW(cuda::ScatterCopies(src.p, &bad, 1, nullptr), std::invalid_argument);
  bad = {0, dst[1]->p, 6};
  EXPECT_THROW(cuda::ScatterCopies(src.p, &bad, 1, nullptr), std::invalid_argument);
  std::vector<cuda::CopySegment> many(cuda::kMaxCopySegments + 1, cuda::CopySegment{});
  EXPECT_THROW(cuda::ScatterCopies(src.p, many.data(), int(many.size()), nullptr),
               std::invalid_argument);
}

// Argument checks happen on the host before any CUDA call: no GPU needed.
TEST(ModelOpsArgs, RejectsUnsupportedDType) {
  EXPECT_THROW(cuda::SiluMul(nullptr, nullptr, 1, 8, DType::kF32, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::EmbeddingGather(nullptr, DType::kF32, nullptr, 1, 8, nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::AddRmsNorm(nullptr, nullptr, nullptr, nullptr, DType::kF32, nullptr, 1, 8,
                                1e-5f, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::RopeAppendKv(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 64,
                                  PagedKvView<void>{nullptr, nullptr, {1, 16, 1, 64}}, DType::kF32,
                                  nullptr, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace llm
