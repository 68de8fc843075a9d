// The FP8 (e4m3) KV cache on the GPU (kernels/cuda/attention/attention.h: KvCacheFormat; kernels/fp8.h)
// against its CPU specification (label gpu; every test skips without a GPU, except the host-only
// variant resolution check):
//   DecodeFp8Gpu        PagedDecodeAttention over e4m3 pools vs cpu::PagedDecodeAttention (fp8):
//                       the CTA kernel (splits 1, auto, 16) and the warp-item kernel (grid caps)
//   DecodeFp8GpuMany    many ragged sequences: the warp-item kernel, the automatic choice
//   PrefillFp8Gpu       PagedPrefillAttention kNaive / kMma / kBest vs cpu::PagedPrefillAttention,
//                       and kWgmma / kBest over a copy of the pages (PrefillScratch)
//   AppendKvFp8Gpu      AppendKv codes bit-exact vs F32ToE4m3(float(x) / scale) and cpu::AppendKv
//   RopeAppendKvFp8Gpu  RopeAppendKv(fp8) vs the same kernel writing a bf16 / fp16 cache
//   GemvRopeFp8Gpu      the kRopeAppendKv GEMV epilogue vs kStore + RopeAppendKv(fp8), bit for bit
//   KvFp8GpuArgs        unsupported combinations throw std::invalid_argument
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
//   ninja -C build kv_fp8_gpu_test && (cd build && ctest -L gpu -R kv_fp8)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "kernels/paged_kv.h"
#include "tests/kernels/dev_buf.h"

namespace llm {
namespace {

constexpr uint8_t kNanK = 0x7f;  // e4m3 NaN codes: the poison of pool slots nobody owns
constexpr uint8_t kNanV = 0xff;

uint16_t ToBits(float x, DType t) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
float FromBits(uint16_t h, DType t) { return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h); }
const char* Name(DType t) { return t == DType::kBF16 ? "bf16" : "f16"; }
float AttentionTol(DType t) { return t == DType::kBF16 ? 2e-2f : 4e-3f; }

using test::DevBuf;

// Per-tensor scales and the code-domain spread of the random K/V codes.
struct ScaleSet {
  float k, v, sigma;
};
constexpr ScaleSet kScaleSets[] = {{1.f, 1.f, 1.f}, {0.5f, 2.f, 2.f}, {0.37f, 0.7f, 3.f}};

// One random code: normal(0, σ) in the code domain; with probability outlier_rate a magnitude
// in [100, 460] (>= 448 saturates to 0x7e / 0xfe).
uint8_t RandomCode(std::mt19937& rng, float sigma, float outlier_rate) {
  std::normal_distribution<float> normal(0.f, sigma);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  if (outlier_rate > 0 && u01(rng) < outlier_rate) {
    const float mag = 100.f + 360.f * u01(rng);
    return F32ToE4m3(u01(rng) < 0.5f ? -mag : mag);
  }
  return F32ToE4m3(normal(rng));
}

// Paged e4m3 pools for a ragged batch: sequence i owns num_keys[i] keys through a shuffled
// block table; 5 spare blocks belong to nobody. GPU pools hold NaN codes where nobody owns a
// slot, CPU pools zeros. Every third sequence (i % 3 == 1) has outliers in K and V.
struct Fp8Pools {
  PagedKvLayout layout;
  int64_t max_blocks = 0;
  std::vector<int32_t> tables;  // [num_seqs, max_blocks], -1 past the end
  std::vector<uint8_t> k_gpu, v_gpu, k_cpu, v_cpu;

  Fp8Pools(const std::vector<int32_t>& num_keys, int64_t bs, int64_t num_kv_heads, int64_t hd,
           float sigma, std::mt19937& rng) {
    const int64_t num_seqs = int64_t(num_keys.size());
    int64_t used_blocks = 0;
    for (int32_t n : num_keys) {
      max_blocks = std::max<int64_t>(max_blocks, (n + bs - 1) / bs);
      used_blocks += (n + bs - 1) / bs;
    }
    layout = PagedKvLayout{used_blocks + 5, bs, num_kv_heads, hd};
    std::vector<int32_t> perm(size_t(layout.num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables.assign(size_t(num_seqs * max_blocks), -1);
    const size_t n = size_t(layout.pool_elements());
    k_gpu.assign(n, kNanK);
    v_gpu.assign(n, kNanV);
    k_cpu.assign(n, 0);
    v_cpu.assign(n, 0);
    int64_t next = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const float outliers = s % 3 == 1 ? 2e-3f : 0.f;
      for (int64_t b = 0; b < (num_keys[s] + bs - 1) / bs; ++b) {
        tables[size_t(s * max_blocks + b)] = perm[size_t(next++)];
      }
      for (int64_t pos = 0; pos < num_keys[s]; ++pos) {
        const int64_t block = tables[size_t(s * max_blocks + pos / bs)];
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          const int64_t off = layout.Offset(block, h, pos % bs);
          for (int64_t d = 0; d < hd; ++d) {
            k_gpu[off + d] = k_cpu[off + d] = RandomCode(rng, sigma, outliers);
            v_gpu[off + d] = v_cpu[off + d] = RandomCode(rng, sigma, outliers);
          }
        }
      }
    }
  }
};

// One attention problem on the device: q, the output, the fp8 pools, the block tables and the
// batch arrays, and the parameter block over them (the caller adds max_q_len, max_num_keys).
struct DeviceProblem {
  DevBuf q, out, k, v, tables, ctx, cu;
  DeviceProblem(const std::vector<uint16_t>& q16, const Fp8Pools& pools,
                const std::vector<int32_t>& context_lens, const std::vector<int32_t>& cu_seqlens)
      : q(q16),
        out(q16.size() * 2),
        k(pools.k_gpu),
        v(pools.v_gpu),
        tables(pools.tables),
        ctx(context_lens),
        cu(cu_seqlens) {}
  cuda::AttentionParams Params(const Fp8Pools& pools, int64_t num_seqs, int64_t num_heads,
                               float scale, DType dtype, const ScaleSet& sc) const {
    cuda::AttentionParams p;
    p.q = q.p;
    p.out = out.p;
    p.kv = PagedKvView<const void>{k.p, v.p, pools.layout};
    p.batch = AttentionBatch{num_seqs, cu.as<int32_t>(), ctx.as<int32_t>(), tables.as<int32_t>(),
                             pools.max_blocks};
    p.num_heads = num_heads;
    p.scale = scale;
    p.dtype = dtype;
    p.kv_format = cuda::KvCacheFormat{true, sc.k, sc.v};
    return p;
  }
};

// q [num_tokens · num_heads · head_dim] ~ normal(0, 1.5) rounded to the dtype: bits for the GPU,
// the same values as floats for the CPU.
void RandomQ(size_t n, DType t, std::mt19937& rng, std::vector<uint16_t>* bits,
             std::vector<float>* vals) {
  std::normal_distribution<float> normal(0.f, 1.5f);
  bits->resize(n);
  vals->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*bits)[i] = ToBits(normal(rng), t);
    (*vals)[i] = FromBits((*bits)[i], t);
  }
}

// The attention bound of the header: no NaN, and per sequence (token rows
// [cu[s], cu[s + 1])) max |got − ref| ≤ tol · max |ref|. Returns the worst err / max|ref| ratio.
float CheckAttention(const std::vector<uint16_t>& got, const std::vector<float>& ref, DType t,
                     const std::vector<int32_t>& cu, int64_t row_elems, const std::string& what) {
  const float tol = AttentionTol(t);
  float worst_ratio = 0.f, global_err = 0.f, global_ref = 0.f;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    float err = 0.f, max_ref = 0.f;
    int64_t worst = -1;
    for (int64_t i = cu[s] * row_elems; i < cu[s + 1] * row_elems; ++i) {
      const float g = FromBits(got[size_t(i)], t);
      if (std::isnan(g)) {
        ADD_FAILURE() << what << ": NaN at sequence " << s << ", token " << i / row_elems
                      << ", element " << i % row_elems;
        return INFINITY;
      }
      max_ref = std::max(max_ref, std::fabs(ref[size_t(i)]));
      const float e = std::fabs(g - ref[size_t(i)]);
      if (e > err) {
        err = e;
        worst = i;
      }
    }
    EXPECT_LE(err, tol * max_ref) << what << ": sequence " << s << ", worst token "
                                  << worst / row_elems << " element " << worst % row_elems
                                  << " got " << FromBits(got[size_t(worst)], t) << " ref "
                                  << ref[size_t(worst)] << ", max|ref| " << max_ref;
    if (max_ref > 0) worst_ratio = std::max(worst_ratio, err / max_ref);
    global_err = std::max(global_err, err);
    global_ref = std::max(global_ref, max_ref);
  }
  std::printf("  %-44s max err %.3e = %.2e of max|ref| %.3f; worst sequence %.2e (tol %.0e)\n",
              what.c_str(), global_err, global_err / global_ref, global_ref, worst_ratio, tol);
  return worst_ratio;
}

bool NoGpu(std::string* why) { return !cuda::DeviceAvailable(why); }

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
                                const std::vector<int32_t>& cu, int64_t num_seqs,
                                int64_t num_heads, float scale) {
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
  for (const auto choice :
       {cuda::DecodeKernelChoice::kWarpItems, cuda::DecodeKernelChoice::kWarpItemsT}) {
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
    for (const auto choice : {cuda::DecodeKernelChoice::kAuto,
                              cuda::DecodeKernelChoice::kWarpItemsT}) {
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
  for (const auto choice : {cuda::DecodeKernelChoice::kWarpItems,
                            cuda::DecodeKernelChoice::kWarpItemsT,
                            cuda::DecodeKernelChoice::kAuto}) {
    LLM_CUDA_CHECK(cudaMemset(dev.out.p, 0xff, dev.out.bytes));
    cuda::DecodeLaunchInfo info;
    cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr, &info, choice);
    const std::string what =
        std::to_string(num_seqs) + " sequences, " +
        (choice == cuda::DecodeKernelChoice::kWarpItemsT ? "transposed warp-item kernel"
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

  const bool tiled = hd == 64 || hd == 128;
  EXPECT_EQ(cuda::ResolvePrefillVariant(p),
            tiled ? cuda::PrefillVariant::kMma : cuda::PrefillVariant::kNaive);
  for (auto variant :
       {cuda::PrefillVariant::kNaive, cuda::PrefillVariant::kMma, cuda::PrefillVariant::kBest}) {
    const std::string what = std::string(c.name) + " " + cuda::PrefillVariantName(variant);
    if (variant == cuda::PrefillVariant::kMma && !tiled) {
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
  const size_t bytes = cuda::PrefillFp8ScratchBytes(pools.layout, c.dtype, num_seqs,
                                                    pools.max_blocks, pages);
  const DevBuf scratch_buf(bytes);
  LLM_CUDA_CHECK(cudaMemset(scratch_buf.p, 0xff, bytes));
  const cuda::PrefillScratch scratch{scratch_buf.p, bytes, pages};
  const bool v4 = tiled && c.block_size % 8 == 0 && 128 % c.block_size == 0;
  EXPECT_EQ(cuda::ResolvePrefillVariant(p, cuda::PrefillVariant::kBest, &scratch),
            v4 ? cuda::PrefillVariant::kWgmma
               : tiled ? cuda::PrefillVariant::kMma : cuda::PrefillVariant::kNaive)
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
};

INSTANTIATE_TEST_SUITE_P(Shapes, PrefillFp8Gpu, ::testing::ValuesIn(kPrefillCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- 3. AppendKv --------------------------------------------------------------------------
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

// ---- 4. RopeAppendKv ----------------------------------------------------------------------
struct RopeCase {
  DType dtype;
  int head_dim, num_heads, num_kv_heads, block_size;
  float k_scale, v_scale;
};

std::string RopeName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  return std::string(Name(c.dtype)) + "_hd" + std::to_string(c.head_dim) + "_h" +
         std::to_string(c.num_heads) + "_kv" + std::to_string(c.num_kv_heads) + "_bs" +
         std::to_string(c.block_size) + "_" + std::to_string(info.index);
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
  DevBuf dqkv(qkv_bits), dpos(positions), dslots(slots), dfreq(inv_freq);
  DevBuf dq16(std::vector<uint16_t>(nq, nan16)), dq8(std::vector<uint16_t>(nq, nan16));
  DevBuf dk16(std::vector<uint16_t>(pool, nan16)), dv16(std::vector<uint16_t>(pool, nan16));
  DevBuf dk8(std::vector<uint8_t>(pool, kNanK)), dv8(std::vector<uint8_t>(pool, kNanV));
  cuda::RopeAppendKv(dqkv.p, dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(),
                     num_tokens, nh, nkv, hd, PagedKvView<void>{dk16.p, dv16.p, layout}, t, dq16.p,
                     nullptr);
  cuda::RopeAppendKv(dqkv.p, dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(),
                     num_tokens, nh, nkv, hd, PagedKvView<void>{dk8.p, dv8.p, layout}, t, dq8.p,
                     nullptr, cuda::KvCacheFormat{true, c.k_scale, c.v_scale});
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
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeAppendKvFp8Gpu, ::testing::ValuesIn(RopeCases()), RopeName);

// ---- 5. GEMV kRopeAppendKv ----------------------------------------------------------------
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

// ---- 6. Unsupported combinations ----------------------------------------------------------
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
  p.kv.layout.head_dim = 160;
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
}  // namespace llm
