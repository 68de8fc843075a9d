// The FP8 (e4m3) KV cache on the GPU (kernels/cuda/attention/attention.h: KvCacheFormat;
// kernels/fp8.h): decode and prefill attention over e4m3 pools against their CPU specification
// (label gpu; every test skips without a GPU; fixtures in kv_fp8_fixtures.h):
//   DecodeFp8Gpu        PagedDecodeAttention over e4m3 pools vs cpu::PagedDecodeAttention (fp8):
//                       the CTA kernel (splits 1, auto, 16) and the warp-item kernel (grid caps)
//   DecodeFp8GpuMany    many ragged sequences: the warp-item kernel, the automatic choice
//   PrefillFp8Gpu       PagedPrefillAttention kNaive / kMma / kBest vs cpu::PagedPrefillAttention,
//                       and kWgmma / kBest over a copy of the pages (PrefillScratch)
// The append kernels and the unsupported combinations: kv_fp8_append_gpu_test.cc.
//
// Data. K/V are drawn in the code domain (normal, σ 1-3, with ±100…460 outliers in every third
// sequence, ≥ 448 saturating to 0x7e / 0xfe; subnormal codes occur near 0), quantized on the
// host with F32ToE4m3; GPU and CPU read the same codes with non-unit scales in most cases
// (k 0.5 / v 2, k 0.37 / v 0.7). q is rounded to the dtype on the host, and the CPU gets those
// rounded values. Ragged batches (decode: 1 … 4999 keys; prefill: q 1 … 600 over cached context
// 0 … 600), shuffled block tables with spare blocks. Pool slots no sequence owns (spare blocks,
// the tail of each sequence's last block) hold the NaN codes 0x7f / 0xff on the GPU (zeros for
// the CPU), outputs are NaN before every run, so a read through a wrong page or past a
// sequence's end, or an unwritten output, shows NaN.
//
// Attention tolerance. The reference runs in fp32 on the same q and the same dequantized K/V,
// so what remains is the GPU's own rounding (decode_attention.h: fp16 tensor-core math):
//   q → fp16: exact (a bf16 value in fp16's normal range has 8 ≤ 11 significant bits; below
//     2^-14 it loses < 2^-25 absolute; |q| < 10 here). K/V → fp16: exact (every e4m3 value is
//     an fp16 value); scales are folded into fp32 factors (2^-24 relative).
//   S = q·K: fp16 products are exact in fp32; fp32 accumulation in another order costs ~1e-6
//     of Σ|q k| (< 1e-4 in the exponent even with the ±448 outlier keys): < 1e-4 relative on P.
//   P → fp16 before P·V: each weight within 2^-11 relative, the error Σ δ_j p_j v_j / l has
//     signs independent of v: typically 2^-12 |out| (a random walk), at most 2^-11 Σ p|v| / l.
//   out → dtype: unit roundoff 2^-8 (bf16, 8 significant bits) / 2^-11 (fp16) of |out|.
// Bound, per sequence (stronger than over the batch: a long sequence's outputs are averages, an
// order of magnitude smaller than a 1-key sequence's or an outlier's, and a dropped tile there
// would hide under a batch-wide maximum):  max |gpu − ref| ≤ tol · max |ref| over the
// sequence's outputs, tol = 2e-2 (bf16 output, as the bf16 attention tests) / 4e-3 (fp16).
// A host emulation of exactly that arithmetic (q → fp16, P → fp16, output rounded) on these
// data measured ≤ 3.9e-3 (bf16: the output's 2^-8) and ≤ 4.6e-4 (fp16) per sequence; with P
// rounded to bf16 instead (a bf16 tensor-core rung) still ≤ 4.0e-3. The unrealizable worst case,
// every P rounding against the output's sign per element and every output rounding a full
// half-ulp off (Σ p|v| / l reaches ~7 · max|ref| on the flattest rows), came to 5.0e-3 (bf16)
// and 3.9e-3 (fp16): inside both bounds. A wrong key, page, scale, a dropped tile or a bad
// split merge costs O(max|ref|). Each run prints its error.
//   ninja -C build kv_fp8_attention_gpu_test && (cd build && ctest -L gpu -R kv_fp8_attention)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/dtype.h"
#include "kernels/paged_kv.h"
#include "tests/kernels/dev_buf.h"
#include "tests/kernels/kv_fp8_fixtures.h"

namespace llm::test::kv_fp8 {
namespace {

// ---- 1. Decode ----------------------------------------------------------------------------
struct DecodeCase {
  DType dtype;
  int head_dim, group, block_size, scale_set;
};

std::string CaseName(const DecodeCase& c) {
  return std::string(Name(c.dtype)) + "_hd" + std::to_string(c.head_dim) + "_g" +
         std::to_string(c.group) + "_bs" + std::to_string(c.block_size) + "_s" +
         std::to_string(c.scale_set);
}
std::string DecodeName(const ::testing::TestParamInfo<DecodeCase>& info) {
  return CaseName(info.param);
}

// The CPU fp8 reference of a decode batch (one query per sequence).
std::vector<float> CpuDecodeFp8(const std::vector<float>& q32, const Fp8Pools& pools,
                                const ScaleSet& sc, const std::vector<int32_t>& context_lens,
                                const std::vector<int32_t>& cu, int64_t num_seqs, int64_t num_heads,
                                float scale) {
  std::vector<float> ref(q32.size());
  const AttentionBatch host_batch{num_seqs, cu.data(), context_lens.data(), pools.tables.data(),
                                  pools.max_blocks};
  cpu::PagedDecodeAttention(
      q32.data(), PagedKvView<const uint8_t>{pools.k_cpu.data(), pools.v_cpu.data(), pools.layout},
      cpu::Fp8KvScales{sc.k, sc.v}, host_batch, num_heads, scale, ref.data(), 1);
  return ref;
}

class DecodeFp8Gpu : public ::testing::TestWithParam<DecodeCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 KV decode attention test skipped: " << why;
  }
};

TEST_P(DecodeFp8Gpu, MatchesCpuFp8Reference) {
  const DecodeCase c = GetParam();
  const ScaleSet sc = kScaleSets[c.scale_set];
  const int64_t num_kv_heads = 2, num_heads = num_kv_heads * c.group, hd = c.head_dim;
  // Ragged: 1 and 2 keys, around a 64-key tile, two long ones, non-multiples of the block.
  const std::vector<int32_t> num_keys = {1, 63, 65, 129, 1003, 4999, 17, 2500 + c.block_size / 2,
                                         2};
  const int64_t num_seqs = int64_t(num_keys.size());
  std::mt19937 rng(uint32_t(4321 + hd + 7 * c.group + 13 * c.block_size + 101 * c.scale_set +
                            (c.dtype == DType::kF16 ? 1000 : 0)));
  const Fp8Pools pools(num_keys, c.block_size, num_kv_heads, hd, sc.sigma, rng);
  std::vector<int32_t> context_lens(static_cast<size_t>(num_seqs)),
      cu(static_cast<size_t>(num_seqs + 1));
  for (int64_t s = 0; s < num_seqs; ++s) {
    context_lens[size_t(s)] = num_keys[size_t(s)] - 1;
    cu[size_t(s)] = int32_t(s);
  }
  cu[size_t(num_seqs)] = int32_t(num_seqs);
  std::vector<uint16_t> q16;
  std::vector<float> q32;
  RandomQ(size_t(num_seqs * num_heads * hd), c.dtype, rng, &q16, &q32);
  const float scale = 1.f / std::sqrt(float(hd));

  const std::vector<float> ref =
      CpuDecodeFp8(q32, pools, sc, context_lens, cu, num_seqs, num_heads, scale);

  const DeviceProblem dev(q16, pools, context_lens, cu);
  const DevBuf& dout = dev.out;
  constexpr int kManySplits = 16;
  const size_t ws_bytes = cuda::DecodeWorkspaceBytes(num_seqs, num_heads, hd, kManySplits);
  DevBuf ws(ws_bytes);
  // The contract: zeroed once. The partials after the counters are then poisoned with NaN, so a
  // merge reading a partial this call did not write shows NaN.
  LLM_CUDA_CHECK(cudaMemset(ws.p, 0, ws_bytes));
  LLM_CUDA_CHECK(cudaMemset(static_cast<char*>(ws.p) + cuda::kDecodeCounterBytes, 0xff,
                            ws_bytes - cuda::kDecodeCounterBytes));

  cuda::AttentionParams p = dev.Params(pools, num_seqs, num_heads, scale, c.dtype, sc);
  p.max_q_len = 1;
  p.max_num_keys = *std::max_element(num_keys.begin(), num_keys.end());

  // The CTA kernel with the automatic per-warp step (groups <= 8: the transposed one) and with
  // the original one (kCta).
  for (const auto choice : {cuda::DecodeKernelChoice::kAuto, cuda::DecodeKernelChoice::kCta}) {
    std::vector<uint16_t> first_many;
    for (int splits : {1, 0, kManySplits, kManySplits}) {
      LLM_CUDA_CHECK(cudaMemset(dout.p, 0xff, dout.bytes));  // NaN in bf16 and fp16
      cuda::DecodeLaunchInfo info;
      cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, nullptr, &info, choice);
      const std::vector<uint16_t> got = dout.Download<uint16_t>();
      const std::string what =
          CaseName(c) + (choice == cuda::DecodeKernelChoice::kCta ? " kCta" : "") + " splits " +
          std::to_string(splits) + " (used " + std::to_string(info.num_splits) + ")";
      CheckAttention(got, ref, c.dtype, cu, num_heads * hd, what);
      EXPECT_FALSE(info.warp_items) << what << ": 18 items chose the warp-item kernel";
      EXPECT_EQ(info.transposed_step, choice == cuda::DecodeKernelChoice::kAuto && c.group <= 8)
          << what << ": the per-warp step";
      if (splits == 1) {
        EXPECT_EQ(info.num_splits, 1) << what;
      }
      if (splits == kManySplits) {
        EXPECT_EQ(info.num_splits, kManySplits) << what;  // 4999 keys: far more than 16 tiles
        if (first_many.empty()) {
          first_many = got;
        } else {
          EXPECT_TRUE(first_many == got) << what << ": a repeated call is not bit-identical";
        }
      }
    }
  }
  // The persistent warp-item kernel (v4): its grid capped so that each warp walks several of the
  // 2·9 ragged items (1 CTA: 4 warps × 4-5 items, the 1- and 2-key items included, so its
  // pipeline crosses item boundaries with cursors several items apart; 2 CTAs), and uncapped
  // (a warp per item). Bit-identical on a repeat.
  // Both per-warp steps: kWarpItems and kWarpItemsT (transposed; group 16 runs kWarpItems).
  // Neither takes head_dim 256 (refused).
  for (const auto choice :
       {cuda::DecodeKernelChoice::kWarpItems, cuda::DecodeKernelChoice::kWarpItemsT}) {
    if (hd == 256) {
      EXPECT_THROW(cuda::PagedDecodeAttention(p, 0, ws.p, ws_bytes, nullptr, nullptr, choice),
                   std::invalid_argument);
      continue;
    }
    std::vector<uint16_t> first_items;
    for (const int max_ctas : {1, 1, 2, 0}) {
      LLM_CUDA_CHECK(cudaMemset(dout.p, 0xff, dout.bytes));
      cuda::DecodeLaunchInfo info;
      cuda::PagedDecodeAttention(p, 0, ws.p, ws_bytes, nullptr, &info, choice, max_ctas);
      const std::vector<uint16_t> got = dout.Download<uint16_t>();
      const std::string what = CaseName(c) +
                               (choice == cuda::DecodeKernelChoice::kWarpItemsT ? " T" : "") +
                               " warp items (grid cap " + std::to_string(max_ctas) + ")";
      CheckAttention(got, ref, c.dtype, cu, num_heads * hd, what);
      EXPECT_TRUE(info.warp_items) << what;
      EXPECT_EQ(info.transposed_step,
                choice == cuda::DecodeKernelChoice::kWarpItemsT && c.group <= 8)
          << what << ": the per-warp step";
      EXPECT_EQ(info.num_splits, 1) << what;
      if (max_ctas > 0) {
        EXPECT_EQ(info.num_ctas, max_ctas) << what;
      }
      if (first_items.empty()) {
        first_items = got;
      } else if (max_ctas == 1) {
        EXPECT_TRUE(first_items == got) << what << ": a repeated call is not bit-identical";
      }
    }
  }
  // Programmatic dependent launch on (launch.h): the default kernel at 16 splits and the
  // transposed warp-item kernel give the bits they give with PDL off, also as the second of two
  // back-to-back launches on one stream (its PdlWait orders it after the first, whose split
  // counters it then reuses).
  {
    const bool saved = cuda::ProgrammaticLaunch();
    cudaStream_t stream = nullptr;
    LLM_CUDA_CHECK(cudaStreamCreate(&stream));
    for (const auto choice :
         {cuda::DecodeKernelChoice::kAuto, cuda::DecodeKernelChoice::kWarpItemsT}) {
      if (hd == 256 && choice != cuda::DecodeKernelChoice::kAuto) continue;
      const int splits = choice == cuda::DecodeKernelChoice::kAuto ? kManySplits : 0;
      const int max_ctas = choice == cuda::DecodeKernelChoice::kAuto ? 0 : 1;
      const std::string what = CaseName(c) + " PDL " +
                               (choice == cuda::DecodeKernelChoice::kAuto ? "default" : "T items");
      cuda::SetProgrammaticLaunch(false);
      LLM_CUDA_CHECK(cudaMemset(dout.p, 0xff, dout.bytes));
      cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, stream, nullptr, choice, max_ctas);
      LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<uint16_t> off = dout.Download<uint16_t>();
      cuda::SetProgrammaticLaunch(true);
      LLM_CUDA_CHECK(cudaMemsetAsync(dout.p, 0xff, dout.bytes, stream));
      cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, stream, nullptr, choice, max_ctas);
      cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, stream, nullptr, choice, max_ctas);
      LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(off == dout.Download<uint16_t>()) << what << ": not the PDL-off bits";
    }
    cuda::SetProgrammaticLaunch(saved);
    LLM_CUDA_CHECK(cudaStreamDestroy(stream));
  }
  std::vector<uint32_t> counters(cuda::kDecodeMaxCounters);
  LLM_CUDA_CHECK(
      cudaMemcpy(counters.data(), ws.p, cuda::kDecodeCounterBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count_if(counters.begin(), counters.end(), [](uint32_t x) { return x != 0; }), 0)
      << "split arrival counters left non-zero";
}

// Many sequences (32 (sequence, KV head) items per SM, ragged 1 … 200 keys): the warp-item
// kernels at their full grid (12 / 16 warps per SM: each walks 2-3 items, ragged) and the
// automatic choice (DecodeKernel with the transposed step), against the CPU.
TEST(DecodeFp8GpuMany, WarpItemsOverManySequences) {
  std::string why;
  if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 KV decode attention test skipped: " << why;
  const int64_t num_kv_heads = 4, group = 2, num_heads = num_kv_heads * group, hd = 128;
  const int64_t num_seqs = int64_t(cuda::NumSms()) * 8;
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> len(1, 200);
  std::vector<int32_t> num_keys(static_cast<size_t>(num_seqs)),
      context_lens(static_cast<size_t>(num_seqs)), cu(static_cast<size_t>(num_seqs + 1));
  for (int64_t s = 0; s < num_seqs; ++s) {
    num_keys[size_t(s)] = len(rng);
    context_lens[size_t(s)] = num_keys[size_t(s)] - 1;
    cu[size_t(s)] = int32_t(s);
  }
  cu[size_t(num_seqs)] = int32_t(num_seqs);
  const ScaleSet sc = kScaleSets[1];
  const Fp8Pools pools(num_keys, 16, num_kv_heads, hd, sc.sigma, rng);
  std::vector<uint16_t> q16;
  std::vector<float> q32;
  RandomQ(size_t(num_seqs * num_heads * hd), DType::kBF16, rng, &q16, &q32);
  const float scale = 1.f / std::sqrt(float(hd));
  const std::vector<float> ref =
      CpuDecodeFp8(q32, pools, sc, context_lens, cu, num_seqs, num_heads, scale);
  const DeviceProblem dev(q16, pools, context_lens, cu);
  cuda::AttentionParams p = dev.Params(pools, num_seqs, num_heads, scale, DType::kBF16, sc);
  p.max_q_len = 1;
  p.max_num_keys = 200;
  for (const auto choice :
       {cuda::DecodeKernelChoice::kWarpItems, cuda::DecodeKernelChoice::kWarpItemsT,
        cuda::DecodeKernelChoice::kAuto}) {
    LLM_CUDA_CHECK(cudaMemset(dev.out.p, 0xff, dev.out.bytes));
    cuda::DecodeLaunchInfo info;
    cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr, &info, choice);
    const std::string what =
        std::to_string(num_seqs) + " sequences, " +
        (choice == cuda::DecodeKernelChoice::kWarpItemsT  ? "transposed warp-item kernel"
         : choice == cuda::DecodeKernelChoice::kWarpItems ? "warp-item kernel"
                                                          : "automatic choice");
    EXPECT_EQ(info.warp_items, choice != cuda::DecodeKernelChoice::kAuto) << what;
    EXPECT_EQ(info.transposed_step, choice != cuda::DecodeKernelChoice::kWarpItems) << what;
    CheckAttention(dev.out.Download<uint16_t>(), ref, DType::kBF16, cu, num_heads * hd, what);
  }
}

std::vector<DecodeCase> DecodeCases() {
  std::vector<DecodeCase> cases;
  int i = 0;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int hd : {64, 128}) {
      for (int group : {1, 4, 8}) {
        for (int bs : {8, 16, 32}) cases.push_back({t, hd, group, bs, i++ % 3});
      }
    }
  }
  // Odd groups (a lane of the transposed step holds one real head and one padding head), page
  // sizes 1 (16 pages per warp's 16 keys: the page ring's worst case) and 24 (not a power of 2).
  cases.push_back({DType::kBF16, 128, 3, 1, 0});
  cases.push_back({DType::kF16, 128, 5, 24, 1});
  cases.push_back({DType::kBF16, 64, 7, 16, 2});
  cases.push_back({DType::kF16, 128, 6, 1, 2});
  cases.push_back({DType::kBF16, 128, 16, 16, 1});  // the largest group
  cases.push_back({DType::kF16, 64, 16, 32, 2});
  // head_dim 256 (Gemma 3: GQA 2): the transposed step and the original (kCta, group 16).
  cases.push_back({DType::kBF16, 256, 2, 16, 0});
  cases.push_back({DType::kF16, 256, 8, 5, 1});
  cases.push_back({DType::kBF16, 256, 16, 16, 2});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeFp8Gpu, ::testing::ValuesIn(DecodeCases()), DecodeName);

// ---- 2. Prefill ---------------------------------------------------------------------------
struct PrefillCase {
  const char* name;
  DType dtype;
  int head_dim, num_heads, num_kv_heads, block_size, scale_set;
  std::vector<int32_t> q_lens, ctx_lens;
};

std::ostream& operator<<(std::ostream& os, const PrefillCase& c) { return os << c.name; }

class PrefillFp8Gpu : public ::testing::TestWithParam<PrefillCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no GPU, fp8 KV prefill attention test skipped: " << why;
  }
};

TEST_P(PrefillFp8Gpu, RungsMatchCpuFp8Reference) {
  const PrefillCase& c = GetParam();
  const ScaleSet sc = kScaleSets[c.scale_set];
  const int64_t hd = c.head_dim, nh = c.num_heads;
  const int64_t num_seqs = int64_t(c.q_lens.size());
  std::vector<int32_t> cu{0}, num_keys;
  int64_t max_q = 0, max_keys = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    cu.push_back(cu.back() + c.q_lens[size_t(s)]);
    num_keys.push_back(c.ctx_lens[size_t(s)] + c.q_lens[size_t(s)]);
    max_q = std::max<int64_t>(max_q, c.q_lens[size_t(s)]);
    max_keys = std::max<int64_t>(max_keys, num_keys.back());
  }
  std::mt19937 rng(uint32_t(977 + hd + 7 * c.block_size + 31 * nh + c.num_kv_heads));
  const Fp8Pools pools(num_keys, c.block_size, c.num_kv_heads, hd, sc.sigma, rng);
  std::vector<uint16_t> q16;
  std::vector<float> q32;
  RandomQ(size_t(cu.back() * nh * hd), c.dtype, rng, &q16, &q32);
  const float scale = 1.f / std::sqrt(float(hd));
  std::vector<float> ref(q32.size());
  const AttentionBatch host_batch{num_seqs, cu.data(), c.ctx_lens.data(), pools.tables.data(),
                                  pools.max_blocks};
  cpu::PagedPrefillAttention(
      q32.data(), PagedKvView<const uint8_t>{pools.k_cpu.data(), pools.v_cpu.data(), pools.layout},
      cpu::Fp8KvScales{sc.k, sc.v}, host_batch, nh, scale, ref.data());

  const DeviceProblem dev(q16, pools, c.ctx_lens, cu);
  const DevBuf& dout = dev.out;
  cuda::AttentionParams p = dev.Params(pools, num_seqs, nh, scale, c.dtype, sc);
  p.max_q_len = max_q;
  p.max_num_keys = max_keys;

  const bool tiled = hd == 64 || hd == 128;  // every tiled rung (v4 over a copy)
  const bool v3 = tiled || hd == 256;        // v3_mma also takes 256
  EXPECT_EQ(cuda::ResolvePrefillVariant(p),
            v3 ? cuda::PrefillVariant::kMma : cuda::PrefillVariant::kNaive);
  for (auto variant :
       {cuda::PrefillVariant::kNaive, cuda::PrefillVariant::kMma, cuda::PrefillVariant::kBest}) {
    const std::string what = std::string(c.name) + " " + cuda::PrefillVariantName(variant);
    if (variant == cuda::PrefillVariant::kMma && !v3) {
      EXPECT_THROW(cuda::PagedPrefillAttention(p, nullptr, variant), std::invalid_argument) << what;
      continue;
    }
    LLM_CUDA_CHECK(cudaMemset(dout.p, 0xff, dout.bytes));  // NaN in bf16 and fp16
    cuda::PagedPrefillAttention(p, nullptr, variant);
    CheckAttention(dout.Download<uint16_t>(), ref, c.dtype, cu, nh * hd, what);
  }
  // The rungs that do not read e4m3 pools refuse them, whatever the shape (v4 without a
  // scratch for the copy of the pages).
  for (auto variant : {cuda::PrefillVariant::kSmem, cuda::PrefillVariant::kWgmma}) {
    EXPECT_THROW(cuda::PagedPrefillAttention(p, nullptr, variant), std::invalid_argument)
        << c.name << " " << cuda::PrefillVariantName(variant);
  }

  // v4 over an exact bf16 / fp16 copy of the batch's pages (prefill_attention_fp8.cu), with a
  // scratch of exactly the pages the sequences span, poisoned (NaN codes everywhere else).
  const int64_t pages =
      cuda::PrefillPagesNeeded(cu.data(), c.ctx_lens.data(), num_seqs, c.block_size);
  const size_t bytes =
      cuda::PrefillFp8ScratchBytes(pools.layout, c.dtype, num_seqs, pools.max_blocks, pages);
  const DevBuf scratch_buf(bytes);
  LLM_CUDA_CHECK(cudaMemset(scratch_buf.p, 0xff, bytes));
  const cuda::PrefillScratch scratch{scratch_buf.p, bytes, pages};
  const bool v4 = tiled && c.block_size % 8 == 0 && 128 % c.block_size == 0;
  EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kBest, &scratch),
            v4   ? cuda::PrefillVariant::kWgmma
            : v3 ? cuda::PrefillVariant::kMma
                 : cuda::PrefillVariant::kNaive)
      << c.name;
  if (!v4) {
    EXPECT_THROW(cuda::PagedPrefillAttention(p, nullptr, cuda::PrefillVariant::kWgmma, &scratch),
                 std::invalid_argument)
        << c.name;
    return;
  }
  std::vector<uint16_t> first;
  for (auto variant : {cuda::PrefillVariant::kWgmma, cuda::PrefillVariant::kBest}) {
    const std::string what = std::string(c.name) + " " + cuda::PrefillVariantName(variant) +
                             " over a bf16/fp16 copy of the pages";
    // Poisoned again: the second run must copy every page it reads itself, not find the first
    // run's copy (bit-identical results then say the copy and the attention are deterministic).
    LLM_CUDA_CHECK(cudaMemset(scratch_buf.p, 0xff, bytes));
    LLM_CUDA_CHECK(cudaMemset(dout.p, 0xff, dout.bytes));
    cuda::PagedPrefillAttention(p, nullptr, variant, &scratch);
    const std::vector<uint16_t> got = dout.Download<uint16_t>();
    CheckAttention(got, ref, c.dtype, cu, nh * hd, what);
    if (first.empty()) {
      first = got;
    } else {
      EXPECT_EQ(got, first) << what << ": not bit-identical to the first run";
    }
  }
  {
    // An under-stated max_num_keys (1: a copy grid one page wide) still copies every page: the
    // copy kernel's stride loop walks the rest (prefill needs max_num_keys for nothing else).
    cuda::AttentionParams narrow = p;
    narrow.max_num_keys = 1;
    LLM_CUDA_CHECK(cudaMemset(scratch_buf.p, 0xff, bytes));
    LLM_CUDA_CHECK(cudaMemset(dout.p, 0xff, dout.bytes));
    cuda::PagedPrefillAttention(narrow, nullptr, cuda::PrefillVariant::kWgmma, &scratch);
    EXPECT_EQ(dout.Download<uint16_t>(), first)
        << c.name << ": a one-page-wide copy grid differs from the full one";
  }
  // Bytes one page short of the pages claimed, or a misaligned scratch: kBest falls back to
  // v3, kWgmma refuses. (The claimed count itself cannot be checked on the host.)
  for (const cuda::PrefillScratch bad :
       {cuda::PrefillScratch{scratch_buf.p, bytes, pages + 1},
        cuda::PrefillScratch{static_cast<std::byte*>(scratch_buf.p) + 16, bytes - 16, pages}}) {
    EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kBest, &bad),
              cuda::PrefillVariant::kMma)
        << c.name;
    EXPECT_THROW(cuda::PagedPrefillAttention(p, nullptr, cuda::PrefillVariant::kWgmma, &bad),
                 std::invalid_argument)
        << c.name;
  }
}

const std::vector<PrefillCase> kPrefillCases = {
    {"bf16_hd128_g1_bs16", DType::kBF16, 128, 4, 4, 16, 0, {1, 37, 200, 600}, {0, 100, 0, 333}},
    {"bf16_hd128_g4_bs32", DType::kBF16, 128, 8, 2, 32, 1, {513, 77, 1}, {17, 0, 600}},
    {"fp16_hd64_g8_bs8", DType::kF16, 64, 16, 2, 8, 2, {129, 400, 3}, {0, 65, 600}},
    {"fp16_hd128_g4_bs16", DType::kF16, 128, 4, 1, 16, 1, {599, 2}, {0, 1}},
    {"bf16_hd64_g1_bs16", DType::kBF16, 64, 8, 8, 16, 0, {64, 128, 300}, {64, 0, 7}},
    {"bf16_hd128_g4_bs4", DType::kBF16, 128, 8, 2, 4, 2, {100, 250, 1}, {3, 50, 0}},
    {"fp16_hd64_g1_bs32", DType::kF16, 64, 4, 4, 32, 0, {600, 5}, {24, 129}},
    {"fp16_hd128_g8_bs4", DType::kF16, 128, 8, 1, 4, 1, {33, 1, 190}, {250, 0, 5}},
    {"bf16_hd64_g8_bs8", DType::kBF16, 64, 8, 1, 8, 1, {190, 1, 17}, {250, 0, 16}},
    {"fp16_hd128_g1_bs32", DType::kF16, 128, 2, 2, 32, 2, {300, 64}, {300, 1}},
    {"bf16_hd32_g2_bs16", DType::kBF16, 32, 8, 4, 16, 1, {37, 1, 90}, {5, 20, 33}},  // kNaive
    {"fp16_hd8_g4_bs8", DType::kF16, 8, 8, 2, 8, 2, {37, 1}, {5, 20}},               // kNaive
    // head_dim 256 (Gemma 3): v3 dequantizing its 32-key tiles; v4 refuses it.
    {"bf16_hd256_g2_bs16", DType::kBF16, 256, 4, 2, 16, 0, {1, 37, 200}, {0, 100, 333}},
    {"fp16_hd256_g8_bs5", DType::kF16, 256, 8, 1, 5, 1, {77, 1}, {40, 0}},
};

INSTANTIATE_TEST_SUITE_P(Shapes, PrefillFp8Gpu, ::testing::ValuesIn(kPrefillCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace llm::test::kv_fp8
