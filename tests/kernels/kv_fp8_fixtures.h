// Shared fixtures of the FP8 (e4m3) KV cache GPU tests: kv_fp8_attention_gpu_test.cc (decode and
// prefill attention over e4m3 pools) and kv_fp8_append_gpu_test.cc (AppendKv, RopeAppendKv, the
// GEMV kRopeAppendKv epilogue, unsupported combinations). The e4m3 NaN poison codes, dtype bit
// conversions, the per-tensor scale sets, random code-domain K/V in ragged paged pools
// (Fp8Pools), one attention problem on the device (DeviceProblem), random q rounded to the
// dtype, the per-sequence attention bound (CheckAttention; the tolerance is derived in
// kv_fp8_attention_gpu_test.cc) and the no-GPU check. Header-only: each test executable
// includes it.
//   ninja -C build kv_fp8_attention_gpu_test kv_fp8_append_gpu_test &&
//     (cd build && ctest -L gpu -R kv_fp8)
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "kernels/paged_kv.h"
#include "tests/kernels/dev_buf.h"

namespace llm::test::kv_fp8 {

inline constexpr uint8_t kNanK = 0x7f;  // e4m3 NaN codes: the poison of pool slots nobody owns
inline constexpr uint8_t kNanV = 0xff;

inline uint16_t ToBits(float x, DType t) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
inline float FromBits(uint16_t h, DType t) {
  return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
}
inline const char* Name(DType t) { return t == DType::kBF16 ? "bf16" : "f16"; }
inline float AttentionTol(DType t) { return t == DType::kBF16 ? 2e-2f : 4e-3f; }

// Per-tensor scales and the code-domain spread of the random K/V codes.
struct ScaleSet {
  float k, v, sigma;
};
inline constexpr ScaleSet kScaleSets[] = {{1.f, 1.f, 1.f}, {0.5f, 2.f, 2.f}, {0.37f, 0.7f, 3.f}};

// One random code: normal(0, σ) in the code domain; with probability outlier_rate a magnitude
// in [100, 460] (>= 448 saturates to 0x7e / 0xfe).
inline uint8_t RandomCode(std::mt19937& rng, float sigma, float outlier_rate) {
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
inline void RandomQ(size_t n, DType t, std::mt19937& rng, std::vector<uint16_t>* bits,
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
inline float CheckAttention(const std::vector<uint16_t>& got, const std::vector<float>& ref,
                            DType t, const std::vector<int32_t>& cu, int64_t row_elems,
                            const std::string& what) {
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

inline bool NoGpu(std::string* why) { return !cuda::DeviceAvailable(why); }

}  // namespace llm::test::kv_fp8
