// The Llama forward pass's fused element-wise ops on the GPU (interface and conventions:
// kernels/cuda/ops/model_ops.h): EmbeddingGather, AddRmsNorm, SiluMul, for bf16 and fp16
// (RopeAppendKv, which also writes the paged cache: rope_append_kv.cu). CPU twins (the
// specification): cpu::RmsNorm / AddInPlace / SiluMul in kernels/cpu/ops.h. The GPU sampler of
// the same header is in sampling.cu.
//
// All of them are memory-bound: every byte is read once and written once, and the design is
// only about doing that with wide accesses and without extra passes:
//  - Elements move in chunks of kVec = 8 (16 bytes of bf16/fp16: one uint4; 32 bytes of fp32:
//    two float4) when the row length and every base pointer allow it, else one element at a
//    time (the same kernels instantiated with kVec = 1).
//  - Math is fp32; each output is rounded once to its type (round to nearest even).
//  - The grid depends only on the shape (no data-dependent launches, no host sync, no
//    allocation), so every call can be captured in a CUDA graph.
// Per op:
//  - EmbeddingGather: one CTA per token, threads stride over the row's chunks.
//  - AddRmsNorm: one CTA per output row; the (updated) residual chunks of the first
//    kThreads * kCached chunks stay in registers between the sum-of-squares pass and the
//    scaling pass (hidden <= 8192 at kVec = 8: all of it), the rest is re-read (L1/L2).
//  - SiluMul: a grid-stride loop over the chunks of [num_tokens, inter].
// One file for one job, the forward pass's element-wise ops: they share the chunked accesses
// (vec.cuh at kVec = 8 or 1) and the dtype dispatch. AddRmsNormE4m3 ends in quantize_row.cuh's
// QuantizeRow, as fp8_rows.cu's QuantizeRowsE4m3 and SiluMulE4m3 do.
// Test:  ninja -C build model_ops_gpu_test fp8_linear_gpu_test &&
//        (cd build && ctest -L gpu -R 'model_ops|fp8_linear')   (fp8_linear: the e4m3 outputs)
// Bench: none of its own (memory-bound, each op a small share of a decode step).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/moe/combine.cuh"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/cuda/ops/ops_common.cuh"
#include "kernels/cuda/ops/quantize_row.cuh"
#include "kernels/fp8.h"

namespace llm::cuda {
namespace {

using ops_detail::Aligned16;
using ops_detail::CheckDType;
using ops_detail::kQuantThreads;
using ops_detail::QuantizeRow;
using vec::kVec;
using vec::Load;
using vec::LoadF32;
using vec::Store;
using vec::StoreF32;

// ---- EmbeddingGather ----------------------------------------------------------------------
// table dtype [vocab, hidden]; out fp32 [num_tokens, hidden]; one CTA per token.
constexpr int kGatherThreads = 256;

template <typename T, int N>
__global__ void __launch_bounds__(kGatherThreads)
    EmbeddingGatherKernel(const T* __restrict__ table, const int32_t* __restrict__ token_ids,
                          int64_t hidden, float scale, float* __restrict__ out) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const T* src = table + int64_t(token_ids[blockIdx.x]) * hidden;
  float* dst = out + int64_t(blockIdx.x) * hidden;
  for (int64_t i = int64_t(threadIdx.x) * N; i < hidden; i += int64_t(kGatherThreads) * N) {
    float x[N];
    Load<T, N>(src + i, x);
    if (scale != 1.f) {
#pragma unroll
      for (int j = 0; j < N; ++j) x[j] *= scale;
    }
    StoreF32<N>(dst + i, x);
  }
}

// ---- FeedSampledTokens ---------------------------------------------------------------------
// A grid-stride loop over the tokens; a few blocks at most (a step has <= 8k tokens).
constexpr int kFeedThreads = 256;

__global__ void __launch_bounds__(kFeedThreads)
    FeedSampledTokensKernel(int32_t* __restrict__ token_ids, const int32_t* __restrict__ feed,
                            const int32_t* __restrict__ sampled, int64_t num_tokens) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  for (int64_t t = int64_t(blockIdx.x) * kFeedThreads + threadIdx.x; t < num_tokens;
       t += int64_t(gridDim.x) * kFeedThreads) {
    const int32_t row = feed[t];
    if (row >= 0) token_ids[t] = sampled[row];
  }
}

// ---- ScatterCopies -------------------------------------------------------------------------
// blockIdx.y = the segment; blockIdx.x strides over its 16-byte words (then 4-byte tail words).
constexpr int kScatterThreads = 256;
struct ScatterArgs {
  const std::byte* src;
  CopySegment seg[kMaxCopySegments];
};

__global__ void __launch_bounds__(kScatterThreads) ScatterCopiesKernel(ScatterArgs a) {
  const CopySegment s = a.seg[blockIdx.y];
  const int64_t stride = int64_t(gridDim.x) * kScatterThreads;
  const int64_t first = int64_t(blockIdx.x) * kScatterThreads + threadIdx.x;
  const auto* in = reinterpret_cast<const uint4*>(a.src + s.src_offset);
  auto* out = static_cast<uint4*>(s.dst);
  const int64_t words16 = s.bytes / 16;
  for (int64_t i = first; i < words16; i += stride) out[i] = in[i];
  const auto* in4 = reinterpret_cast<const uint32_t*>(a.src + s.src_offset);
  auto* out4 = static_cast<uint32_t*>(s.dst);
  for (int64_t i = words16 * 4 + first; i < s.bytes / 4; i += stride) out4[i] = in4[i];
}

// weight * (residual * inv_rms): AddRmsNorm's normalized row in fp32.
template <int N>
struct NormSource {
  static constexpr bool kSplit = false;  // (its loads of a row are few: the norm's own pass)
  const float* res;
  const float* weight;
  float inv_rms;
  __device__ void operator()(int64_t c, float (&x)[N]) const {
    float w[N];
    LoadF32<N>(res + c * N, x);
    LoadF32<N>(weight + c * N, w);
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = w[i] * (x[i] * inv_rms);
  }
};

// ---- AddRmsNorm ---------------------------------------------------------------------------
constexpr int kNormThreads = 256;
constexpr int kNormCached = 4;  // register-cached chunks per thread: 8192 elements at kVec 8

// Sum over the CTA (kNormThreads threads), result in every thread. Fixed order: deterministic.
__device__ __forceinline__ float NormBlockSum(float v) {
  __shared__ float warp_sums[kNormThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
  return total;
}

// AddRmsNorm's delta: a row of T [*, hidden], or none (p null).
template <typename T>
struct RowDelta {
  const T* p;
  int64_t hidden;
  struct Row {
    const T* p;
    template <int N>
    __device__ __forceinline__ void Sum(int64_t off, float (&d)[N]) const {
      Load<T, N>(p + off, d);
    }
  };
  __device__ __forceinline__ bool present() const { return p != nullptr; }
  __device__ __forceinline__ Row Token(int64_t r) const { return {p ? p + r * hidden : nullptr}; }
};

// residual fp32 [*, hidden]; delta: RowDelta<T> or moe_detail::CombineSource (MoeCombine's sum
// of the token's expert rows); weight fp32 [hidden]; out T [num_rows, hidden]; rows int32
// [num_rows] or null. One CTA per output row.
// kFp8Out: out is e4m3 codes [num_rows, hidden] of the fp32 normalized row with one dynamic
// scale per row (out_scale), QuantizeRow's rule.
template <typename T, int N, bool kFp8Out, typename Delta = RowDelta<T>>
__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* __restrict__ residual, const Delta delta,
                     const float* __restrict__ weight, T* __restrict__ out,
                     const int32_t* __restrict__ rows, int64_t hidden, float eps,
                     uint8_t* __restrict__ out8, float* __restrict__ out_scale) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t r = rows ? rows[blockIdx.x] : blockIdx.x;
  float* res = residual + r * hidden;
  const bool has_delta = delta.present();
  const auto del = delta.Token(r);
  T* dst = kFp8Out ? nullptr : out + int64_t(blockIdx.x) * hidden;  // (out is null with kFp8Out)
  const int64_t num_chunks = hidden / N;
  float cache[kNormCached][N];
  float sum_sq = 0.f;
  // Pass 1: residual += delta (written back), sum of squares; chunk c = threadIdx + j·threads.
  int64_t c = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kNormCached; ++j, c += kNormThreads) {
    if (c < num_chunks) {
      LoadF32<N>(res + c * N, cache[j]);
      if (has_delta) {
        float d[N];
        del.template Sum<N>(c * N, d);
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
    LoadF32<N>(res + c * N, x);
    if (has_delta) {
      float d[N];
      del.template Sum<N>(c * N, d);
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] += d[i];
      StoreF32<N>(res + c * N, x);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) sum_sq += x[i] * x[i];
  }
  // 1 / sqrt (IEEE sqrt and division, as the CPU twin), not rsqrtf: costs nothing once per row.
  const float inv_rms = 1.f / sqrtf(NormBlockSum(sum_sq) / static_cast<float>(hidden) + eps);
  if constexpr (kFp8Out) {
    // Chunk c is handled by the same thread as above (c = threadIdx + j·threads), so the
    // residual it re-reads is its own write: no barrier needed.
    static_assert(kQuantThreads == kNormThreads, "the same chunk-to-thread map");
    QuantizeRow<N>(NormSource<N>{res, weight, inv_rms}, num_chunks,
                   out8 + int64_t(blockIdx.x) * hidden, out_scale + blockIdx.x, nullptr);
    return;
  }
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
    LoadF32<N>(res + c * N, x);
    LoadF32<N>(weight + c * N, w);
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = w[i] * (x[i] * inv_rms);
    Store<T, N>(dst + c * N, x);
  }
}

// ---- SiluMul ------------------------------------------------------------------------------
constexpr int kSiluThreads = 256;

// gate_up T [num_tokens, 2 inter] (gate | up); out T [num_tokens, inter]. Grid-stride loop
// over the num_tokens * inter / N chunks.
// kGelu: gelu_tanh(gate) · up instead (GeGLU, Gemma), as cpu::GeluTanhMul.
template <typename T, int N, bool kGelu = false>
__global__ void __launch_bounds__(kSiluThreads)
    SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t num_tokens,
                  int64_t inter) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const int64_t chunks_per_row = inter / N;
  const int64_t total = num_tokens * chunks_per_row;
  for (int64_t c = blockIdx.x * int64_t(kSiluThreads) + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * kSiluThreads) {
    const int64_t t = c / chunks_per_row;
    const int64_t i = (c % chunks_per_row) * N;
    const T* row = gate_up + t * 2 * inter;
    float g[N], u[N];
    Load<T, N>(row + i, g);
    Load<T, N>(row + inter + i, u);
    if constexpr (kGelu) {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float x = g[j];
        g[j] = 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * u[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) g[j] = g[j] / (1.f + expf(-g[j])) * u[j];
    }
    Store<T, N>(out + t * inter + i, g);
  }
}

// ---- AddNormedDelta (Gemma's sandwich norms) ----------------------------------------------
// residual fp32 [n, hidden] += weight · float(delta) / rms(float(delta)); one CTA per row.
template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    AddNormedDeltaKernel(float* __restrict__ residual, const T* __restrict__ delta,
                         const float* __restrict__ weight, int64_t hidden, float eps) {
  PdlWait();  // reads what earlier kernels wrote (launch.h)
  PdlTrigger();
  const T* d = delta + int64_t(blockIdx.x) * hidden;
  float* res = residual + int64_t(blockIdx.x) * hidden;
  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += kNormThreads) {
    const float x = static_cast<float>(d[i]);
    sum_sq += x * x;
  }
  const float inv_rms = 1.f / sqrtf(NormBlockSum(sum_sq) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += kNormThreads) {
    res[i] += weight[i] * (static_cast<float>(d[i]) * inv_rms);
  }
}

// ---- launchers: T and the chunk width become template arguments --------------------------
template <typename T>
void LaunchEmbeddingGather(const void* table, const int32_t* token_ids, int64_t num_tokens,
                           int64_t hidden, float scale, float* out, bool vec, cudaStream_t stream) {
  const T* t = static_cast<const T*>(table);
  if (vec) {
    Launch(EmbeddingGatherKernel<T, kVec>, dim3(unsigned(num_tokens)), dim3(kGatherThreads), 0,
           stream, t, token_ids, hidden, scale, out);
  } else {
    Launch(EmbeddingGatherKernel<T, 1>, dim3(unsigned(num_tokens)), dim3(kGatherThreads), 0, stream,
           t, token_ids, hidden, scale, out);
  }
}

template <typename T>
void LaunchAddRmsNorm(float* residual, const void* delta, const float* weight, void* out,
                      const int32_t* rows, int64_t num_rows, int64_t hidden, float eps, bool vec,
                      cudaStream_t stream) {
  const RowDelta<T> d{static_cast<const T*>(delta), hidden};
  T* o = static_cast<T*>(out);
  if (vec) {
    Launch(AddRmsNormKernel<T, kVec, false>, dim3(unsigned(num_rows)), dim3(kNormThreads), 0,
           stream, residual, d, weight, o, rows, hidden, eps, nullptr, nullptr);
  } else {
    Launch(AddRmsNormKernel<T, 1, false>, dim3(unsigned(num_rows)), dim3(kNormThreads), 0, stream,
           residual, d, weight, o, rows, hidden, eps, nullptr, nullptr);
  }
}

template <typename T>
void LaunchAddRmsNormE4m3(float* residual, const void* delta, const float* weight, uint8_t* out,
                          float* out_scale, const int32_t* rows, int64_t num_rows, int64_t hidden,
                          float eps, bool vec, cudaStream_t stream) {
  const RowDelta<T> d{static_cast<const T*>(delta), hidden};
  if (vec) {
    Launch(AddRmsNormKernel<T, kVec, true>, dim3(unsigned(num_rows)), dim3(kNormThreads), 0, stream,
           residual, d, weight, static_cast<T*>(nullptr), rows, hidden, eps, out, out_scale);
  } else {
    Launch(AddRmsNormKernel<T, 1, true>, dim3(unsigned(num_rows)), dim3(kNormThreads), 0, stream,
           residual, d, weight, static_cast<T*>(nullptr), rows, hidden, eps, out, out_scale);
  }
}

template <typename T>
void LaunchSiluMul(const void* gate_up, void* out, int64_t num_tokens, int64_t inter,
                   unsigned blocks, bool vec, bool gelu, cudaStream_t stream) {
  const T* in = static_cast<const T*>(gate_up);
  T* o = static_cast<T*>(out);
  auto* kernel = vec ? (gelu ? SiluMulKernel<T, kVec, true> : SiluMulKernel<T, kVec, false>)
                     : (gelu ? SiluMulKernel<T, 1, true> : SiluMulKernel<T, 1, false>);
  Launch(kernel, dim3(blocks), dim3(kSiluThreads), 0, stream, in, o, num_tokens, inter);
}

}  // namespace

void EmbeddingGather(const void* table, DType dtype, const int32_t* token_ids, int64_t num_tokens,
                     int64_t hidden, float* out, cudaStream_t stream, float scale) {
  CheckDType(dtype, "EmbeddingGather");
  if (num_tokens <= 0 || hidden <= 0) return;
  const bool vec = hidden % kVec == 0 && Aligned16(table) && Aligned16(out);
  if (dtype == DType::kBF16) {
    LaunchEmbeddingGather<__nv_bfloat16>(table, token_ids, num_tokens, hidden, scale, out, vec,
                                         stream);
  } else {
    LaunchEmbeddingGather<__half>(table, token_ids, num_tokens, hidden, scale, out, vec, stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

void FeedSampledTokens(int32_t* token_ids, const int32_t* feed, const int32_t* sampled,
                       int64_t num_tokens, cudaStream_t stream) {
  if (num_tokens <= 0) return;
  const int64_t blocks = std::min<int64_t>((num_tokens + kFeedThreads - 1) / kFeedThreads, 64);
  Launch(FeedSampledTokensKernel, dim3(unsigned(blocks)), dim3(kFeedThreads), 0, stream, token_ids,
         feed, sampled, num_tokens);
  LLM_CUDA_CHECK(cudaGetLastError());
}

void ScatterCopies(const void* src, const CopySegment* segments, int count, cudaStream_t stream) {
  if (count < 0 || count > kMaxCopySegments) {
    throw std::invalid_argument("ScatterCopies: " + std::to_string(count) + " segments (at most " +
                                std::to_string(kMaxCopySegments) + ")");
  }
  ScatterArgs a{};
  a.src = static_cast<const std::byte*>(src);
  int64_t most = 0;
  for (int i = 0; i < count; ++i) {
    const CopySegment& s = segments[i];
    if (s.bytes < 0 || s.bytes % 4 != 0 || s.src_offset % 16 != 0 ||
        reinterpret_cast<uintptr_t>(s.dst) % 16 != 0 || (s.bytes > 0 && s.dst == nullptr)) {
      throw std::invalid_argument("ScatterCopies: segment " + std::to_string(i) +
                                  " needs 16-byte aligned offsets and a size in 4-byte words");
    }
    a.seg[i] = s;
    most = std::max(most, s.bytes);
  }
  if (count == 0 || most == 0) return;
  // ~64 KiB per CTA of the largest segment (block tables at large batch), at most 128 wide.
  const int64_t wide = std::clamp<int64_t>((most + 65535) / 65536, 1, 128);
  ScatterCopiesKernel<<<dim3(unsigned(wide), unsigned(count)), kScatterThreads, 0, stream>>>(a);
  LLM_CUDA_CHECK(cudaGetLastError());
}

void AddRmsNorm(float* residual, const void* delta, const float* weight, void* out, DType dtype,
                const int32_t* rows, int64_t num_rows, int64_t hidden, float eps,
                cudaStream_t stream) {
  CheckDType(dtype, "AddRmsNorm");
  if (num_rows <= 0 || hidden <= 0) return;
  const bool vec = hidden % kVec == 0 && Aligned16(residual) && Aligned16(weight) &&
                   Aligned16(out) && (delta == nullptr || Aligned16(delta));
  if (dtype == DType::kBF16) {
    LaunchAddRmsNorm<__nv_bfloat16>(residual, delta, weight, out, rows, num_rows, hidden, eps, vec,
                                    stream);
  } else {
    LaunchAddRmsNorm<__half>(residual, delta, weight, out, rows, num_rows, hidden, eps, vec,
                             stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

void MoeCombineRmsNorm(float* residual, const float* expert_rows, const MoeRouting& routing,
                       int top_k, const float* weight, void* out, DType dtype, const int32_t* rows,
                       int64_t num_rows, int64_t hidden, float eps, cudaStream_t stream) {
  CheckDType(dtype, "MoeCombineRmsNorm");
  if (!routing.complete())
    throw std::invalid_argument("MoeCombineRmsNorm: a MoeRouting array is null");
  if (top_k < 1 || top_k > kMoeMaxTopK) {
    throw std::invalid_argument("MoeCombineRmsNorm: top_k " + std::to_string(top_k));
  }
  if (num_rows <= 0 || hidden <= 0) return;
  // The chunking of AddRmsNorm (the same sums of squares, bit for bit); its 16-byte chunks
  // read the expert rows 16 bytes at a time too.
  const bool vec = hidden % kVec == 0 && Aligned16(residual) && Aligned16(weight) && Aligned16(out);
  if (vec && !Aligned16(expert_rows)) {
    throw std::invalid_argument("MoeCombineRmsNorm: expert_rows must be 16-byte aligned");
  }
  const moe_detail::CombineSource src =
      moe_detail::CombineSourceOf(expert_rows, routing, top_k, hidden);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    if (vec) {
      Launch(AddRmsNormKernel<T, kVec, false, moe_detail::CombineSource>, dim3(unsigned(num_rows)),
             dim3(kNormThreads), 0, stream, residual, src, weight, o, rows, hidden, eps, nullptr,
             nullptr);
    } else {
      Launch(AddRmsNormKernel<T, 1, false, moe_detail::CombineSource>, dim3(unsigned(num_rows)),
             dim3(kNormThreads), 0, stream, residual, src, weight, o, rows, hidden, eps, nullptr,
             nullptr);
    }
  };
  if (dtype == DType::kBF16) {
    launch(__nv_bfloat16{});
  } else {
    launch(__half{});
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

namespace {

void GatedActivation(const void* gate_up, void* out, int64_t num_tokens, int64_t inter, DType dtype,
                     bool gelu, cudaStream_t stream) {
  CheckDType(dtype, gelu ? "GeluTanhMul" : "SiluMul");
  if (num_tokens <= 0 || inter <= 0) return;
  const bool vec = inter % kVec == 0 && Aligned16(gate_up) && Aligned16(out);
  const int64_t chunks = num_tokens * (inter / (vec ? kVec : 1));
  // Enough CTAs to fill the machine several times over; the loop covers the rest.
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((chunks + kSiluThreads - 1) / kSiluThreads, 8192));
  if (dtype == DType::kBF16) {
    LaunchSiluMul<__nv_bfloat16>(gate_up, out, num_tokens, inter, blocks, vec, gelu, stream);
  } else {
    LaunchSiluMul<__half>(gate_up, out, num_tokens, inter, blocks, vec, gelu, stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void SiluMul(const void* gate_up, void* out, int64_t num_tokens, int64_t inter, DType dtype,
             cudaStream_t stream) {
  GatedActivation(gate_up, out, num_tokens, inter, dtype, false, stream);
}

void GeluTanhMul(const void* gate_up, void* out, int64_t num_tokens, int64_t inter, DType dtype,
                 cudaStream_t stream) {
  GatedActivation(gate_up, out, num_tokens, inter, dtype, true, stream);
}

void AddNormedDelta(float* residual, const void* delta, const float* weight, DType dtype,
                    int64_t num_rows, int64_t hidden, float eps, cudaStream_t stream) {
  CheckDType(dtype, "AddNormedDelta");
  if (num_rows <= 0 || hidden <= 0) return;
  if (dtype == DType::kBF16) {
    Launch(AddNormedDeltaKernel<__nv_bfloat16>, dim3(unsigned(num_rows)), dim3(kNormThreads), 0,
           stream, residual, static_cast<const __nv_bfloat16*>(delta), weight, hidden, eps);
  } else {
    Launch(AddNormedDeltaKernel<__half>, dim3(unsigned(num_rows)), dim3(kNormThreads), 0, stream,
           residual, static_cast<const __half*>(delta), weight, hidden, eps);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

void AddRmsNormE4m3(float* residual, const void* delta, const float* weight, uint8_t* out,
                    float* out_scale, DType dtype, const int32_t* rows, int64_t num_rows,
                    int64_t hidden, float eps, cudaStream_t stream) {
  CheckDType(dtype, "AddRmsNormE4m3");
  if (num_rows <= 0 || hidden <= 0) return;
  // Codes of 8 elements are one 8-byte store: out 8-byte aligned.
  const bool vec = hidden % kVec == 0 && Aligned16(residual) && Aligned16(weight) &&
                   reinterpret_cast<uintptr_t>(out) % 8 == 0 &&
                   (delta == nullptr || Aligned16(delta));
  if (dtype == DType::kBF16) {
    LaunchAddRmsNormE4m3<__nv_bfloat16>(residual, delta, weight, out, out_scale, rows, num_rows,
                                        hidden, eps, vec, stream);
  } else {
    LaunchAddRmsNormE4m3<__half>(residual, delta, weight, out, out_scale, rows, num_rows, hidden,
                                 eps, vec, stream);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
