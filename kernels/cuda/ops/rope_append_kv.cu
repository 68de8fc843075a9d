// RopeAppendKv (interface: kernels/cuda/ops/model_ops.h): q and k rotated (rotate-half RoPE,
// after the optional QkvPrologue: biases, Qwen3's per-head norms), q into q_out, k and v appended
// to the paged cache (bf16 / fp16, or e4m3 codes). CPU twins: cpu::AddBias, cpu::RmsNorm,
// cpu::ApplyRope (kernels/cpu/ops.h), cpu::AppendKv (kernels/cpu/flash_attention.h).
//  - RopeAppendKvKernel: one CTA per token. cos/sin of the token's angles are computed once into
//    shared memory (fp32 angle = float(position) * inv_freq[i], sincosf: accurate, not the
//    fast-math intrinsics), the heads' norms by its warps in turn, then threads stride over
//    (head, pair-chunk) work items: q heads rotated into q_out, k heads into the cache slot, v
//    heads copied to it.
//  - RopeAppendKvHeadsKernel (QkvPrologue::head_warps): a warp per head.
// Test:  ninja -C build model_ops_gpu_test && (cd build && ctest -L gpu -R model_ops)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/cuda/ops/ops_common.cuh"
#include "kernels/fp8.h"

namespace llm::cuda {
namespace {

using ops_detail::Aligned16;
using ops_detail::CheckDType;
using ops_detail::StoreE4m3;
using vec::kVec;
using vec::Load;
using vec::Store;

// ---- RopeAppendKv -------------------------------------------------------------------------
// 256: a batch-1 step runs one CTA, whose warps take the q/k heads' norms (Qwen3) one after
// another (128 threads: 10 us per layer for Qwen3-30B-A3B's 36 heads on the H200).
constexpr int kRopeThreads = 256;
constexpr int kMaxHeadDim = 512;
constexpr int kMaxNormedHeads = 512;  // q + k heads of one token with a QkvPrologue norm

// qkv T [num_tokens, (num_heads + 2 num_kv_heads) * head_dim]; q_out T [num_tokens, num_heads,
// head_dim]; kc / vc: the pools. One CTA per token. A work item is N consecutive dims
// [i, i + N) of the first half of a head together with [i + half, i + half + N) (the rotate-half
// partners), or for v heads two such plain chunks.
// kFp8: the pools hold e4m3 codes (KvCacheFormat): the rotated k is quantized from fp32, the v
// from its dtype value, both as F32ToE4m3(x / scale).
template <typename T, int N, bool kFp8>
__global__ void __launch_bounds__(kRopeThreads)
    RopeAppendKvKernel(const T* __restrict__ qkv, const int32_t* __restrict__ positions,
                       const int64_t* __restrict__ slot_mapping, const float* __restrict__ inv_freq,
                       int num_heads, int num_kv_heads, int head_dim, PagedKvLayout layout,
                       void* __restrict__ kc, void* __restrict__ vc, T* __restrict__ q_out,
                       KvCacheFormat format, QkvPrologue pre) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  __shared__ float inv_rms_s[kMaxNormedHeads];
  const int64_t t = blockIdx.x;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += kRopeThreads) {
    sincosf(pos * inv_freq[i], &sin_s[i], &cos_s[i]);
  }
  const int64_t slot = slot_mapping[t];
  const T* src_row = qkv + t * int64_t(num_heads + 2 * num_kv_heads) * head_dim;
  // Per-head RMSNorm (Qwen3): one warp per q / k head sums the squares of its biased row in a
  // fixed order (deterministic: graph replays are bit-identical).
  if (pre.q_norm != nullptr) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int head = warp; head < num_heads + num_kv_heads; head += kRopeThreads / 32) {
      float sum = 0.f;
      for (int i = lane; i < head_dim; i += 32) {
        float x = static_cast<float>(src_row[int64_t(head) * head_dim + i]);
        if (pre.bias != nullptr) x += pre.bias[head * head_dim + i];
        sum += x * x;
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) inv_rms_s[head] = rsqrtf(sum / float(head_dim) + pre.eps);
    }
  }
  __syncthreads();
  const int chunks_per_head = half / N;
  // Heads in qkv order: q heads, then k heads, then v heads; k and v only with a slot.
  const int num_items = (slot < 0 ? num_heads : num_heads + 2 * num_kv_heads) * chunks_per_head;
  for (int item = threadIdx.x; item < num_items; item += kRopeThreads) {
    const int head = item / chunks_per_head;  // index into the token's q | k | v heads
    const int i = (item % chunks_per_head) * N;
    const T* src = src_row + int64_t(head) * head_dim;
    float a[N], b[N];
    Load<T, N>(src + i, a);
    Load<T, N>(src + i + half, b);
    if (pre.bias != nullptr) {
      const float* bias = pre.bias + head * head_dim;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        a[j] += bias[i + j];
        b[j] += bias[i + half + j];
      }
    }
    if (pre.q_norm != nullptr && head < num_heads + num_kv_heads) {
      const float r = inv_rms_s[head];
      const float* w = head < num_heads ? pre.q_norm : pre.k_norm;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        a[j] = a[j] * r * w[i + j];
        b[j] = b[j] * r * w[i + half + j];
      }
    }
    int64_t dst_off;  // element offset in q_out or in the pool
    if (head < num_heads) {
      dst_off = (t * num_heads + head) * int64_t(head_dim);
    } else if (head < num_heads + num_kv_heads) {
      dst_off = layout.SlotOffset(slot, head - num_heads);
    } else {  // v: copied unchanged (bf16/fp16 -> fp32 -> same type is exact)
      dst_off = layout.SlotOffset(slot, head - num_heads - num_kv_heads);
      if constexpr (kFp8) {
        uint8_t* dst = static_cast<uint8_t*>(vc) + dst_off;
        StoreE4m3<N>(dst + i, a, format.v_scale);
        StoreE4m3<N>(dst + i + half, b, format.v_scale);
      } else {
        T* dst = static_cast<T*>(vc) + dst_off;
        Store<T, N>(dst + i, a);
        Store<T, N>(dst + i + half, b);
      }
      continue;
    }
    float lo[N], hi[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float c = cos_s[i + j], s = sin_s[i + j];
      lo[j] = a[j] * c - b[j] * s;
      hi[j] = b[j] * c + a[j] * s;
    }
    if (kFp8 && head >= num_heads) {
      uint8_t* dst = static_cast<uint8_t*>(kc) + dst_off;
      StoreE4m3<N>(dst + i, lo, format.k_scale);
      StoreE4m3<N>(dst + i + half, hi, format.k_scale);
    } else {
      T* dst = (head < num_heads ? q_out : static_cast<T*>(kc)) + dst_off;
      Store<T, N>(dst + i, lo);
      Store<T, N>(dst + i + half, hi);
    }
  }
}

// RopeAppendKv with per-head norms (QkvPrologue::q_norm, Qwen3) at head_dim = 32 · kM: one warp
// per head, CTA (token, kHeadWarps heads). Lane l holds dims l, l + 32, ..., so that the norm
// sums its squares in RopeAppendKvKernel's order (then the same xor tree) and every rotate-half
// pair (i, i + half = i + 32 · kM / 2) sits in one lane: one load of the row, no shared memory
// and no barrier. RopeAppendKvKernel ran a batch-1 step of Qwen3-30B-A3B (32 q + 4 k heads, one
// CTA of 8 warps taking the norms 4.5 rounds deep) in 7.9 us per layer on the H200
// (bench/results/moe-h200/2026-12-05-combine). The arithmetic is RopeAppendKvKernel's,
// operation for operation, with each rounding explicit (that kernel leaves ptxas free to contract
// a product and a sum into an fma, so the two may differ in the last bit).
constexpr int kHeadWarps = 4;

template <typename T, int kM, bool kFp8>
__global__ void __launch_bounds__(kHeadWarps * 32)
    RopeAppendKvHeadsKernel(const T* __restrict__ qkv, const int32_t* __restrict__ positions,
                            const int64_t* __restrict__ slot_mapping,
                            const float* __restrict__ inv_freq, int num_heads, int num_kv_heads,
                            PagedKvLayout layout, void* __restrict__ kc, void* __restrict__ vc,
                            T* __restrict__ q_out, KvCacheFormat format, QkvPrologue pre) {
  static_assert(kM % 2 == 0, "rotate-half pairs within a lane");
  constexpr int kHeadDim = 32 * kM, kHalf = kHeadDim / 2;
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int head = blockIdx.y * kHeadWarps + threadIdx.x / 32;  // q | k | v heads of the token
  const int qk_heads = num_heads + num_kv_heads;
  if (head >= qk_heads + num_kv_heads) return;  // a whole warp
  const int64_t slot = slot_mapping[t];
  if (head >= num_heads && slot < 0) return;  // no cache slot: q only
  const T* src = qkv + (t * int64_t(qk_heads + num_kv_heads) + head) * kHeadDim;
  float x[kM];
#pragma unroll
  for (int j = 0; j < kM; ++j) {
    x[j] = static_cast<float>(src[lane + 32 * j]);
    if (pre.bias != nullptr) x[j] += pre.bias[head * kHeadDim + lane + 32 * j];
  }
  if (head >= qk_heads) {  // v: copied unchanged (fp8: quantized)
    const int64_t off = layout.SlotOffset(slot, head - qk_heads);
#pragma unroll
    for (int j = 0; j < kM; ++j) {
      if constexpr (kFp8) {
        static_cast<uint8_t*>(vc)[off + lane + 32 * j] = F32ToE4m3(x[j] / format.v_scale);
      } else {
        static_cast<T*>(vc)[off + lane + 32 * j] = vec::FromF32<T>(x[j]);
      }
    }
    return;
  }
  // Explicit roundings (no contraction left to ptxas): every instantiation (dtype or e4m3
  // pools) computes the same values, which the fp8-cache test checks on q.
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kM; ++j) sum = __fmaf_rn(x[j], x[j], sum);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
  const float r = rsqrtf(__fadd_rn(__fdiv_rn(sum, float(kHeadDim)), pre.eps));
  const float* w = head < num_heads ? pre.q_norm : pre.k_norm;
  const float pos = static_cast<float>(positions[t]);
  const int64_t off = head < num_heads ? (t * num_heads + head) * int64_t(kHeadDim)
                                       : layout.SlotOffset(slot, head - num_heads);
#pragma unroll
  for (int j = 0; j < kM / 2; ++j) {
    const int i = lane + 32 * j;
    float a = x[j], b = x[j + kM / 2];
    a = __fmul_rn(__fmul_rn(a, r), w[i]);
    b = __fmul_rn(__fmul_rn(b, r), w[i + kHalf]);
    float s, c;
    sincosf(__fmul_rn(pos, inv_freq[i]), &s, &c);
    const float lo = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    const float hi = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    if (kFp8 && head >= num_heads) {
      uint8_t* dst = static_cast<uint8_t*>(kc) + off;
      dst[i] = F32ToE4m3(lo / format.k_scale);
      dst[i + kHalf] = F32ToE4m3(hi / format.k_scale);
    } else {
      T* dst = (head < num_heads ? q_out : static_cast<T*>(kc)) + off;
      dst[i] = vec::FromF32<T>(lo);
      dst[i + kHalf] = vec::FromF32<T>(hi);
    }
  }
}

template <typename T, int N, bool kFp8>
void LaunchRope(const void* qkv, const int32_t* positions, const int64_t* slot_mapping,
                const float* inv_freq, int64_t num_tokens, int num_heads, int num_kv_heads,
                int head_dim, const PagedKvView<void>& kv, void* q_out, const KvCacheFormat& format,
                const QkvPrologue& pre, cudaStream_t stream) {
  Launch(RopeAppendKvKernel<T, N, kFp8>, dim3(unsigned(num_tokens)), dim3(kRopeThreads), 0, stream,
         static_cast<const T*>(qkv), positions, slot_mapping, inv_freq, num_heads, num_kv_heads,
         head_dim, kv.layout, kv.k, kv.v, static_cast<T*>(q_out), format, pre);
}

template <typename T, int kM, bool kFp8>
void LaunchRopeHeads(const void* qkv, const int32_t* positions, const int64_t* slot_mapping,
                     const float* inv_freq, int64_t num_tokens, int num_heads, int num_kv_heads,
                     const PagedKvView<void>& kv, void* q_out, const KvCacheFormat& format,
                     const QkvPrologue& pre, cudaStream_t stream) {
  const unsigned groups = unsigned((num_heads + 2 * num_kv_heads + kHeadWarps - 1) / kHeadWarps);
  Launch(RopeAppendKvHeadsKernel<T, kM, kFp8>, dim3(unsigned(num_tokens), groups),
         dim3(kHeadWarps * 32), 0, stream, static_cast<const T*>(qkv), positions, slot_mapping,
         inv_freq, num_heads, num_kv_heads, kv.layout, kv.k, kv.v, static_cast<T*>(q_out), format,
         pre);
}

template <typename T>
void LaunchRopeAppendKv(const void* qkv, const int32_t* positions, const int64_t* slot_mapping,
                        const float* inv_freq, int64_t num_tokens, int num_heads, int num_kv_heads,
                        int head_dim, const PagedKvView<void>& kv, void* q_out, bool vec,
                        const KvCacheFormat& format, const QkvPrologue& pre, cudaStream_t stream) {
  // Per-head norms at head_dim 64 / 128 / 256: a warp per head (RopeAppendKvHeadsKernel).
  if (pre.head_warps && pre.q_norm != nullptr &&
      (head_dim == 64 || head_dim == 128 || head_dim == 256)) {
    auto* heads = head_dim == 64
                      ? (format.fp8 ? LaunchRopeHeads<T, 2, true> : LaunchRopeHeads<T, 2, false>)
                  : head_dim == 128
                      ? (format.fp8 ? LaunchRopeHeads<T, 4, true> : LaunchRopeHeads<T, 4, false>)
                      : (format.fp8 ? LaunchRopeHeads<T, 8, true> : LaunchRopeHeads<T, 8, false>);
    heads(qkv, positions, slot_mapping, inv_freq, num_tokens, num_heads, num_kv_heads, kv, q_out,
          format, pre, stream);
    return;
  }
  auto* launch = vec ? (format.fp8 ? LaunchRope<T, kVec, true> : LaunchRope<T, kVec, false>)
                     : (format.fp8 ? LaunchRope<T, 1, true> : LaunchRope<T, 1, false>);
  launch(qkv, positions, slot_mapping, inv_freq, num_tokens, num_heads, num_kv_heads, head_dim, kv,
         q_out, format, pre, stream);
}

}  // namespace

void RopeAppendKv(const void* qkv, const int32_t* positions, const int64_t* slot_mapping,
                  const float* inv_freq, int64_t num_tokens, int num_heads, int num_kv_heads,
                  int head_dim, PagedKvView<void> kv, DType dtype, void* q_out, cudaStream_t stream,
                  const KvCacheFormat& format, const QkvPrologue& pre) {
  CheckDType(dtype, "RopeAppendKv");
  if ((pre.q_norm == nullptr) != (pre.k_norm == nullptr) ||
      (pre.q_norm != nullptr && num_heads + num_kv_heads > kMaxNormedHeads)) {
    throw std::invalid_argument(
        "RopeAppendKv: q_norm and k_norm come together, for at most 512 q + k heads");
  }
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim ||
      kv.layout.head_dim != head_dim || kv.layout.num_kv_heads != num_kv_heads) {
    throw std::invalid_argument(
        "RopeAppendKv: head_dim must be even and <= 512, and head_dim / num_kv_heads must match "
        "the cache layout");
  }
  if (num_tokens <= 0) return;
  // 16-byte chunks need both halves of every head row 16-byte aligned: half % 8 == 0.
  const bool vec = (head_dim / 2) % kVec == 0 && Aligned16(qkv) && Aligned16(q_out) &&
                   Aligned16(kv.k) && Aligned16(kv.v);
  if (dtype == DType::kBF16) {
    LaunchRopeAppendKv<__nv_bfloat16>(qkv, positions, slot_mapping, inv_freq, num_tokens, num_heads,
                                      num_kv_heads, head_dim, kv, q_out, vec, format, pre, stream);
  } else {
    LaunchRopeAppendKv<__half>(qkv, positions, slot_mapping, inv_freq, num_tokens, num_heads,
                               num_kv_heads, head_dim, kv, q_out, vec, format, pre, stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
