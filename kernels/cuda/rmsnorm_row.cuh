// One row of AddRmsNorm as a CTA-wide device function, shared by the AddRmsNorm kernel
// (model_ops.cu) and the GEMV that computes the next layer's RMSNorm in its last CTA (gemv.cu),
// so both produce bit-identical results: the same thread-to-chunk mapping, the same fixed
// reduction order, the same operation order as the CPU twin (cpu::RmsNorm).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/vec.cuh"

namespace llm::cuda::norm {

using vec::kVec;
using vec::Load;
using vec::LoadF32;
using vec::Store;
using vec::StoreF32;

constexpr int kNormThreads = 256;
constexpr int kNormCached = 4;  // register-cached chunks per thread: 8192 elements at kVec 8

// Sum over the CTA (kNormThreads threads), result in every thread. Fixed order: deterministic.
// Ends with a barrier, so that it can be called again right away.
__device__ __forceinline__ float NormBlockSum(float v) {
  __shared__ float warp_sums[kNormThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
  __syncthreads();
  return total;
}

// The residual row, through L1 or (L2Only) from L2: a reader in the same grid as the writers
// (the GEMV's last CTA) must not see a line its SM cached before the other CTAs' writes.
template <int N, bool L2Only>
__device__ __forceinline__ void LoadResidual(const float* p, float (&x)[N]) {
  if constexpr (!L2Only) {
    LoadF32<N>(p, x);
  } else if constexpr (N == kVec) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(p) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = __ldcg(p + i);
  }
}

// res fp32 [hidden] (+= del when del != null, written back); dst = weight * (res * inv_rms)
// rounded to T. Called by all kNormThreads threads of a CTA. N: kVec (16-byte aligned rows,
// hidden % 8 == 0) or 1.
template <typename T, int N, bool L2Only = false>
__device__ __forceinline__ void AddRmsNormRow(float* res, const T* del, const float* weight, T* dst,
                                              int64_t hidden, float eps) {
  const int64_t num_chunks = hidden / N;
  float cache[kNormCached][N];
  float sum_sq = 0.f;
  // Pass 1: residual += delta (written back), sum of squares; chunk c = threadIdx + j·threads.
  int64_t c = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kNormCached; ++j, c += kNormThreads) {
    if (c < num_chunks) {
      LoadResidual<N, L2Only>(res + c * N, cache[j]);
      if (del) {
        float d[N];
        Load<T, N>(del + c * N, d);
#pragma unroll
        for (int i = 0; i < N; ++i) cache[j][i] += d[i];
        StoreF32<N>(res + c * N, cache[j]);
      }
#pragma unroll
      for (int i = 0; i < N; ++i) sum_sq += cache[j][i] * cache[j][i];
    }
  }
  for (; c < num_chunks; c += kNormThreads) {  // rows longer than the register cache
    float x[N];
    LoadResidual<N, L2Only>(res + c * N, x);
    if (del) {
      float d[N];
      Load<T, N>(del + c * N, d);
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] += d[i];
      StoreF32<N>(res + c * N, x);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) sum_sq += x[i] * x[i];
  }
  // 1 / sqrt (IEEE sqrt and division, as the CPU twin), not rsqrtf: costs nothing once per row.
  const float inv_rms = 1.f / sqrtf(NormBlockSum(sum_sq) / static_cast<float>(hidden) + eps);
  // Pass 2: out = weight * (x * inv_rms), the CPU twin's operation order. A thread re-reads
  // only residual chunks it wrote itself, so no barrier is needed between the passes.
  c = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kNormCached; ++j, c += kNormThreads) {
    if (c < num_chunks) {
      float w[N], y[N];
      LoadF32<N>(weight + c * N, w);
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = w[i] * (cache[j][i] * inv_rms);
      Store<T, N>(dst + c * N, y);
    }
  }
  for (; c < num_chunks; c += kNormThreads) {
    float x[N], w[N];
    LoadResidual<N, L2Only>(res + c * N, x);
    LoadF32<N>(weight + c * N, w);
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = w[i] * (x[i] * inv_rms);
    Store<T, N>(dst + c * N, x);
  }
}

}  // namespace llm::cuda::norm
