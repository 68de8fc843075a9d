// The mixture-of-experts combine's per-token sum (kernels/cuda/moe/moe.h: MoeCombine), shared by
// MoeCombineKernel (moe.cu) and the RMSNorm that adds it to the residual itself
// (model_ops.h: MoeCombineRmsNorm), so that both give the same sums bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/moe/moe.h"

namespace llm::cuda::moe_detail {

// Token t's top_k rows of the down projection's fp32 output, in ascending expert order (as
// cpu::MoeCombine sums them), with their routing weights: staged in shared memory by the CTA
// (CombineSource::Token), read by every thread.
struct CombineToken {
  const float* rows;
  const int* row_of;  // [top_k] shared: the rows by ascending expert
  const float* w;     // [top_k] shared: their weights
  int top_k;
  int64_t hidden;

  // out[i] = Σ_j w_j · row_j[off + i] over the token's experts in ascending order, each step
  // one fused multiply-add from 0 (written out: no contraction choice left to the compiler).
  // Up to kBatch rows' loads are issued before their multiply-adds: one memory latency per
  // kBatch experts, not one per expert (the loop as first written, a load and its FMA per
  // expert, took 5.7 us a layer of Qwen3-30B-A3B at batch 1 on the H100).
  template <int N>
  __device__ __forceinline__ void Sum(int64_t off, float (&out)[N]) const {
    constexpr int kBatch = 8;
    constexpr int kQuads = N % 4 == 0 ? N / 4 : 0;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = 0.f;
    for (int j0 = 0; j0 < top_k; j0 += kBatch) {
      if constexpr (kQuads > 0) {
        float4 v[kBatch][kQuads];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (j0 + b < top_k) {
            const float* p = rows + int64_t(row_of[j0 + b]) * hidden + off;
#pragma unroll
            for (int q = 0; q < kQuads; ++q) v[b][q] = reinterpret_cast<const float4*>(p)[q];
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (j0 + b < top_k) {
            const float wb = w[j0 + b];
#pragma unroll
            for (int q = 0; q < kQuads; ++q) {
              out[4 * q] = __fmaf_rn(v[b][q].x, wb, out[4 * q]);
              out[4 * q + 1] = __fmaf_rn(v[b][q].y, wb, out[4 * q + 1]);
              out[4 * q + 2] = __fmaf_rn(v[b][q].z, wb, out[4 * q + 2]);
              out[4 * q + 3] = __fmaf_rn(v[b][q].w, wb, out[4 * q + 3]);
            }
          }
        }
      } else {
        float v[kBatch][N];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (j0 + b < top_k) {
            const float* p = rows + int64_t(row_of[j0 + b]) * hidden + off;
#pragma unroll
            for (int i = 0; i < N; ++i) v[b][i] = p[i];
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (j0 + b < top_k) {
#pragma unroll
            for (int i = 0; i < N; ++i) out[i] = __fmaf_rn(v[b][i], w[j0 + b], out[i]);
          }
        }
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
  // Every thread of the CTA calls it (it ends in a barrier): warp 0's lane j ranks slot j of
  // token t by expert, equal experts by slot (a stable sort, as the insertion sort before it;
  // the routing never repeats one), and stages its row and weight.
  __device__ __forceinline__ CombineToken Token(int64_t t) const {
    __shared__ int row_of[kMoeMaxTopK];
    __shared__ float w[kMoeMaxTopK];
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      const int64_t p = t * top_k + lane;
      const int e = lane < top_k ? experts[p] : 1 << 30;
      int rank = 0;
#pragma unroll
      for (int i = 0; i < kMoeMaxTopK; ++i) {
        const int ei = __shfl_sync(0xffffffffu, e, i);
        rank += ei < e || (ei == e && i < lane);
      }
      if (lane < top_k) {
        row_of[rank] = pair_rows[p];
        w[rank] = weights[p];
      }
    }
    __syncthreads();
    return {rows, row_of, w, top_k, hidden};
  }
};

inline CombineSource CombineSourceOf(const float* rows, const MoeRouting& r, int top_k,
                                     int64_t hidden) {
  return {rows, r.experts, r.weights, r.pair_rows, top_k, hidden};
}

}  // namespace llm::cuda::moe_detail
