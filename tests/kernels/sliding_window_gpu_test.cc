// Sliding-window attention on the GPU (AttentionBatch::sliding_window, kernels/paged_kv.h:
// a query at position p sees keys [VisibleKeyBegin(p, W), p]) against the plain definition
// cpu::PagedAttentionReference with the same window (label gpu; skips without a GPU):
//   SlidingPrefillGpu  every prefill rung (v1_naive, v2_smem, v3_mma, v4_wgmma under five of
//                      its schedules, kBest), bf16 / fp16 caches and e4m3 caches (v1, v3 and v4
//                      over the copy of the pages), ragged chunks with cached context, GQA
//                      1/4/8, block sizes 1 … 128, windows 1 … 1000 and past the sequences
//   SlidingDecodeGpu   PagedDecodeAttention at splits 1 / auto / 5 / 64 (and the fp8 steps),
//                      ragged contexts 1 … 4999, the same windows
//   SlidingDecodeLong  32k-key contexts with W = 4096: the window alone is split and read, and a
//                      CUDA graph captured once stays right as the contexts grow
// Skipping, not masking: every key of a sequence left of the (aligned) first key tile that a
// kernel may read holds NaN on the GPU (v4's 128-key tiles for prefill, the decode kernel's
// 64-key tiles), so a kernel that walks a tile wholly left of the window shows NaN. The output
// is NaN before every run. Tolerances are the other attention GPU tests': max |out - ref| <=
// 2e-2 (bf16) / 4e-3 (fp16) · max |ref| (prefill_attention_gpu_test.cc derives them).
//   ninja -C build sliding_window_gpu_test && (cd build && ctest -L gpu -R sliding)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "tests/kernels/dev_buf.h"

namespace llm {
namespace {

using test::DevBuf;

uint16_t ToBits(float x, DType t) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
float FromBits(uint16_t h, DType t) { return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h); }
uint16_t NanBits(DType t) { return t == DType::kBF16 ? 0x7fc0 : 0x7e00; }
float Tol(DType t) { return t == DType::kBF16 ? 2e-2f : 4e-3f; }
constexpr float kKScale = 0.5f, kVScale = 2.f;  // the e4m3 caches' per-tensor scales

// One ragged batch in paged pools (shuffled block table, 3 spare blocks nobody owns), its
// queries, and the device copies. Slots nobody owns, and keys of a sequence left of
// poison_align · floor(VisibleKeyBegin(first query position, W) / poison_align), hold NaN on
// the GPU (and are never read by the reference); poison_slack moves that edge left by as many
// positions (for contexts that shrink later). fp8: e4m3 codes, the reference sees
// E4m3ToF32(code) · scale.
struct Problem {
  DType dtype;
  bool fp8;
  int64_t hd, nh, nkv, bs, window, num_seqs, max_blocks = 0, max_q = 0, max_keys = 0;
  std::vector<int32_t> cu{0}, ctx, tables;
  PagedKvLayout layout;
  std::vector<float> qf, kf, vf, ref;
  std::vector<uint16_t> q16, k16, v16;
  std::vector<uint8_t> k8, v8;
  std::unique_ptr<DevBuf> dq, dout, dk, dv, dcu, dctx, dtab;

  Problem(DType t, bool is_fp8, int64_t head_dim, int64_t heads, int64_t kv_heads,
          int64_t block_size, const std::vector<int32_t>& q_lens, std::vector<int32_t> ctx_lens,
          int64_t w, int64_t poison_align, uint32_t seed, int64_t poison_slack = 0)
      : dtype(t),
        fp8(is_fp8),
        hd(head_dim),
        nh(heads),
        nkv(kv_heads),
        bs(block_size),
        window(w),
        num_seqs(int64_t(q_lens.size())),
        ctx(std::move(ctx_lens)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    int64_t used = 3;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t keys = ctx[size_t(s)] + q_lens[size_t(s)];
      cu.push_back(cu.back() + q_lens[size_t(s)]);
      max_q = std::max<int64_t>(max_q, q_lens[size_t(s)]);
      max_keys = std::max(max_keys, keys);
      max_blocks = std::max(max_blocks, (keys + bs - 1) / bs);
      used += (keys + bs - 1) / bs;
    }
    layout = PagedKvLayout{used, bs, nkv, hd};
    std::vector<int32_t> perm(static_cast<size_t>(used));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables.assign(size_t(num_seqs * max_blocks), -1);
    const size_t pool = size_t(layout.pool_elements());
    kf.assign(pool, 0.f);
    vf.assign(pool, 0.f);
    if (fp8) {
      k8.assign(pool, 0x7f);  // e4m3 NaN codes
      v8.assign(pool, 0xff);
    } else {
      k16.assign(pool, NanBits(t));
      v16.assign(pool, NanBits(t));
    }
    int64_t next = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t keys = ctx[size_t(s)] + q_lens[size_t(s)];
      for (int64_t b = 0; b < (keys + bs - 1) / bs; ++b)
        tables[size_t(s * max_blocks + b)] = perm[size_t(next++)];
      const int64_t readable =
          VisibleKeyBegin(std::max<int64_t>(0, ctx[size_t(s)] - poison_slack), window) /
          poison_align * poison_align;
      for (int64_t key = readable; key < keys; ++key) {
        const int64_t block = tables[size_t(s * max_blocks + key / bs)];
        for (int64_t h = 0; h < nkv; ++h) {
          const int64_t off = layout.Offset(block, h, key % bs);
          for (int64_t d = 0; d < hd; ++d) {
            if (fp8) {
              k8[size_t(off + d)] = F32ToE4m3(2.f * normal(rng));
              v8[size_t(off + d)] = F32ToE4m3(2.f * normal(rng));
              kf[size_t(off + d)] = E4m3ToF32(k8[size_t(off + d)]) * kKScale;
              vf[size_t(off + d)] = E4m3ToF32(v8[size_t(off + d)]) * kVScale;
            } else {
              k16[size_t(off + d)] = ToBits(normal(rng), t);
              v16[size_t(off + d)] = ToBits(normal(rng), t);
              kf[size_t(off + d)] = FromBits(k16[size_t(off + d)], t);
              vf[size_t(off + d)] = FromBits(v16[size_t(off + d)], t);
            }
          }
        }
      }
    }
    const size_t qn = size_t(cu.back() * nh * hd);
    q16.resize(qn);
    qf.resize(qn);
    for (size_t i = 0; i < qn; ++i) {
      q16[i] = ToBits(1.5f * normal(rng), t);  // σ 1.5: peaky rows exercise the rescale
      qf[i] = FromBits(q16[i], t);
    }
    Reference();
    dq = std::make_unique<DevBuf>(q16);
    dout = std::make_unique<DevBuf>(qn * 2);
    if (fp8) {
      dk = std::make_unique<DevBuf>(k8);
      dv = std::make_unique<DevBuf>(v8);
    } else {
      dk = std::make_unique<DevBuf>(k16);
      dv = std::make_unique<DevBuf>(v16);
    }
    dcu = std::make_unique<DevBuf>(cu);
    dctx = std::make_unique<DevBuf>(ctx);
    dtab = std::make_unique<DevBuf>(tables);
  }

  AttentionBatch HostBatch() const {
    AttentionBatch b{num_seqs, cu.data(), ctx.data(), tables.data(), max_blocks};
    b.sliding_window = window;
    return b;
  }

  // cpu::PagedAttentionReference's rows (PagedAttentionReferenceRow, the same definition),
  // spread over the host's cores.
  void Reference() {
    ref.assign(qf.size(), 0.f);
    const AttentionBatch b = HostBatch();
    const PagedKvView<const float> kv{kf.data(), vf.data(), layout};
    const float scale = 1.f / std::sqrt(float(hd));
    std::vector<std::pair<int64_t, int64_t>> rows;  // (sequence, token)
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int64_t t = cu[size_t(s)]; t < cu[size_t(s) + 1]; ++t) rows.emplace_back(s, t);
    std::atomic<size_t> next{0};
    auto work = [&] {
      std::vector<double> row(static_cast<size_t>(hd));
      for (size_t i; (i = next.fetch_add(1)) < rows.size();) {
        const auto [s, t] = rows[i];
        for (int64_t h = 0; h < nh; ++h) {
          cpu::PagedAttentionReferenceRow(qf.data(), kv, b, nh, scale, s, t, h, true, row.data());
          for (int64_t d = 0; d < hd; ++d)
            ref[size_t((t * nh + h) * hd + d)] = float(row[size_t(d)]);
        }
      }
    };
    const unsigned n = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < n; ++i) pool.emplace_back(work);
    for (std::thread& th : pool) th.join();
  }

  cuda::AttentionParams Params() const {
    cuda::AttentionParams p;
    p.q = dq->p;
    p.out = dout->p;
    p.kv = PagedKvView<const void>{dk->p, dv->p, layout};
    p.batch = AttentionBatch{num_seqs, dcu->as<int32_t>(), dctx->as<int32_t>(), dtab->as<int32_t>(),
                             max_blocks};
    p.batch.sliding_window = window;
    p.num_heads = nh;
    p.scale = 1.f / std::sqrt(float(hd));
    p.dtype = dtype;
    p.kv_format = cuda::KvCacheFormat{fp8, fp8 ? kKScale : 1.f, fp8 ? kVScale : 1.f};
    p.max_q_len = max_q;
    p.max_num_keys = max_keys;
    return p;
  }

  void Poison() const {
    LLM_CUDA_CHECK(cudaMemset(dout->p, 0xff, dout->bytes));  // NaN in bf16 and fp16
  }

  // The output against the reference: no NaN, max |out - ref| <= tol · max |ref|. Returns the
  // error ratio err / max|ref|.
  float Check(const std::string& what) const {
    const std::vector<uint16_t> got = dout->Download<uint16_t>();
    float err = 0.f, mx = 0.f;
    size_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = FromBits(got[i], dtype);
      if (std::isnan(g)) {
        ADD_FAILURE() << what << ": NaN at token " << i / size_t(nh * hd) << " head "
                      << (i / size_t(hd)) % size_t(nh);
        return INFINITY;
      }
      mx = std::max(mx, std::fabs(ref[i]));
      if (std::fabs(g - ref[i]) > err) {
        err = std::fabs(g - ref[i]);
        worst = i;
      }
    }
    EXPECT_LE(err, Tol(dtype) * mx) << what << ": worst token " << worst / size_t(nh * hd)
                                    << " head " << (worst / size_t(hd)) % size_t(nh) << " got "
                                    << FromBits(got[worst], dtype) << " ref " << ref[worst];
    std::printf("  %-58s max_err %.3e = %.2e of max|ref| %.3f\n", what.c_str(), err,
                mx > 0 ? err / mx : err, mx);
    return mx > 0 ? err / mx : err;
  }
};

bool NoGpu(std::string* why) { return !cuda::DeviceAvailable(why); }

// ---- prefill -------------------------------------------------------------------------------

struct PrefillCase {
  const char* name;
  DType dtype;
  bool fp8;
  int head_dim, num_heads, num_kv_heads, block_size;
  std::vector<int32_t> q_lens, ctx_lens;
  std::vector<int64_t> windows;
};

class SlidingPrefillGpu : public ::testing::TestWithParam<PrefillCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, sliding-window GPU test skipped: " << why;
  }
};

TEST_P(SlidingPrefillGpu, EveryRungMatchesReference) {
  const PrefillCase& c = GetParam();
  using V = cuda::PrefillVariant;
  namespace d = cuda::detail;
  for (const int64_t w : c.windows) {
    // 128: v4's key tiles, the coarsest any rung aligns to (v3 64, v2 32, v1 per row).
    const Problem pr(c.dtype, c.fp8, c.head_dim, c.num_heads, c.num_kv_heads, c.block_size,
                     c.q_lens, c.ctx_lens, w, 128,
                     uint32_t(77 + c.head_dim + 5 * c.block_size + 3 * w));
    cuda::AttentionParams p = pr.Params();
    // fp8: v4 reads a copy of the pages (PrefillScratch, poisoned with NaN: pages it skips
    // must read as zeros, never as this poison).
    const int64_t pages = cuda::PrefillPagesNeeded(pr.cu.data(), pr.ctx.data(), pr.num_seqs, pr.bs);
    const size_t sbytes =
        c.fp8 ? cuda::PrefillFp8ScratchBytes(pr.layout, pr.dtype, pr.num_seqs, pr.max_blocks, pages)
              : 0;
    const DevBuf scratch_buf(sbytes);
    const cuda::PrefillScratch scratch{scratch_buf.p, sbytes, pages};
    const cuda::PrefillScratch* sp = c.fp8 ? &scratch : nullptr;
    for (const V variant : {V::kNaive, V::kSmem, V::kMma, V::kWgmma, V::kBest}) {
      V resolved;
      try {
        resolved = cuda::ResolvePrefillVariant(p, variant, sp);
      } catch (const std::invalid_argument& e) {
        // v4 needs TMA-sized pages, the tiled rungs head_dim 64 / 128 (v3 also 256), v2 bf16 /
        // fp16 pools.
        const bool tiled = c.head_dim == 64 || c.head_dim == 128;
        const bool hd256 = c.head_dim == 256 && variant == V::kSmem;
        EXPECT_TRUE(variant == V::kWgmma || (!tiled && c.head_dim != 256) || hd256 ||
                    (c.fp8 && variant == V::kSmem))
            << e.what();
        continue;
      }
      const bool v4 = resolved == V::kWgmma && variant == V::kWgmma;
      // kV4Auto: production's schedule for the head_dim (at 64 the compile-time ping-pong
      // kernel with a window); the others include the runtime-bit kernel's schedules.
      std::vector<int> flags = {d::kV4Auto};
      if (v4) {
        flags = {d::kV4Auto,
                 d::kV4Default,
                 d::kV4Default | d::kV4Cluster,
                 d::kV4Default | d::kV4NoPersist,
                 0,
                 d::kV4Default | d::kV4PanelBoxV,
                 d::kV4NoOverlap | d::kV4TinySections};
      }
      for (const int f : flags) {
        if (sbytes > 0) LLM_CUDA_CHECK(cudaMemset(scratch_buf.p, 0xff, sbytes));
        pr.Poison();
        cuda::PagedPrefillAttention(p, nullptr, variant, sp, f);
        LLM_CUDA_CHECK(cudaDeviceSynchronize());
        pr.Check(std::string(c.name) + " W=" + std::to_string(w) + " " +
                 cuda::PrefillVariantName(variant) + " (" + cuda::PrefillVariantName(resolved) +
                 ", flags " + std::to_string(f) + ")");
      }
    }
  }
}

const std::vector<PrefillCase> kPrefillCases = {
    {"bf16_hd128_g4_bs16",
     DType::kBF16,
     false,
     128,
     8,
     2,
     16,
     {1, 37, 300, 513},
     {0, 100, 700, 17},
     {1, 5, 16, 64, 100, 1000, 5000}},
    {"fp16_hd128_g1_bs32",
     DType::kF16,
     false,
     128,
     4,
     4,
     32,
     {640, 129},
     {65, 0},
     {1, 64, 129, 1000}},
    {"bf16_hd64_g8_bs8",
     DType::kBF16,
     false,
     64,
     16,
     2,
     8,
     {190, 1, 260},
     {250, 0, 900},
     {5, 16, 128, 200}},
    {"fp16_hd64_g4_bs16", DType::kF16, false, 64, 8, 2, 16, {333, 64}, {5, 1000}, {1, 100, 333}},
    {"bf16_hd128_g8_bs1", DType::kBF16, false, 128, 8, 1, 1, {200, 3}, {50, 400}, {5, 16, 100}},
    {"bf16_hd128_g4_bs128",
     DType::kBF16,
     false,
     128,
     8,
     2,
     128,
     {333, 130},
     {5, 300},
     {16, 200, 1000}},
    {"bf16_hd8_g2_bs16", DType::kBF16, false, 8, 8, 4, 16, {37, 1}, {5, 20}, {1, 5, 16}},
    // e4m3 caches: v1 and v3 read the codes, v4 a copy of the window's pages.
    {"fp8_bf16_hd128_g4_bs16",
     DType::kBF16,
     true,
     128,
     8,
     2,
     16,
     {300, 77, 1},
     {500, 0, 999},
     {1, 64, 100, 1000}},
    {"fp8_fp16_hd64_g8_bs32", DType::kF16, true, 64, 16, 2, 32, {257, 20}, {0, 700}, {5, 128, 300}},
    {"fp8_bf16_hd128_g1_bs1", DType::kBF16, true, 128, 4, 4, 1, {100}, {150}, {16, 90}},
    // head_dim 256 (Gemma 3: GQA 2, window 1024): v3 (32-key tiles) and v1; windows inside one
    // tile, across tiles, Gemma's 1024 and past the sequences.
    {"bf16_hd256_g2_bs16",
     DType::kBF16,
     false,
     256,
     4,
     2,
     16,
     {1, 37, 300, 129},
     {0, 100, 800, 17},
     {1, 37, 1024, 5000}},
    {"fp16_hd256_g1_bs5", DType::kF16, false, 256, 2, 2, 5, {100, 65}, {33, 0}, {1, 37, 1024}},
    {"bf16_hd256_g8_bs16", DType::kBF16, false, 256, 8, 1, 16, {77}, {1100}, {37, 1024, 5000}},
    {"fp8_bf16_hd256_g2_bs16",
     DType::kBF16,
     true,
     256,
     4,
     2,
     16,
     {130, 1},
     {300, 64},
     {1, 37, 100}},
};

INSTANTIATE_TEST_SUITE_P(Shapes, SlidingPrefillGpu, ::testing::ValuesIn(kPrefillCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SlidingPrefillGpuApi, RefusesNonCausalAndNegativeWindows) {
  alignas(16) static uint16_t buf[8];
  cuda::AttentionParams p;
  p.num_heads = 8;
  p.q = buf;
  p.kv.k = buf;
  p.kv.v = buf;
  p.kv.layout = PagedKvLayout{4, 16, 8, 128};
  p.batch.sliding_window = 64;
  EXPECT_EQ(cuda::ResolvePrefillVariant(p), cuda::PrefillVariant::kWgmma);
  p.causal = false;
  EXPECT_THROW(cuda::ResolvePrefillVariant(p), std::invalid_argument);
  p.causal = true;
  p.batch.sliding_window = -1;
  EXPECT_THROW(cuda::ResolvePrefillVariant(p), std::invalid_argument);
}

// ---- decode --------------------------------------------------------------------------------

struct DecodeCase {
  DType dtype;
  bool fp8;
  int head_dim, group, block_size;
};

std::string DecodeName(const ::testing::TestParamInfo<DecodeCase>& info) {
  const DecodeCase& c = info.param;
  return std::string(c.fp8 ? "fp8_" : "") + (c.dtype == DType::kBF16 ? "bf16" : "f16") + "_hd" +
         std::to_string(c.head_dim) + "_g" + std::to_string(c.group) + "_bs" +
         std::to_string(c.block_size);
}

class SlidingDecodeGpu : public ::testing::TestWithParam<DecodeCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, sliding-window GPU test skipped: " << why;
  }
};

TEST_P(SlidingDecodeGpu, MatchesReference) {
  const DecodeCase& c = GetParam();
  const std::vector<int32_t> num_keys = {1, 63, 65, 1003, 4999, 17, 2500 + c.block_size / 2};
  std::vector<int32_t> ctx, ones(num_keys.size(), 1);
  for (int32_t n : num_keys) ctx.push_back(n - 1);
  const int64_t nkv = 2;
  const size_t ws_bytes =
      cuda::DecodeWorkspaceBytes(int64_t(num_keys.size()), nkv * c.group, c.head_dim, 64);
  DevBuf ws(ws_bytes);
  LLM_CUDA_CHECK(cudaMemset(ws.p, 0, ws_bytes));  // the split counters start at zero (once)
  using Choice = cuda::DecodeKernelChoice;
  for (const int64_t w : {1, 5, 16, 64, 100, 1000, 10000}) {
    // 64: the decode kernel's key tiles (keys left of the window's first tile hold NaN).
    const Problem pr(c.dtype, c.fp8, c.head_dim, nkv * c.group, nkv, c.block_size, ones, ctx, w, 64,
                     uint32_t(99 + c.head_dim + 7 * c.group + 13 * c.block_size + w));
    const cuda::AttentionParams p = pr.Params();
    std::vector<Choice> choices = {Choice::kAuto};
    // The original step (kAuto: transposed for g <= 8 with fp8 caches or at head_dim 256).
    if (c.fp8 || c.head_dim == 256) choices.push_back(Choice::kCta);
    const int64_t window_tiles = (std::min<int64_t>(pr.max_keys, w + 63) + 63) / 64;
    for (const Choice choice : choices) {
      for (const int splits : {1, 0, 5, 64}) {
        pr.Poison();
        cuda::DecodeLaunchInfo info;
        cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, nullptr, &info, choice);
        LLM_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_LE(info.num_splits, window_tiles) << "W=" << w;
        pr.Check("decode " + DecodeName({c, 0}) + " W=" + std::to_string(w) + " splits " +
                 std::to_string(splits) + " (used " + std::to_string(info.num_splits) + ")" +
                 (info.transposed_step ? " transposed" : ""));
      }
    }
    if (c.fp8) {  // the warp-item kernels have no window: refused, not silently full
      EXPECT_THROW(
          cuda::PagedDecodeAttention(p, 1, ws.p, ws_bytes, nullptr, nullptr, Choice::kWarpItems),
          std::invalid_argument);
    }
  }
  // The counters are back at zero (the split merge resets them).
  std::vector<uint32_t> counters(cuda::kDecodeMaxCounters);
  LLM_CUDA_CHECK(
      cudaMemcpy(counters.data(), ws.p, cuda::kDecodeCounterBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u), int64_t(counters.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SlidingDecodeGpu,
    ::testing::Values(
        DecodeCase{DType::kBF16, false, 128, 4, 16}, DecodeCase{DType::kBF16, false, 128, 8, 32},
        DecodeCase{DType::kF16, false, 128, 1, 1}, DecodeCase{DType::kBF16, false, 64, 8, 16},
        DecodeCase{DType::kF16, false, 64, 4, 8}, DecodeCase{DType::kBF16, false, 128, 16, 16},
        DecodeCase{DType::kBF16, true, 128, 4, 16}, DecodeCase{DType::kF16, true, 64, 8, 32},
        DecodeCase{DType::kBF16, true, 128, 16, 1}, DecodeCase{DType::kBF16, false, 256, 2, 16},
        DecodeCase{DType::kF16, false, 256, 8, 7}, DecodeCase{DType::kBF16, false, 256, 1, 16},
        DecodeCase{DType::kBF16, true, 256, 2, 16}, DecodeCase{DType::kF16, true, 256, 16, 16}),
    DecodeName);

// 32k-key contexts with W = 4096 (Mistral's window): the auto split count comes from the
// window's tiles, only the window is read (the 28k keys before it are NaN), and a CUDA graph
// captured for the shape (max_num_keys = 32768) stays right when the contexts grow between
// replays (the grid depends on the shape alone).
TEST(SlidingDecodeLong, Window4096At32kKeys) {
  std::string why;
  if (NoGpu(&why)) GTEST_SKIP() << "no GPU, sliding-window GPU test skipped: " << why;
  const int64_t w = 4096, max_keys = 32768;
  constexpr int32_t kGrow = 40;  // the contexts grow by up to this between graph replays
  const std::vector<int32_t> base = {32767 - kGrow, 32000, 20001, 4095, 4056, 1};
  std::vector<int32_t> built;
  for (int32_t c : base) built.push_back(c + kGrow);
  const std::vector<int32_t> ones(base.size(), 1);
  // Built for the grown contexts; the NaN edge is that of the base ones (poison_slack).
  Problem pr(DType::kBF16, false, 128, 32, 8, 16, ones, built, w, 64, 4242, kGrow);
  ASSERT_EQ(pr.max_keys, max_keys);
  auto set_contexts = [&](int32_t grow) {
    for (size_t s = 0; s < base.size(); ++s) pr.ctx[s] = base[s] + grow;
    pr.dctx->Upload(pr.ctx);
    pr.Reference();
  };
  set_contexts(0);
  cuda::AttentionParams p = pr.Params();
  const size_t ws_bytes = cuda::DecodeWorkspaceBytes(pr.num_seqs, pr.nh, pr.hd, 128);
  DevBuf ws(ws_bytes);
  LLM_CUDA_CHECK(cudaMemset(ws.p, 0, ws_bytes));
  const int auto_splits = cuda::DecodeAutoSplits(pr.num_seqs, pr.nkv, max_keys, pr.hd, 128, 2, w);
  const int full_splits = cuda::DecodeAutoSplits(pr.num_seqs, pr.nkv, max_keys, pr.hd, 128, 2);
  std::printf("  auto splits at 6 x 32k: %d with W = 4096, %d without\n", auto_splits, full_splits);
  EXPECT_LE(auto_splits, (w + 63 + 63) / 64 / 2);  // >= 2 of the window's 65 tiles per split
  for (const int splits : {0, 1, 64}) {
    pr.Poison();
    cuda::DecodeLaunchInfo info;
    cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, nullptr, &info);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    if (splits == 0) {
      EXPECT_EQ(info.num_splits, auto_splits);
    }
    pr.Check("decode 6 x 32k W=4096 splits " + std::to_string(splits) + " (used " +
             std::to_string(info.num_splits) + ")");
  }

  // One graph captured for the shape, replayed as the contexts grow (on the device only).
  cudaStream_t stream;
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::PagedDecodeAttention(p, 0, ws.p, ws_bytes, stream);
  LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const int32_t grow : {0, 1, kGrow}) {
    set_contexts(grow);
    pr.Poison();
    LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    pr.Check("decode 6 x 32k W=4096 graph replay, contexts +" + std::to_string(grow));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace llm
