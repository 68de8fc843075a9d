// GPU paged prefill attention (every rung of kernels/cuda/attention/prefill_attention.h) against
// the CPU reference cpu::PagedPrefillAttention (label gpu; skips without a GPU).
//
// Each case draws a ragged batch (q lengths 1 … 1000, not multiples of any tile), cached
// context (chunked prefill), GQA groups 1/4/8, block sizes 4/8/16/32/64/128, head_dim 64/128, bf16
// and fp16, and a shuffled block table. Pool slots no sequence owns, and the slots of a sequence's
// last block past its last key, hold NaN on the GPU (stale cache contents must never reach the
// output); the reference sees zeros there. Outputs are poisoned with NaN before every run.
//
// Error bound: the reference runs in fp32 on the rounded inputs, so what remains is the
// kernels' own rounding: the output's rounding to bf16/fp16 (2^-9 / 2^-11 relative), P rounded
// to bf16/fp16 as the tensor-core operand of P·V (relative 2^-9 / 2^-11 per weight, averaging
// out over keys) and fp32 reordering. Each rung must satisfy
//     max |out - ref| ≤ tol · max |ref|,  tol = 2e-2 (bf16) / 4e-3 (fp16),
// about 8-10× the rounding of the largest output (measured: ≈3.3e-3 × max|ref| for every bf16
// rung, the naive one included); the test prints each rung's error next to the naive rung's
// (same-precision inputs, no P rounding). v4 is run under the 27 schedules listed at the loop,
// among them the previous V layout (kV4PanelBoxV). Then non-causal (v4 only) against
// cpu::PagedAttentionReference with causal = false, under the same bound.
//   ninja -C build prefill_attention_gpu_test && (cd build && ctest -L gpu -R prefill_attention)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/dtype.h"

namespace llm {
namespace {

struct Case {
  const char* name;
  DType dtype;
  int head_dim, num_heads, num_kv_heads, block_size;
  std::vector<int> q_lens, ctx_lens;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  explicit DeviceArray(const std::vector<T>& host) {
    LLM_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(1, host.size()) * sizeof(T)));
    LLM_CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

uint16_t Round(DType t, float x) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
float Widen(DType t, uint16_t x) { return t == DType::kBF16 ? Bf16ToF32(x) : F16ToF32(x); }

class PrefillAttentionGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(PrefillAttentionGpu, EveryRungMatchesCpuReference) {
  const Case& cs = GetParam();
  const int hd = cs.head_dim, nh = cs.num_heads, nkv = cs.num_kv_heads, bs = cs.block_size;
  const int num_seqs = static_cast<int>(cs.q_lens.size());
  std::mt19937 rng(1234 + hd + bs * 7 + nh);
  std::normal_distribution<float> dist(0.f, 1.f);

  std::vector<int32_t> cu{0}, ctx(cs.ctx_lens.begin(), cs.ctx_lens.end());
  int max_q = 0, max_keys = 0, max_blocks = 0;
  for (int i = 0; i < num_seqs; ++i) {
    cu.push_back(cu.back() + cs.q_lens[i]);
    max_q = std::max(max_q, cs.q_lens[i]);
    max_keys = std::max(max_keys, ctx[i] + cs.q_lens[i]);
    max_blocks = std::max(max_blocks, (ctx[i] + cs.q_lens[i] + bs - 1) / bs);
  }
  const int num_tokens = cu.back();
  // Shuffled block table, 3 spare blocks nobody owns (NaN on the GPU).
  int total_blocks = 3;
  for (int i = 0; i < num_seqs; ++i) total_blocks += (ctx[i] + cs.q_lens[i] + bs - 1) / bs;
  std::vector<int32_t> perm(total_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(size_t(num_seqs) * max_blocks, -1);
  PagedKvLayout layout{total_blocks, bs, nkv, hd};
  const size_t pool = layout.pool_elements();
  std::vector<uint16_t> k16(pool, 0x7fc0), v16(pool, 0x7fc0);  // NaN (bf16 and fp16 alike
  if (cs.dtype == DType::kF16) {                               // need their own pattern)
    std::fill(k16.begin(), k16.end(), uint16_t(0x7e00));
    std::fill(v16.begin(), v16.end(), uint16_t(0x7e00));
  }
  std::vector<float> kf(pool, 0.f), vf(pool, 0.f);
  int next = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const int keys = ctx[i] + cs.q_lens[i];
    for (int b = 0; b < (keys + bs - 1) / bs; ++b)
      tables[size_t(i) * max_blocks + b] = perm[next++];
    for (int key = 0; key < keys; ++key) {
      const int block = tables[size_t(i) * max_blocks + key / bs];
      for (int h = 0; h < nkv; ++h) {
        const int64_t off = layout.Offset(block, h, key % bs);
        for (int d = 0; d < hd; ++d) {
          k16[off + d] = Round(cs.dtype, dist(rng));
          v16[off + d] = Round(cs.dtype, dist(rng));
          kf[off + d] = Widen(cs.dtype, k16[off + d]);
          vf[off + d] = Widen(cs.dtype, v16[off + d]);
        }
      }
    }
  }
  const size_t qn = size_t(num_tokens) * nh * hd;
  std::vector<uint16_t> q16(qn);
  std::vector<float> qf(qn), ref(qn);
  for (size_t i = 0; i < qn; ++i) {
    q16[i] = Round(cs.dtype, 1.5f * dist(rng));  // std 1.5: peaky rows exercise the rescale
    qf[i] = Widen(cs.dtype, q16[i]);
  }
  const float scale = 1.f / std::sqrt(float(hd));
  AttentionBatch host_batch{num_seqs, cu.data(), ctx.data(), tables.data(), max_blocks};
  cpu::PagedPrefillAttention(qf.data(), PagedKvView<const float>{kf.data(), vf.data(), layout},
                             host_batch, nh, scale, ref.data());
  float ref_max = 0.f;
  for (float x : ref) ref_max = std::max(ref_max, std::fabs(x));

  DeviceArray<uint16_t> dq(q16), dk(k16), dv(v16), dout{std::vector<uint16_t>(qn)};
  DeviceArray<int32_t> dcu(cu), dctx(ctx), dtab(tables);
  cuda::AttentionParams p;
  p.q = dq.ptr;
  p.out = dout.ptr;
  p.kv = PagedKvView<const void>{dk.ptr, dv.ptr, layout};
  p.batch = AttentionBatch{num_seqs, dcu.ptr, dctx.ptr, dtab.ptr, max_blocks};
  p.num_heads = nh;
  p.scale = scale;
  p.dtype = cs.dtype;
  p.max_q_len = max_q;
  p.max_num_keys = max_keys;

  const float tol = cs.dtype == DType::kBF16 ? 2e-2f : 4e-3f;
  const uint16_t poison = cs.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
  float naive_err = -1.f;
  std::vector<uint16_t> got(qn);
  for (auto variant :
       {cuda::PrefillVariant::kNaive, cuda::PrefillVariant::kSmem, cuda::PrefillVariant::kMma,
        cuda::PrefillVariant::kWgmma, cuda::PrefillVariant::kBest}) {
    const char* name = cuda::PrefillVariantName(variant);
    cuda::PrefillVariant resolved = variant;
    try {
      resolved = cuda::ResolvePrefillVariant(p, variant);
    } catch (const std::invalid_argument& e) {
      // v4 needs TMA-friendly pages (kBest falls back to v3 then); head dims other than 64 and
      // 128 run on the naive rung only (256 also on v3).
      ASSERT_TRUE(variant == cuda::PrefillVariant::kWgmma || (hd != 64 && hd != 128 && hd != 256) ||
                  (hd == 256 && variant == cuda::PrefillVariant::kSmem))
          << e.what();
      continue;
    }
    // v4 runs all four schedules (ping-pong and intra-warpgroup overlap on / off), each on a
    // persistent grid and one CTA per tile, with and without the 2-CTA cluster that multicasts
    // shared K/V tiles; then the production schedule with V loaded as two boxes per page (the
    // previous V tile layout, kV4PanelBoxV), alone and clustered; then Q loaded at each tile's
    // start and the output in 4-byte stores (kV4NoQPrefetch | kV4NarrowStores: the kernel
    // before 2026-12-06), plain and ping-pong + overlap; then each of the two alone; then
    // production's schedule on the runtime-bit kernel (kV4Generic) and as kV4Auto (the
    // compile-time kernel, which the schedule's own bits above also select); then its items in
    // one section (kV4AllPairs) and in sections of three KV heads (kV4TinySections), plain and
    // clustered. The others (and kBest) run the production path once (kV4Auto).
    const bool v4 =
        resolved == cuda::PrefillVariant::kWgmma && variant != cuda::PrefillVariant::kBest;
    for (int i = 0; i < (v4 ? 27 : 1); ++i) {
      using namespace cuda::detail;
      const int flags = i < 16 ? (i & 3) | ((i & 4) ? kV4Cluster : 0) | ((i & 8) ? kV4NoPersist : 0)
                        : i < 18  ? kV4Default | kV4PanelBoxV | (i == 17 ? kV4Cluster : 0)
                        : i < 20  ? kV4NoQPrefetch | kV4NarrowStores | (i == 18 ? kV4Default : 0)
                        : i == 20 ? kV4Default | kV4NarrowStores
                        : i == 21 ? kV4NoQPrefetch
                        : i == 22 ? ResolveV4Flags(kV4Auto, hd) | kV4Generic
                        : i == 23 ? kV4Auto
                        : i == 24 ? ResolveV4Flags(kV4Auto, hd) | kV4AllPairs
                        : i == 25 ? ResolveV4Flags(kV4Auto, hd) | kV4TinySections
                                  : kV4Default | kV4Cluster | kV4TinySections;
      std::vector<uint16_t> poisoned(qn, poison);
      LLM_CUDA_CHECK(cudaMemcpy(dout.ptr, poisoned.data(), qn * 2, cudaMemcpyHostToDevice));
      cuda::PagedPrefillAttention(p, nullptr, variant, /*scratch=*/nullptr,
                                  v4 ? flags : cuda::detail::kV4Auto);
      LLM_CUDA_CHECK(cudaDeviceSynchronize());
      LLM_CUDA_CHECK(cudaMemcpy(got.data(), dout.ptr, qn * 2, cudaMemcpyDeviceToHost));
      float err = 0.f;
      size_t worst = 0;
      for (size_t i = 0; i < qn; ++i) {
        const float g = Widen(cs.dtype, got[i]);
        ASSERT_FALSE(std::isnan(g)) << name << " element " << i << " (token " << i / (nh * hd)
                                    << ", head " << (i / hd) % nh << ", dim " << i % hd << ")";
        const float e = std::fabs(g - ref[i]);
        if (e > err) {
          err = e;
          worst = i;
        }
      }
      if (variant == cuda::PrefillVariant::kNaive) naive_err = err;
      std::printf("  %-9s (%s, flags %d) max_err %.3e  (%.2e of max|ref| %.3f; naive %.3e)\n", name,
                  cuda::PrefillVariantName(resolved), flags, err, err / ref_max, ref_max,
                  naive_err);
      EXPECT_LE(err, tol * ref_max)
          << name << " flags " << flags << " worst element " << worst << " token "
          << worst / (nh * hd) << " head " << (worst / hd) % nh;
    }
  }

  // Non-causal (every query sees its whole sequence; the benchmark shapes' other case): v4
  // alone has the mode, under four schedules, against the plain definition; the other rungs
  // refuse it clearly.
  p.causal = false;
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kMma), std::invalid_argument);
  bool v4_runs = true;
  try {
    cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kWgmma);
  } catch (const std::invalid_argument&) {
    v4_runs = false;  // head dims other than 64 / 128, or block size 4
  }
  if (!v4_runs) return;
  std::vector<float> full(qn);
  cpu::PagedAttentionReference(qf.data(), PagedKvView<const float>{kf.data(), vf.data(), layout},
                               host_batch, nh, scale, full.data(), /*causal=*/false);
  float full_max = 0.f;
  for (float x : full) full_max = std::max(full_max, std::fabs(x));
  using cuda::detail::kV4Cluster, cuda::detail::kV4Default, cuda::detail::kV4NoPersist,
      cuda::detail::kV4TinySections, cuda::detail::kV4Auto;
  for (int flags : {kV4Default, kV4Default | kV4Cluster, kV4Default | kV4NoPersist, 0, kV4Auto,
                    kV4Default | kV4TinySections}) {
    std::vector<uint16_t> poisoned(qn, poison);
    LLM_CUDA_CHECK(cudaMemcpy(dout.ptr, poisoned.data(), qn * 2, cudaMemcpyHostToDevice));
    cuda::PagedPrefillAttention(p, nullptr, cuda::PrefillVariant::kWgmma, /*scratch=*/nullptr,
                                flags);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    LLM_CUDA_CHECK(cudaMemcpy(got.data(), dout.ptr, qn * 2, cudaMemcpyDeviceToHost));
    float err = 0.f;
    for (size_t i = 0; i < qn; ++i) {
      const float g = Widen(cs.dtype, got[i]);
      ASSERT_FALSE(std::isnan(g)) << "non-causal flags " << flags << " element " << i;
      err = std::max(err, std::fabs(g - full[i]));
    }
    std::printf("  non-causal v4_wgmma (flags %d) max_err %.3e  (%.2e of max|ref| %.3f)\n", flags,
                err, err / full_max, full_max);
    EXPECT_LE(err, tol * full_max) << "non-causal flags " << flags;
  }
}

const std::vector<Case> kCases = {
    {"bf16_hd128_g1_bs16", DType::kBF16, 128, 8, 8, 16, {1, 37, 200, 1000}, {0, 100, 0, 333}},
    {"bf16_hd128_g4_bs32", DType::kBF16, 128, 16, 4, 32, {513, 77, 1}, {17, 0, 900}},
    {"fp16_hd64_g8_bs8", DType::kF16, 64, 16, 2, 8, {129, 640, 3}, {0, 65, 1000}},
    {"fp16_hd128_g4_bs16", DType::kF16, 128, 4, 1, 16, {999}, {0}},
    {"bf16_hd64_g1_bs16", DType::kBF16, 64, 8, 8, 16, {64, 128, 300}, {64, 0, 7}},
    {"bf16_hd128_g4_bs4", DType::kBF16, 128, 8, 2, 4, {100, 250}, {3, 50}},
    {"fp16_hd64_g1_bs32", DType::kF16, 64, 4, 4, 32, {1000, 5}, {24, 129}},
    {"bf16_hd64_g8_bs8", DType::kBF16, 64, 8, 1, 8, {190, 1}, {250, 0}},
    {"bf16_hd8_g2_bs16", DType::kBF16, 8, 8, 4, 16, {37, 1}, {5, 20}},  // stories260K's shape
    {"fp16_hd96_g4_bs16", DType::kF16, 96, 8, 2, 16, {70}, {10}},
    // v4's V tiles are [page][panel][key][64]: block size 8 at head_dim 128 (a k16 step spans
    // two pages: SBO of one page), 64 (steps move to the next page mid-tile) and 128 (one page,
    // one 32 KiB box per tile; in a cluster one CTA loads all of V).
    {"bf16_hd128_g4_bs8", DType::kBF16, 128, 8, 2, 8, {300, 45}, {20, 131}},
    {"fp16_hd128_g1_bs64", DType::kF16, 128, 4, 4, 64, {700, 9}, {0, 70}},
    {"bf16_hd128_g8_bs128", DType::kBF16, 128, 16, 2, 128, {333, 130}, {5, 200}},
    {"fp16_hd64_g4_bs128", DType::kF16, 64, 8, 2, 128, {257, 20}, {0, 99}},
    // head_dim 256 (Gemma 3): v3 with 32-key tiles and Q re-read from shared memory.
    {"bf16_hd256_g2_bs16", DType::kBF16, 256, 8, 4, 16, {1, 37, 200, 513}, {0, 100, 0, 333}},
    {"fp16_hd256_g1_bs16", DType::kF16, 256, 4, 4, 16, {300, 65}, {17, 0}},
    {"bf16_hd256_g8_bs7", DType::kBF16, 256, 8, 1, 7, {129, 1}, {40, 300}},
    {"fp16_hd256_g2_bs32", DType::kF16, 256, 4, 2, 32, {640}, {65}},
};

INSTANTIATE_TEST_SUITE_P(Shapes, PrefillAttentionGpu, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(PrefillAttentionGpuApi, RejectsUnsupportedHeadDimAndBlockSize) {
  cuda::AttentionParams p;
  p.num_heads = 8;
  p.kv.layout = PagedKvLayout{4, 16, 8, 320};
  try {
    cuda::ResolvePrefillVariant(p);
    FAIL() << "head_dim 320 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("320"), std::string::npos) << e.what();
  }
  // Other head dims up to 256 run on the naive rung only.
  for (int64_t hd : {96, 160}) {
    p.kv.layout = PagedKvLayout{4, 16, 8, hd};
    EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kNaive);
    EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kMma), std::invalid_argument);
  }
  // 256: v3 (kBest) and v1; v2 and v4 refuse it.
  p.kv.layout = PagedKvLayout{4, 16, 8, 256};
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kMma);
  EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kNaive),
            cuda::PrefillVariant::kNaive);
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kSmem), std::invalid_argument);
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kWgmma), std::invalid_argument);
  p.kv.layout = PagedKvLayout{4, 4, 8, 128};
  EXPECT_THROW(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kWgmma), std::invalid_argument);
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kMma);
}

// Non-causal runs on v4 alone: every other rung, and kBest wherever v4 cannot run (other head
// dims, block size 4, fp8 pools), refuses it instead of silently computing causal attention.
TEST(PrefillAttentionGpuApi, NonCausalRunsOnV4OrIsRefused) {
  alignas(16) static uint16_t buf[8];
  cuda::AttentionParams p;
  p.num_heads = 8;
  p.causal = false;
  p.q = buf;
  p.kv.k = buf;
  p.kv.v = buf;
  for (int64_t hd : {64, 128}) {
    p.kv.layout = PagedKvLayout{4, 16, 8, hd};
    EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kWgmma);
    EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kWgmma),
              cuda::PrefillVariant::kWgmma);
    for (auto v :
         {cuda::PrefillVariant::kNaive, cuda::PrefillVariant::kSmem, cuda::PrefillVariant::kMma}) {
      EXPECT_THROW(cuda::ResolvePrefillVariant(p, v), std::invalid_argument) << hd;
    }
  }
  for (const PagedKvLayout& layout : {PagedKvLayout{4, 16, 8, 8}, PagedKvLayout{4, 16, 8, 96},
                                      PagedKvLayout{4, 4, 8, 128}, PagedKvLayout{4, 16, 8, 256}}) {
    p.kv.layout = layout;
    for (auto v : {cuda::PrefillVariant::kBest, cuda::PrefillVariant::kNaive}) {
      try {
        cuda::ResolvePrefillVariant(p, v);
        ADD_FAILURE() << "non-causal accepted, head_dim " << layout.head_dim << " block size "
                      << layout.block_size;
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("non-causal"), std::string::npos) << e.what();
      }
    }
  }
  p.kv.layout = PagedKvLayout{4, 16, 8, 128};
  p.kv_format.fp8 = true;
  EXPECT_THROW(cuda::ResolvePrefillVariant(p), std::invalid_argument);
}

}  // namespace
}  // namespace llm
