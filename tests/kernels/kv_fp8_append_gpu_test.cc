// The FP8 (e4m3) KV cache on the GPU (kernels/cuda/attention/attention.h: KvCacheFormat;
// kernels/fp8.h): the kernels that write e4m3 pools against their CPU specification, and the
// combinations the fp8 paths refuse (label gpu; every test skips without a GPU, except the
// host-only variant resolution check; fixtures in kv_fp8_fixtures.h):
//   AppendKvFp8Gpu      AppendKv codes bit-exact vs F32ToE4m3(float(x) / scale) and cpu::AppendKv
//   RopeAppendKvFp8Gpu  RopeAppendKv(fp8) vs the same kernel writing a bf16 / fp16 cache
//   GemvRopeFp8Gpu      the kRopeAppendKv GEMV epilogue vs kStore + RopeAppendKv(fp8), bit for bit
//   KvFp8GpuArgs        unsupported combinations throw std::invalid_argument
// Decode and prefill attention over e4m3 pools: kv_fp8_attention_gpu_test.cc.
//
// Append tolerances. AppendKv: bit-exact (the spec is F32ToE4m3(float(x) / scale), RNE, ±448
// saturation, subnormals, -0 → 0x80, ±inf → ±448). RopeAppendKv: q_out is bit-identical to the
// bf16 / fp16-cache run, v codes are exactly F32ToE4m3(v / v_scale) (v is quantized from its
// dtype value). The k code is F32ToE4m3(y / k_scale) of the fp32 rotation y, which is not
// observable; the dtype-cache run shows d = dtype(y). Every y that rounds to d lies in
// [mid(d⁻, d), mid(d, d⁺)] (the midpoints to d's dtype neighbours, exact in fp32), and x ↦
// F32ToE4m3(fl(x / s)) is monotone, so the code's value must lie between the quantizations of
// the two midpoints: an exact, tight form of |code − d| ≤ ulp_e4m3 / 2 + ulp_dtype / 2 (double
// rounding through d may move a code by one step; nothing may move it by more). That holds for
// quantizing d too, so a second check pins the fp32 path: against F32ToE4m3(y_host / s) of the
// host rotation (cpu::ApplyRope: same fp32 angle, sincosf vs std::sin within a few fp32 ulps),
// codes may differ only where y_host and y straddle an e4m3 rounding midpoint: 2e-5 of the
// elements in a host emulation with y off by a pessimistic 4 fp32 ulps + 3e-7; quantizing d
// instead differs on 0.38% (fp16) / 3.1% (bf16) of them. Allowed: n / 1000 + 2 mismatches per
// case (n = the k codes written). The GEMV epilogue is bit-identical.
//   ninja -C build kv_fp8_append_gpu_test && (cd build && ctest -L gpu -R kv_fp8_append)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "kernels/paged_kv.h"
#include "tests/kernels/dev_buf.h"
#include "tests/kernels/kv_fp8_fixtures.h"

namespace llm::test::kv_fp8 {
namespace {

// ---- 1. AppendKv --------------------------------------------------------------------------
// A value whose quantization exercises a corner: e4m3 ties (scale 1: exact; 1.0625 → 1,
// 1.1875 → 1.25, 136 → 128, 3·2^-10 → 2^-8 (subnormal tie), 2^-10 → 0), subnormals, zero and
// -0, values that round to 0, the largest code, beyond it (saturation) and infinity.
float SpecialValue(std::mt19937& rng, float scale) {
  static const float kSpecial[] = {
      0.f,           -0.f,           1.0625f, -1.1875f,  136.f,    -0.00293f, 0.0029296875f,
      0.0009765625f, -0.0048828125f, 448.f,   -448.f,    464.f,    -500.f,    1000.f,
      -1e4f,         1e-5f,          -1e-6f,  0.015625f, -0.0137f, INFINITY,  -INFINITY};
  std::uniform_int_distribution<int> pick(0, int(std::size(kSpecial)) - 1);
  const float x = kSpecial[pick(rng)];
  return std::isinf(x) ? x : x * scale;
}

class AppendKvFp8Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 AppendKv test skipped: " << why;
  }
};

// Bit-exact codes: k → F32ToE4m3(float(k) / k_scale), v likewise, against the formula and
// cpu::AppendKv's fp8 overload; tokens with slot < 0 write nothing (their would-be slots keep
// the sentinel NaN codes); bf16 and fp16 inputs; 16-byte rows (hd 128, 64) and odd rows (hd 6).
TEST_F(AppendKvFp8Gpu, CodesBitExact) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int64_t hd : {128, 64, 6}) {
      for (const ScaleSet& sc : {ScaleSet{1.f, 1.f, 0}, ScaleSet{0.37f, 2.5f, 0}}) {
        const std::string what =
            std::string(Name(t)) + " hd " + std::to_string(hd) + " k_scale " + std::to_string(sc.k);
        std::mt19937 rng(uint32_t(99 + hd + (t == DType::kF16 ? 7 : 0) + int(sc.k * 100)));
        std::normal_distribution<float> normal(0.f, 1.f);
        std::uniform_real_distribution<float> u01(0.f, 1.f);
        const PagedKvLayout layout{9, 16, 3, hd};
        const int64_t num_tokens = 40;
        std::vector<int64_t> all(size_t(layout.num_blocks * layout.block_size));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        std::vector<int64_t> slots(static_cast<size_t>(num_tokens));
        for (int64_t i = 0; i < num_tokens; ++i) slots[size_t(i)] = i % 7 == 3 ? -1 : all[i];
        const size_t n = size_t(num_tokens * layout.num_kv_heads * hd);
        std::vector<uint16_t> kb(n), vb(n);
        std::vector<float> kf(n), vf(n);
        auto draw = [&](float s) {
          const float r = u01(rng);
          if (r < 0.15f) return SpecialValue(rng, s);
          if (r < 0.3f) return (u01(rng) - 0.5f) * 0.04f * s;  // e4m3 subnormals (< 2^-6 · s)
          if (r < 0.4f) return 300.f * s * normal(rng);        // saturates often
          return 3.f * s * normal(rng);
        };
        for (size_t i = 0; i < n; ++i) {
          kb[i] = ToBits(draw(sc.k), t);
          vb[i] = ToBits(draw(sc.v), t);
          kf[i] = FromBits(kb[i], t);
          vf[i] = FromBits(vb[i], t);
        }
        const size_t pool = size_t(layout.pool_elements());
        std::vector<uint8_t> k_want(pool, kNanK), v_want(pool, kNanV);
        for (int64_t i = 0; i < num_tokens; ++i) {
          if (slots[size_t(i)] < 0) continue;
          for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
            const int64_t dst = layout.SlotOffset(slots[size_t(i)], h);
            const int64_t src = (i * layout.num_kv_heads + h) * hd;
            for (int64_t d = 0; d < hd; ++d) {
              k_want[size_t(dst + d)] = F32ToE4m3(kf[size_t(src + d)] / sc.k);
              v_want[size_t(dst + d)] = F32ToE4m3(vf[size_t(src + d)] / sc.v);
            }
          }
        }
        std::vector<uint8_t> k_cpu(pool, kNanK), v_cpu(pool, kNanV);
        cpu::AppendKv(kf.data(), vf.data(), slots.data(), num_tokens,
                      PagedKvView<uint8_t>{k_cpu.data(), v_cpu.data(), layout},
                      cpu::Fp8KvScales{sc.k, sc.v});
        ASSERT_TRUE(k_cpu == k_want && v_cpu == v_want) << what << ": cpu::AppendKv disagrees";

        DevBuf dk(kb), dv(vb), dslots(slots), dkc(std::vector<uint8_t>(pool, kNanK)),
            dvc(std::vector<uint8_t>(pool, kNanV));
        cuda::AppendKv(dk.p, dv.p, dslots.as<int64_t>(), num_tokens,
                       PagedKvView<void>{dkc.p, dvc.p, layout}, t, nullptr,
                       cuda::KvCacheFormat{true, sc.k, sc.v});
        const std::vector<uint8_t> k_got = dkc.Download<uint8_t>(), v_got = dvc.Download<uint8_t>();
        size_t k_bad = 0, v_bad = 0;
        for (size_t i = 0; i < pool; ++i) {
          if (k_got[i] != k_want[i] && k_bad++ < 5) {
            ADD_FAILURE() << what << ": k pool element " << i << " code 0x" << std::hex
                          << int(k_got[i]) << " want 0x" << int(k_want[i]) << std::dec;
          }
          if (v_got[i] != v_want[i] && v_bad++ < 5) {
            ADD_FAILURE() << what << ": v pool element " << i << " code 0x" << std::hex
                          << int(v_got[i]) << " want 0x" << int(v_want[i]) << std::dec;
          }
        }
        EXPECT_EQ(k_bad, 0u) << what;
        EXPECT_EQ(v_bad, 0u) << what;
      }
    }
  }
}

// ---- 2. RopeAppendKv ----------------------------------------------------------------------
struct RopeCase {
  DType dtype;
  int head_dim, num_heads, num_kv_heads, block_size;
  float k_scale, v_scale;
  bool qk_norm = false;     // QkvPrologue's per-head q / k RMSNorms (Qwen3), in both runs
  bool head_warps = false;  // QkvPrologue::head_warps (a warp per head where it applies)
};

std::string RopeName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  return std::string(Name(c.dtype)) + "_hd" + std::to_string(c.head_dim) + "_h" +
         std::to_string(c.num_heads) + "_kv" + std::to_string(c.num_kv_heads) + "_bs" +
         std::to_string(c.block_size) + (c.qk_norm ? "_qknorm" : "") +
         (c.head_warps ? "_warps_" : "_") + std::to_string(info.index);
}

// The dtype value next to d (bits of d in the dtype) toward +inf (dir 1) or -inf (dir -1):
// bf16 and fp16 are sign-magnitude, so step the signed magnitude.
float Neighbour(uint16_t bits, DType t, int dir) {
  int32_t key = (bits & 0x8000) ? -int32_t(bits & 0x7fff) : int32_t(bits);
  key += dir;
  const uint16_t b = key >= 0 ? uint16_t(key) : uint16_t(0x8000 | uint16_t(-key));
  return FromBits(b, t);
}

class RopeAppendKvFp8Gpu : public ::testing::TestWithParam<RopeCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 RopeAppendKv test skipped: " << why;
  }
};

TEST_P(RopeAppendKvFp8Gpu, MatchesDtypeCacheRun) {
  const RopeCase c = GetParam();
  const DType t = c.dtype;
  const int hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t num_tokens = 37, num_blocks = 11;
  const PagedKvLayout layout{num_blocks, c.block_size, nkv, hd};
  std::mt19937 rng(uint32_t(5 + hd + nh * 7 + c.block_size + int(c.k_scale * 1000)));
  const int64_t row = int64_t(nh + 2 * nkv) * hd;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> qkv_bits(size_t(num_tokens * row));
  std::vector<float> qkv(qkv_bits.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    qkv_bits[i] = ToBits(normal(rng), t);
    qkv[i] = FromBits(qkv_bits[i], t);
  }
  std::vector<int32_t> positions(static_cast<size_t>(num_tokens));
  std::uniform_int_distribution<int32_t> pos_dist(0, 8191);
  for (int32_t& p : positions) p = pos_dist(rng);
  std::vector<int64_t> all_slots(size_t(num_blocks * c.block_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) slots[size_t(i)] = i % 5 == 3 ? -1 : all_slots[i];
  std::vector<float> inv_freq(size_t(hd / 2));
  for (int i = 0; i < hd / 2; ++i) inv_freq[size_t(i)] = std::pow(500000.f, -2.f * i / float(hd));

  const size_t pool = size_t(layout.pool_elements()), nq = size_t(num_tokens * nh * hd);
  const uint16_t nan16 = t == DType::kBF16 ? 0x7fc0 : 0x7e00;
  // The per-head norms' weights (qk_norm): around 1, as trained ones.
  std::normal_distribution<float> wdist(1.f, 0.3f);
  std::vector<float> q_norm(static_cast<size_t>(hd)), k_norm(static_cast<size_t>(hd));
  for (float& w : q_norm) w = wdist(rng);
  for (float& w : k_norm) w = wdist(rng);
  DevBuf dqn(q_norm), dkn(k_norm);
  cuda::QkvPrologue pre;
  if (c.qk_norm) {
    pre.q_norm = dqn.as<float>();
    pre.k_norm = dkn.as<float>();
  }
  pre.head_warps = c.head_warps;
  DevBuf dqkv(qkv_bits), dpos(positions), dslots(slots), dfreq(inv_freq);
  DevBuf dq16(std::vector<uint16_t>(nq, nan16)), dq8(std::vector<uint16_t>(nq, nan16));
  DevBuf dk16(std::vector<uint16_t>(pool, nan16)), dv16(std::vector<uint16_t>(pool, nan16));
  DevBuf dk8(std::vector<uint8_t>(pool, kNanK)), dv8(std::vector<uint8_t>(pool, kNanV));
  cuda::RopeAppendKv(dqkv.p, dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(),
                     num_tokens, nh, nkv, hd, PagedKvView<void>{dk16.p, dv16.p, layout}, t, dq16.p,
                     nullptr, {}, pre);
  cuda::RopeAppendKv(dqkv.p, dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(),
                     num_tokens, nh, nkv, hd, PagedKvView<void>{dk8.p, dv8.p, layout}, t, dq8.p,
                     nullptr, cuda::KvCacheFormat{true, c.k_scale, c.v_scale}, pre);
  const std::vector<uint16_t> q16 = dq16.Download<uint16_t>(), q8 = dq8.Download<uint16_t>();
  const std::vector<uint16_t> k16 = dk16.Download<uint16_t>(), v16 = dv16.Download<uint16_t>();
  const std::vector<uint8_t> k8 = dk8.Download<uint8_t>(), v8 = dv8.Download<uint8_t>();

  // q_out does not depend on the cache format.
  size_t q_diff = 0;
  for (size_t i = 0; i < nq; ++i) q_diff += q16[i] != q8[i];
  EXPECT_EQ(q_diff, 0u) << "q_out differs between the dtype-cache and the fp8-cache runs";

  // The host rotation of k (fp32), for the fp32-path check; pool offset -> its value.
  std::vector<float> k_host(size_t(num_tokens) * nkv * hd);
  for (int64_t tk = 0; tk < num_tokens; ++tk) {
    const float* src = qkv.data() + tk * row + int64_t(nh) * hd;
    std::copy(src, src + nkv * hd, k_host.begin() + tk * nkv * hd);
  }
  if (c.qk_norm) {
    cpu::RmsNorm(k_host.data(), k_norm.data(), k_host.data(), num_tokens * nkv, hd, 1e-6f);
  }
  cpu::ApplyRope(k_host.data(), num_tokens, nkv, hd, positions.data(), inv_freq.data());
  std::vector<float> k_host_pool(pool, NAN);
  std::vector<char> owned(pool, 0);
  for (int64_t tk = 0; tk < num_tokens; ++tk) {
    if (slots[size_t(tk)] < 0) continue;
    for (int h = 0; h < nkv; ++h) {
      const int64_t dst = layout.SlotOffset(slots[size_t(tk)], h);
      for (int d = 0; d < hd; ++d) {
        k_host_pool[size_t(dst + d)] = k_host[size_t((tk * nkv + h) * hd + d)];
        owned[size_t(dst + d)] = 1;
      }
    }
  }

  size_t checked = 0, host_mismatch = 0;
  for (size_t i = 0; i < pool; ++i) {
    if (!owned[i]) {  // nobody writes here (slot -1 tokens included): still the poison
      ASSERT_EQ(k8[i], kNanK) << "k written at unowned pool element " << i;
      ASSERT_EQ(v8[i], kNanV) << "v written at unowned pool element " << i;
      continue;
    }
    // v: quantized from its dtype value (the dtype-cache run's copy of it).
    const float v = FromBits(v16[i], t);
    ASSERT_EQ(v8[i], F32ToE4m3(v / c.v_scale)) << "v pool element " << i << " value " << v;
    // k: its value between the quantizations of the midpoints around d = dtype(y).
    const float d = FromBits(k16[i], t);
    ASSERT_FALSE(std::isnan(d)) << "k pool element " << i << " (dtype run)";
    const float lo = 0.5f * (d + Neighbour(k16[i], t, -1));
    const float hi = 0.5f * (d + Neighbour(k16[i], t, 1));
    const float got = E4m3ToF32(k8[i]);
    const float got_lo = E4m3ToF32(F32ToE4m3(lo / c.k_scale));
    const float got_hi = E4m3ToF32(F32ToE4m3(hi / c.k_scale));
    ASSERT_TRUE(got >= got_lo && got <= got_hi)
        << "k pool element " << i << ": code 0x" << std::hex << int(k8[i]) << std::dec << " = "
        << got << " · " << c.k_scale << ", dtype value " << d << " (allowed " << got_lo << " … "
        << got_hi << ")";
    host_mismatch += k8[i] != F32ToE4m3(k_host_pool[i] / c.k_scale);
    ++checked;
  }
  EXPECT_GT(checked, 0u);
  std::printf("  %zu k codes; %zu differ from the host fp32 rotation's quantization\n", checked,
              host_mismatch);
  EXPECT_LE(host_mismatch, checked / 1000 + 2)
      << "k codes look quantized from the dtype-rounded value, not from the fp32 rotation";
}

std::vector<RopeCase> RopeCases() {
  // k_scale 0.004 saturates most of k (|k| / 0.004 up to ~1000).
  const std::pair<float, float> scales[] = {{1.f, 1.f}, {0.75f, 0.3f}, {0.004f, 1.7f}};
  std::vector<RopeCase> cases;
  int i = 0;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int hd : {64, 128}) {
      for (auto [nh, nkv] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{16, 2}}) {
        for (int bs : {8, 16, 32}) {
          const auto [ks, vs] = scales[i++ % 3];
          cases.push_back({t, hd, nh, nkv, bs, ks, vs});
        }
      }
    }
    cases.push_back({t, 24, 4, 2, 16, 0.75f, 0.3f});  // half = 12: the scalar path
    // Per-head norms on the CTA kernel, and (head_warps) a warp per head at head_dim 64 / 128 /
    // 256 (at 24 the CTA kernel still).
    for (int hd : {24, 64, 128, 256}) {
      for (const bool warps : {false, true}) {
        const auto [ks, vs] = scales[i++ % 3];
        cases.push_back({t, hd, 8, 2, 16, ks, vs, true, warps});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeAppendKvFp8Gpu, ::testing::ValuesIn(RopeCases()), RopeName);

// ---- 3. GEMV kRopeAppendKv ----------------------------------------------------------------
struct GemvCase {
  DType dtype;
  int n, num_heads, num_kv_heads, head_dim, k;
  bool norm;
  float k_scale, v_scale;
};

class GemvRopeFp8Gpu : public ::testing::TestWithParam<GemvCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 GEMV RopeAppendKv test skipped: " << why;
  }
};

// kRopeAppendKv with fp8 pools is kStore followed by cuda::RopeAppendKv(fp8): q and both e4m3
// pools bit-identical (tokens with slot -1 write nothing).
TEST_P(GemvRopeFp8Gpu, EqualsGemvThenRopeAppendKvBitForBit) {
  const GemvCase c = GetParam();
  std::mt19937 rng(uint32_t(c.n * 7 + c.head_dim + c.k + int(c.k_scale * 1000)));
  const int64_t n = c.n, k = c.k, hd = c.head_dim;
  const int64_t m = int64_t(c.num_heads + 2 * c.num_kv_heads) * hd;
  const PagedKvLayout layout{4, 16, c.num_kv_heads, hd};
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> resid(static_cast<size_t>(n * k)), gain(static_cast<size_t>(k));
  for (float& v : resid) v = 2.f * dist(rng);
  for (float& v : gain) v = 1.f + 0.2f * dist(rng);
  std::vector<float> inv_freq(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv_freq[size_t(i)] = std::pow(10000.f, -2.f * i / float(hd));
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    positions[size_t(t)] = int32_t(rng() % 100000);
    slots[size_t(t)] = t % 3 == 2 ? -1 : (t * 13 + 5) % (layout.num_blocks * layout.block_size);
  }
  auto random_half = [&](size_t count, float s) {
    std::vector<uint16_t> v(count);
    for (uint16_t& e : v) e = ToBits(s * dist(rng), c.dtype);
    return v;
  };
  const std::vector<uint16_t> x = random_half(size_t(n * k), 1.f);
  const std::vector<uint16_t> w = random_half(size_t(m * k), 0.05f);
  const size_t nq = size_t(n * c.num_heads * hd), pool = size_t(layout.pool_elements());
  const uint16_t nan16 = c.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
  DevBuf dx = c.norm ? DevBuf(resid) : DevBuf(x);
  DevBuf dgain(gain), dfreq(inv_freq), dpos(positions), dslots(slots), dw(w);
  DevBuf dqkv(size_t(n * m) * 2);
  DevBuf dq0(std::vector<uint16_t>(nq, nan16)), dq1(std::vector<uint16_t>(nq, nan16));
  DevBuf dk0(std::vector<uint8_t>(pool, kNanK)), dk1(std::vector<uint8_t>(pool, kNanK));
  DevBuf dv0(std::vector<uint8_t>(pool, kNanV)), dv1(std::vector<uint8_t>(pool, kNanV));
  const cuda::KvCacheFormat format{true, c.k_scale, c.v_scale};
  cuda::GemvArgs a;
  a.x = dx.p;
  a.norm_weight = c.norm ? dgain.as<float>() : nullptr;
  a.eps = 1e-5f;
  a.w = dw.p;
  a.n = n;
  a.m = m;
  a.k = k;
  a.dtype = c.dtype;
  // Two kernels: kStore into q|k|v, then RopeAppendKv into the fp8 pools.
  a.epilogue = cuda::GemvEpilogue::kStore;
  a.y = dqkv.p;
  cuda::Gemv(a, nullptr);
  cuda::RopeAppendKv(dqkv.p, dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(), n,
                     c.num_heads, c.num_kv_heads, int(hd), PagedKvView<void>{dk0.p, dv0.p, layout},
                     c.dtype, dq0.p, nullptr, format);
  // One kernel.
  a.epilogue = cuda::GemvEpilogue::kRopeAppendKv;
  a.y = dq1.p;
  a.rope.positions = dpos.as<int32_t>();
  a.rope.slot_mapping = dslots.as<int64_t>();
  a.rope.inv_freq = dfreq.as<float>();
  a.rope.num_heads = c.num_heads;
  a.rope.num_kv_heads = c.num_kv_heads;
  a.rope.head_dim = int(hd);
  a.rope.layout = layout;
  a.rope.k_cache = dk1.p;
  a.rope.v_cache = dv1.p;
  a.rope.kv_format = format;
  ASSERT_TRUE(cuda::GemvSupports(a));
  cuda::Gemv(a, nullptr);
  const std::vector<uint16_t> q0 = dq0.Download<uint16_t>(), q1 = dq1.Download<uint16_t>();
  const std::vector<uint8_t> k0 = dk0.Download<uint8_t>(), k1 = dk1.Download<uint8_t>();
  const std::vector<uint8_t> v0 = dv0.Download<uint8_t>(), v1 = dv1.Download<uint8_t>();
  auto count_diff = [](const auto& p, const auto& q) {
    size_t d = 0;
    for (size_t i = 0; i < p.size(); ++i) d += p[i] != q[i];
    return d;
  };
  EXPECT_EQ(count_diff(q0, q1), 0u) << "q";
  EXPECT_EQ(count_diff(k0, k1), 0u) << "K pool";
  EXPECT_EQ(count_diff(v0, v1), 0u) << "V pool";
  size_t nan = 0;
  for (uint16_t v : q1) nan += std::isnan(FromBits(v, c.dtype));
  EXPECT_EQ(nan, 0u) << "every q element written";
  // The reference path wrote exactly the slots of tokens with slot >= 0 (the rest is poison).
  int64_t written_tokens = 0;
  for (int64_t s : slots) written_tokens += s >= 0;
  const size_t want_written = size_t(written_tokens * c.num_kv_heads * hd);
  EXPECT_EQ(pool - size_t(std::count(k0.begin(), k0.end(), kNanK)), want_written) << "K writes";
  EXPECT_EQ(pool - size_t(std::count(v0.begin(), v0.end(), kNanV)), want_written) << "V writes";
  // The fused kernel again on at most 3 CTAs (GemvArgs::max_ctas: each walks many row groups,
  // reading the shared-memory staged positions, slots and inv_freq for each): the same bits.
  DevBuf dq2(std::vector<uint16_t>(nq, nan16)), dk2(std::vector<uint8_t>(pool, kNanK)),
      dv2(std::vector<uint8_t>(pool, kNanV));
  a.y = dq2.p;
  a.rope.k_cache = dk2.p;
  a.rope.v_cache = dv2.p;
  a.max_ctas = 3;
  cuda::Gemv(a, nullptr);
  EXPECT_EQ(count_diff(q0, dq2.Download<uint16_t>()), 0u) << "q, 3 CTAs";
  EXPECT_EQ(count_diff(k0, dk2.Download<uint8_t>()), 0u) << "K pool, 3 CTAs";
  EXPECT_EQ(count_diff(v0, dv2.Download<uint8_t>()), 0u) << "V pool, 3 CTAs";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvRopeFp8Gpu,
    ::testing::Values(GemvCase{DType::kBF16, 1, 4, 2, 128, 512, true, 1.f, 1.f},
                      GemvCase{DType::kBF16, 3, 8, 8, 64, 1024, false, 0.004f, 0.5f},
                      GemvCase{DType::kF16, 8, 4, 1, 128, 256, true, 0.37f, 1.7f},
                      GemvCase{DType::kF16, 3, 2, 2, 64, 4096, false, 1.f, 1.f},
                      GemvCase{DType::kBF16, 8, 8, 2, 64, 512, false, 0.5f, 2.f},
                      GemvCase{DType::kF16, 1, 4, 4, 128, 1024, false, 0.1f, 0.1f}),
    [](const auto& info) {
      const GemvCase& c = info.param;
      return std::string(Name(c.dtype)) + "_n" + std::to_string(c.n) + "_h" +
             std::to_string(c.num_heads) + "_kv" + std::to_string(c.num_kv_heads) + "_hd" +
             std::to_string(c.head_dim) + (c.norm ? "_rmsnorm" : "") + "_" +
             std::to_string(info.index);
    });

// ---- 4. Unsupported combinations ----------------------------------------------------------
// Host-side resolution: no GPU needed (as PrefillAttentionGpuApi).
TEST(KvFp8GpuArgs, PrefillResolveRejectsRungsWithoutFp8) {
  cuda::AttentionParams p;
  p.num_heads = 8;
  p.kv.layout = PagedKvLayout{4, 16, 2, 128};
  p.kv_format = cuda::KvCacheFormat{true, 1.f, 1.f};
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kMma);
  EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kNaive),
            cuda::PrefillVariant::kNaive);
  EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kMma), cuda::PrefillVariant::kMma);
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kSmem), std::invalid_argument);
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kWgmma), std::invalid_argument);
  p.kv.layout.head_dim = 64;
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kMma);
  p.kv.layout.head_dim = 32;  // kNaive only
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kNaive);
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kMma), std::invalid_argument);
  p.kv.layout.head_dim = 160;  // up to 256: v1_naive
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kNaive);
  p.kv.layout.head_dim = 256;  // Gemma 3: v3 dequantizes e4m3 tiles at 256 too; v4 has no 256
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kMma);
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kWgmma), std::invalid_argument);
  p.kv.layout.head_dim = 288;
  EXPECT_THROW(cuda::ResolvePrefillVariant(p), std::invalid_argument);
  p.kv.layout.head_dim = 128;
  p.dtype = DType::kF32;
  EXPECT_THROW(cuda::ResolvePrefillVariant(p), std::invalid_argument);
}

// Launch-level checks (before anything is launched; null pointers are never read).
TEST(KvFp8GpuArgs, LaunchesRejectUnsupportedShapes) {
  std::string why;
  if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 argument checks skipped: " << why;
  const cuda::KvCacheFormat fp8{true, 0.5f, 2.f};
  cuda::AttentionParams p;
  p.kv.layout = PagedKvLayout{1, 16, 1, 96};
  p.num_heads = 1;
  p.batch.num_seqs = 1;
  p.max_q_len = 1;
  p.max_num_keys = 1;
  p.kv_format = fp8;
  try {
    cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr);
    FAIL() << "fp8 decode with head_dim 96 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
  }
  p.kv.layout.head_dim = 128;
  p.dtype = DType::kF32;
  EXPECT_THROW(cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr), std::invalid_argument)
      << "fp8 decode with F32 q accepted";
  p.dtype = DType::kBF16;
  p.num_heads = 32;  // 32 query heads per KV head: above the 16 the decode kernel takes
  EXPECT_THROW(cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr), std::invalid_argument)
      << "fp8 decode with group 32 accepted";
  p.num_heads = 8;
  p.kv_format = cuda::KvCacheFormat{};  // the warp-item kernel reads fp8 caches only
  EXPECT_THROW(cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr, nullptr,
                                          cuda::DecodeKernelChoice::kWarpItems),
               std::invalid_argument)
      << "the warp-item decode kernel accepted a bf16 cache";
  p.kv_format = fp8;
  p.kv.layout = PagedKvLayout{4, 16, 2, 128};
  for (auto v : {cuda::PrefillVariant::kSmem, cuda::PrefillVariant::kWgmma}) {
    EXPECT_THROW(cuda::PagedPrefillAttention(p, nullptr, v), std::invalid_argument)
        << "fp8 prefill on " << cuda::PrefillVariantName(v) << " accepted";
  }
  p.kv.layout.head_dim = 96;
  EXPECT_THROW(cuda::PagedPrefillAttention(p, nullptr, cuda::PrefillVariant::kMma),
               std::invalid_argument)
      << "fp8 prefill v3_mma with head_dim 96 accepted";
  EXPECT_THROW(cuda::RopeAppendKv(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 64,
                                  PagedKvView<void>{nullptr, nullptr, {1, 16, 1, 64}}, DType::kF32,
                                  nullptr, nullptr, fp8),
               std::invalid_argument)
      << "fp8 RopeAppendKv with F32 accepted";
}

}  // namespace
}  // namespace llm::test::kv_fp8
