// FP8 (e4m3) rows with dynamic per-row scales: the row quantizer the element-wise ops share
// (model_ops.cu's AddRmsNormE4m3, fp8_rows.cu's QuantizeRowsE4m3 and SiluMulE4m3). Device code;
// include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/ops/ops_common.cuh"
#include "kernels/fp8.h"

namespace llm::cuda::ops_detail {

// ---- FP8 rows (dynamic per-row scales) ------------------------------------------------------
// One CTA of kQuantThreads per row. A source functor yields chunk c (N values, fp32) of the row;
// the first kQuantCached chunks of each thread stay in registers between the max pass and the
// code pass (16,384 elements at N = 8: every Llama hidden and intermediate size), the rest are
// produced again. scale = max|v| / 448 (1 for an all-zero row), code = F32ToE4m3(v / scale):
// cpu::QuantizeFp8Rows's rule, bit for bit (the IEEE quotient through ops_common.cuh's
// E4m3Divisor, the code through the hardware conversion; fmaxf ignores NaN, as std::max there
// does not matter: a non-finite row is an error for weights).
constexpr int kQuantThreads = 256;
constexpr int kQuantCached = 8;

// Max over the CTA (kThreads threads), result in every thread.
template <int kThreads = kQuantThreads>
__device__ __forceinline__ float QuantBlockMax(float v) {
  __shared__ float warp_max[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  float m = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  return m;
}

// The first kCached chunks a thread handles (c = first + j·stride), into cache, with their
// max |v| and whether any is not finite. A source with kSplit (Fetch(c, raw) loads, Make(raw, x)
// computes) has every chunk's loads issued before any math: the loads of a row overlap instead
// of waiting on each chunk's math in turn (bench/fp8_rows_gpu.cu: SiluMulE4m3 22.6 -> 20.4 us at
// 512 x 14,336 on the H100); a plain source is called chunk by chunk.
template <int N, int kCached, typename Src>
__device__ __forceinline__ void ProduceCached(const Src& src, int64_t num_chunks, int64_t first,
                                              int64_t stride, float (&cache)[kCached][N],
                                              float& amax, bool& bad) {
  auto account = [&](const float(&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      amax = fmaxf(amax, fabsf(x[i]));
      bad |= !isfinite(x[i]);
    }
  };
  if constexpr (Src::kSplit) {
    typename Src::Raw raw[kCached];
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      if (first + j * stride < num_chunks) src.Fetch(first + j * stride, raw[j]);
    }
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      if (first + j * stride < num_chunks) {
        src.Make(raw[j], cache[j]);
        account(cache[j]);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kCached; ++j) {
      if (first + j * stride < num_chunks) {
        src(first + j * stride, cache[j]);
        account(cache[j]);
      }
    }
  }
}

// Quantizes the row `src` yields (num_chunks chunks of N) into codes [num_chunks * N] and
// *scale_out. nonfinite (may be null; uniform over the CTA): incremented when the row holds a
// NaN or an infinity.
template <int N, typename Src>
__device__ __forceinline__ void QuantizeRow(const Src& src, int64_t num_chunks,
                                            uint8_t* __restrict__ codes, float* scale_out,
                                            int* nonfinite) {
  float cache[kQuantCached][N];
  float amax = 0.f;
  bool bad = false;
  ProduceCached<N, kQuantCached>(src, num_chunks, threadIdx.x, kQuantThreads, cache, amax, bad);
  int64_t c = threadIdx.x + int64_t(kQuantCached) * kQuantThreads;
  for (; c < num_chunks; c += kQuantThreads) {
    float x[N];
    src(c, x);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      amax = fmaxf(amax, fabsf(x[i]));
      bad |= !isfinite(x[i]);
    }
  }
  if (nonfinite != nullptr && __syncthreads_or(bad) && threadIdx.x == 0) atomicAdd(nonfinite, 1);
  amax = QuantBlockMax<>(amax);
  const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
  if (threadIdx.x == 0) *scale_out = scale;
  const E4m3Divisor div(scale);
  c = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kQuantCached; ++j, c += kQuantThreads) {
    if (c < num_chunks) StoreE4m3<N>(codes + c * N, cache[j], div);
  }
  for (; c < num_chunks; c += kQuantThreads) {
    float x[N];
    src(c, x);
    StoreE4m3<N>(codes + c * N, x, div);
  }
}

// QuantizeRow by one warp (the same codes and scale: the max is exact in any order): for rows
// of at most kQuantWarpChunks chunks, all held in registers, and no CTA barrier, so that a CTA
// quantizes kQuantThreads / 32 rows. One CTA per row of 768 values (Qwen3-30B-A3B's experts'
// activations in a 4,096-token prefill: 32,768 rows) kept 96 of 256 threads busy and paid two
// barriers per row: 387 us a layer on the H100, against 69 for SiluMul in bf16.
constexpr int kQuantWarpChunks = 32 * kQuantCached;

template <int N, typename Src>
__device__ __forceinline__ void QuantizeRowWarp(const Src& src, int64_t num_chunks,
                                                uint8_t* __restrict__ codes, float* scale_out,
                                                int* nonfinite) {
  const int lane = int(threadIdx.x % 32);
  float cache[kQuantCached][N];
  float amax = 0.f;
  bool bad = false;
  ProduceCached<N, kQuantCached>(src, num_chunks, lane, 32, cache, amax, bad);
  if (nonfinite != nullptr && __any_sync(0xffffffffu, bad) && lane == 0) atomicAdd(nonfinite, 1);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
  if (lane == 0) *scale_out = scale;
  const E4m3Divisor div(scale);
#pragma unroll
  for (int j = 0; j < kQuantCached; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < num_chunks) StoreE4m3<N>(codes + c * N, cache[j], div);
  }
}

}  // namespace llm::cuda::ops_detail
