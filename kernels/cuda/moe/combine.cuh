// The mixture-of-experts combine's per-token sum (kernels/cuda/moe/moe.h: MoeCombine), shared by
// MoeCombineKernel (moe.cu) and the RMSNorm that adds it to the residual itself
// (model_ops.h: MoeCombineRmsNorm), so that both give the same sums bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/moe/moe.h"

namespace llm::cuda::moe_detail {

// Token t's top_k rows of the down projection's fp32 output, in ascending expert order (as
// cpu::MoeCombine sums them), with their routing weights.
struct CombineToken {
  const float* src[kMoeMaxTopK];
  float w[kMoeMaxTopK];
  int top_k;

  // out[i] = Σ_j w_j · src_j[off + i] over the token's experts in ascending order, each step
  // one fused multiply-add from 0 (written out: no contraction choice left to the compiler).
  template <int N>
  __device__ __forceinline__ void Sum(int64_t off, float (&out)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const float* p = src[j] + off;
      if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(p + i);
          out[i] = __fmaf_rn(v.x, w[j], out[i]);
          out[i + 1] = __fmaf_rn(v.y, w[j], out[i + 1]);
          out[i + 2] = __fmaf_rn(v.z, w[j], out[i + 2]);
          out[i + 3] = __fmaf_rn(v.w, w[j], out[i + 3]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = __fmaf_rn(p[i], w[j], out[i]);
      }
    }
  }
};

// What MoeCombine reads: rows fp32 [P, hidden] (the down projection's output, row = pair_rows
// of a pair), each pair's expert and weight (MoeRouting).
struct CombineSource {
  const float* rows;
  const int32_t* experts;
  const float* weights;
  const int32_t* pair_rows;
  int top_k;
  int64_t hidden;

  __device__ __forceinline__ bool present() const { return true; }  // (AddRmsNormKernel's delta)
  __device__ __forceinline__ CombineToken Token(int64_t t) const {
    CombineToken c;
    c.top_k = top_k;
    // The token's slots by ascending expert (insertion sort; every thread the same).
    int order[kMoeMaxTopK];
    int chosen[kMoeMaxTopK];
    for (int j = 0; j < top_k; ++j) chosen[j] = experts[t * top_k + j];
    for (int j = 0; j < top_k; ++j) {
      int i = j;
      while (i > 0 && chosen[order[i - 1]] > chosen[j]) {
        order[i] = order[i - 1];
        --i;
      }
      order[i] = j;
    }
    for (int j = 0; j < top_k; ++j) {
      const int64_t p = t * top_k + order[j];
      c.src[j] = rows + int64_t(pair_rows[p]) * hidden;
      c.w[j] = weights[p];
    }
    return c;
  }
};

inline CombineSource CombineSourceOf(const float* rows, const MoeRouting& r, int top_k,
                                     int64_t hidden) {
  return {rows, r.experts, r.weights, r.pair_rows, top_k, hidden};
}

}  // namespace llm::cuda::moe_detail
