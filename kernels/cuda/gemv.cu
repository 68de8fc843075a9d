// Small-batch GEMV (design in gemv.h).
// Instantiations: {bf16, fp16} × (5 epilogues + 3 with the RMSNorm prologue) × N ∈ {1, 2, 4, 8}
// = 64.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rmsnorm_row.cuh"
#include "kernels/cuda/vec.cuh"

namespace llm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 8;  // elements per 16-byte chunk
// R output rows per CTA (4 or 8; kSiluMul: R/2 gate + R/2 up rows) and U = 8 / R 16-byte
// chunks per row per thread per stage: 8 loads in flight per thread per stage either way.
template <int R>
struct Tile {
  static_assert(R == 4 || R == 8, "4 or 8 rows per CTA");
  static constexpr int kUnroll = 8 / R;
  static constexpr int kStageChunks = kThreads * kUnroll;  // chunks of a row per stage
};

// The weights are read exactly once: stream them past L1.
__device__ __forceinline__ uint4 LoadStream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[kChunk]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) f[i] = vec::ToF32(e[i]);
}

template <int R>
struct Stage {
  uint4 w[R][Tile<R>::kUnroll];
};

// Row r of this CTA: the weight row it reads.
template <GemvEpilogue E, int R>
__device__ __forceinline__ int64_t WeightRow(const GemvArgs& a, int r) {
  if constexpr (E == GemvEpilogue::kRopeAppendKv) {
    // CTA b: head b / (head_dim / R), dims p .. p + R/2 - 1 and their rotate-half partners.
    const int per_head = a.rope.head_dim / R, half = a.rope.head_dim / 2;
    const int64_t head = blockIdx.x / per_head;
    const int p = int(blockIdx.x % per_head) * (R / 2);
    return head * a.rope.head_dim + p + (r % (R / 2)) + (r >= R / 2 ? half : 0);
  } else if constexpr (E == GemvEpilogue::kSiluMul) {
    const int64_t half = a.m / 2;
    const int64_t col = int64_t(blockIdx.x) * (R / 2) + (r % (R / 2));
    const int64_t c = col < half ? col : half - 1;  // past the end: re-read a valid row
    return r < R / 2 ? c : half + c;
  } else {
    const int64_t j = int64_t(blockIdx.x) * R + r;
    return j < a.m ? j : a.m - 1;
  }
}

template <int R>
__device__ __forceinline__ void LoadStage(Stage<R>& s, const uint4* const (&rows)[R], int stage,
                                          int64_t chunks) {
#pragma unroll
  for (int u = 0; u < Tile<R>::kUnroll; ++u) {
    const int64_t c = int64_t(stage) * Tile<R>::kStageChunks + u * kThreads + threadIdx.x;
#pragma unroll
    for (int r = 0; r < R; ++r) s.w[r][u] = c < chunks ? LoadStream(rows[r] + c) : uint4{};
  }
}

// The 8 activations of chunk c of token t: x as is, or with the RMSNorm prologue
// dtype(g * (x * inv_rms)) from the fp32 residual, as cuda::AddRmsNorm computes them.
template <typename T, bool Norm>
__device__ __forceinline__ void LoadX(const GemvArgs& a, const float* inv_rms, int t, int64_t c,
                                      const float (&g)[kChunk], float (&x)[kChunk]) {
  if constexpr (Norm) {
    float r[kChunk];
    vec::LoadF32<kChunk>(static_cast<const float*>(a.x) + t * a.k + c * kChunk, r);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) x[i] = vec::RoundTo<T>(g[i] * (r[i] * inv_rms[t]));
  } else {
    Unpack<T>(reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + t * a.k)[c], x);
  }
}

template <typename T, bool Norm, int N, int R>
__device__ __forceinline__ void FmaStage(const Stage<R>& s, const GemvArgs& a, const float* inv_rms,
                                         int n, int stage, int64_t chunks, float (&acc)[R][N]) {
#pragma unroll
  for (int u = 0; u < Tile<R>::kUnroll; ++u) {
    const int64_t c = int64_t(stage) * Tile<R>::kStageChunks + u * kThreads + threadIdx.x;
    if (c >= chunks) continue;
    float w[R][kChunk];
#pragma unroll
    for (int r = 0; r < R; ++r) Unpack<T>(s.w[r][u], w[r]);
    float g[kChunk];
    if constexpr (Norm) vec::LoadF32<kChunk>(a.norm_weight + c * kChunk, g);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) break;
      float x[kChunk];
      LoadX<T, Norm>(a, inv_rms, t, c, g, x);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) acc[r][t] = fmaf(x[i], w[r][i], acc[r][t]);
      }
    }
  }
}

// Every token's 1 / rms over its fp32 residual row: each thread sums the squares of its own
// chunks (the ones it later multiplies), then the CTA reduces in a fixed order.
template <int N>
__device__ __forceinline__ void InverseRms(const GemvArgs& a, int n, int64_t chunks,
                                           float* inv_rms) {
  __shared__ float part[kThreads / 32][N];
  float ss[N];
#pragma unroll
  for (int t = 0; t < N; ++t) ss[t] = 0.f;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) break;
      float r[kChunk];
      vec::LoadF32<kChunk>(static_cast<const float*>(a.x) + t * a.k + c * kChunk, r);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) ss[t] += r[i] * r[i];
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < N; ++t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[t] += __shfl_xor_sync(0xffffffffu, ss[t], o);
    if (lane == 0) part[warp][t] = ss[t];
  }
  __syncthreads();
  if (threadIdx.x < N) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += part[w][threadIdx.x];
    // 1 / sqrt (IEEE), as cuda::AddRmsNorm.
    inv_rms[threadIdx.x] = 1.f / sqrtf(total / static_cast<float>(a.k) + a.eps);
  }
  __syncthreads();
}

// kAccumulateF32 with next_norm: warp 0 adds the CTA's sums into the residual; then the CTA
// that finishes last (an arrival counter, the pattern of CUDA's threadFenceReduction sample)
// computes the RMSNorm of the updated residual rows with norm::AddRmsNormRow, the code of the
// AddRmsNorm kernel (bit-identical output), reading the residual from L2. The counter goes back
// to zero for the next call (CUDA graph replays need no reset).
template <typename T, int N, int kRows>
__device__ __noinline__ void AccumulateThenNextNorm(const GemvArgs& a,
                                                    const float (&part)[kWarps][kRows][N], int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / N, t = lane % N;
  const int64_t j = int64_t(blockIdx.x) * kRows + r;
  if (warp == 0 && lane < kRows * N && t < n && j < a.m) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += part[w][r][t];
    static_cast<float*>(a.y)[t * a.m + j] += v;
    __threadfence();  // this CTA's residual writes before its arrival
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.next_norm.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other CTA's writes are visible to the reads below
  const GemvNextNorm& nn = a.next_norm;
  for (int tok = 0; tok < n; ++tok) {
    float* res = static_cast<float*>(a.y) + tok * a.m;
    T* dst = static_cast<T*>(nn.out) + tok * a.m;
    norm::AddRmsNormRow<T, vec::kVec, true>(res, nullptr, nn.weight, dst, a.m, nn.eps);
  }
  if (threadIdx.x == 0) *nn.counter = 0u;
}

template <typename T, GemvEpilogue E, bool Norm, int N, int R>
__global__ void __launch_bounds__(kThreads,
                                  (N == 1 && !Norm && R == 4 && E != GemvEpilogue::kAccumulateF32)
                                      ? 3
                                      : 1) GemvKernel(GemvArgs a) {
  constexpr int kRows = R;
  const int64_t chunks = a.k / kChunk;
  const int stages = static_cast<int>((chunks + Tile<R>::kStageChunks - 1) / Tile<R>::kStageChunks);
  const uint4* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rows[r] =
        reinterpret_cast<const uint4*>(static_cast<const T*>(a.w) + WeightRow<E, R>(a, r) * a.k);
  }
  // Weights are immutable: the first stage streams in before the previous kernel completes.
  Stage<R> s0, s1;
  LoadStage(s0, rows, 0, chunks);
  PdlWait();
  PdlTrigger();
  const int n = static_cast<int>(a.n);
  __shared__ float inv_rms[N];
  if constexpr (Norm) InverseRms<N>(a, n, chunks, inv_rms);
  float acc[kRows][N];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = 0.f;
  }
  for (int st = 0; st < stages; st += 2) {
    if (st + 1 < stages) LoadStage(s1, rows, st + 1, chunks);
    FmaStage<T, Norm, N, R>(s0, a, inv_rms, n, st, chunks, acc);
    if (st + 1 < stages) {
      if (st + 2 < stages) LoadStage(s0, rows, st + 2, chunks);
      FmaStage<T, Norm, N, R>(s1, a, inv_rms, n, st + 1, chunks, acc);
    }
  }
  // Reduce: lanes (shuffles), then warps (shared memory), in a fixed order.
  __shared__ float part[kWarps][kRows][N];
  __shared__ float total[kRows][N];  // kSiluMul: the gate and up sums side by side
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][r][t] = v;
    }
  }
  __syncthreads();
  // Warp 0 finishes: lane (r, t) sums the warps' partials of row r, token t (kRows·N <= 32).
  static_assert(kRows * N <= 32, "one lane per (row, token)");
  if constexpr (E == GemvEpilogue::kAccumulateF32) {
    if (a.next_norm.weight != nullptr) {  // every thread takes part in the last CTA's RMSNorm
      AccumulateThenNextNorm<T, N, kRows>(a, part, n);
      return;
    }
  }
  if (warp != 0) return;
  const int r = lane / N, t = lane % N;
  const bool mine = lane < kRows * N;
  float v = 0.f;
  if (mine) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += part[w][r][t];
  }
  if constexpr (E == GemvEpilogue::kRopeAppendKv) {
    if (mine) total[r][t] = v;
    __syncwarp();
    if (!mine || r >= kRows / 2 || t >= n) return;
    const GemvRope& rp = a.rope;
    const int per_head = rp.head_dim / kRows, half = rp.head_dim / 2;
    const int head = int(blockIdx.x / per_head);
    const int i = int(blockIdx.x % per_head) * (kRows / 2) + r;  // the dim in the first half
    // As kStore and then cuda::RopeAppendKv: the sums rounded to T, the rotation in fp32.
    const float lo = vec::RoundTo<T>(total[r][t]);
    const float hi = vec::RoundTo<T>(total[r + kRows / 2][t]);
    T* dst;
    if (head < rp.num_heads) {
      dst = static_cast<T*>(a.y) + (int64_t(t) * rp.num_heads + head) * rp.head_dim;
    } else {
      const int64_t slot = rp.slot_mapping[t];
      if (slot < 0) return;
      const int kv_head = head - rp.num_heads;
      if (kv_head >= rp.num_kv_heads) {  // v: copied unchanged
        dst = static_cast<T*>(rp.v_cache) + rp.layout.SlotOffset(slot, kv_head - rp.num_kv_heads);
        dst[i] = vec::FromF32<T>(lo);
        dst[i + half] = vec::FromF32<T>(hi);
        return;
      }
      dst = static_cast<T*>(rp.k_cache) + rp.layout.SlotOffset(slot, kv_head);
    }
    float sn, cs;
    sincosf(static_cast<float>(rp.positions[t]) * rp.inv_freq[i], &sn, &cs);
    dst[i] = vec::FromF32<T>(lo * cs - hi * sn);
    dst[i + half] = vec::FromF32<T>(hi * cs + lo * sn);
  } else if constexpr (E == GemvEpilogue::kSiluMul) {
    if (mine) total[r][t] = v;
    __syncwarp();
    if (!mine || r >= kRows / 2 || t >= n) return;
    const int64_t half = a.m / 2;
    const int64_t col = int64_t(blockIdx.x) * (kRows / 2) + r;
    if (col >= half) return;
    // As a GEMM into T and then cuda::SiluMul: both sums rounded to T, the product in fp32.
    const float g = vec::RoundTo<T>(total[r][t]);
    const float u = vec::RoundTo<T>(total[r + kRows / 2][t]);
    static_cast<T*>(a.y)[t * half + col] = vec::FromF32<T>(g / (1.f + expf(-g)) * u);
  } else {
    const int64_t j = int64_t(blockIdx.x) * kRows + r;
    if (!mine || t >= n || j >= a.m) return;
    if constexpr (E == GemvEpilogue::kAccumulateF32) {
      static_cast<float*>(a.y)[t * a.m + j] += v;
    } else if constexpr (E == GemvEpilogue::kStoreF32) {
      static_cast<float*>(a.y)[t * a.m + j] = v;
    } else {
      static_cast<T*>(a.y)[t * a.m + j] = vec::FromF32<T>(v);
    }
  }
}

template <typename T, GemvEpilogue E, bool Norm, int R>
void LaunchR(const GemvArgs& a, cudaStream_t stream) {
  // kRopeAppendKv: m = heads * head_dim, R rows per CTA as WeightRow maps them.
  const int64_t outputs = E == GemvEpilogue::kSiluMul ? a.m / 2 : a.m;
  const int64_t per_cta = E == GemvEpilogue::kSiluMul ? R / 2 : R;
  const dim3 grid(static_cast<unsigned>((outputs + per_cta - 1) / per_cta));
  if (a.n <= 1) {
    Launch(GemvKernel<T, E, Norm, 1, R>, grid, dim3(kThreads), 0, stream, a);
  } else if constexpr (R == 4) {  // 8 rows only at n = 1 (GemvRowsPerCta)
    if (a.n <= 2) {
      Launch(GemvKernel<T, E, Norm, 2, R>, grid, dim3(kThreads), 0, stream, a);
    } else if (a.n <= 4) {
      Launch(GemvKernel<T, E, Norm, 4, R>, grid, dim3(kThreads), 0, stream, a);
    } else {
      Launch(GemvKernel<T, E, Norm, 8, R>, grid, dim3(kThreads), 0, stream, a);
    }
  }
}

template <typename T, GemvEpilogue E, bool Norm>
void LaunchN(const GemvArgs& a, cudaStream_t stream) {
  if (GemvRowsPerCta(a) == 8) {
    LaunchR<T, E, Norm, 8>(a, stream);
  } else {
    LaunchR<T, E, Norm, 4>(a, stream);
  }
}

template <typename T>
void LaunchT(const GemvArgs& a, cudaStream_t stream) {
  const bool norm = a.norm_weight != nullptr;
  switch (a.epilogue) {
    case GemvEpilogue::kStore:
      return norm ? LaunchN<T, GemvEpilogue::kStore, true>(a, stream)
                  : LaunchN<T, GemvEpilogue::kStore, false>(a, stream);
    case GemvEpilogue::kStoreF32:
      return LaunchN<T, GemvEpilogue::kStoreF32, false>(a, stream);
    case GemvEpilogue::kAccumulateF32:
      return LaunchN<T, GemvEpilogue::kAccumulateF32, false>(a, stream);
    case GemvEpilogue::kSiluMul:
      return norm ? LaunchN<T, GemvEpilogue::kSiluMul, true>(a, stream)
                  : LaunchN<T, GemvEpilogue::kSiluMul, false>(a, stream);
    case GemvEpilogue::kRopeAppendKv:
      return norm ? LaunchN<T, GemvEpilogue::kRopeAppendKv, true>(a, stream)
                  : LaunchN<T, GemvEpilogue::kRopeAppendKv, false>(a, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool RopeOk(const GemvArgs& a) {
  const GemvRope& r = a.rope;
  return r.head_dim > 0 && r.head_dim % GemvRowsPerCta(a) == 0 && r.num_heads > 0 &&
         r.num_kv_heads > 0 && a.m == int64_t(r.num_heads + 2 * r.num_kv_heads) * r.head_dim &&
         r.positions && r.slot_mapping && r.inv_freq && r.k_cache && r.v_cache &&
         r.layout.head_dim == r.head_dim && r.layout.num_kv_heads == r.num_kv_heads;
}

}  // namespace

int GemvRowsPerCta(const GemvArgs& a) {
  if (a.n > 1) return 4;
  if (a.rows_per_cta == 4 || a.rows_per_cta == 8) return a.rows_per_cta;
  const bool rope8 = a.epilogue != GemvEpilogue::kRopeAppendKv || a.rope.head_dim % 8 == 0;
  return rope8 ? kGemvAutoRows : 4;
}

bool GemvSupports(const GemvArgs& a) {
  using E = GemvEpilogue;
  const bool norm_ok =
      a.norm_weight == nullptr ||
      ((a.epilogue == E::kStore || a.epilogue == E::kSiluMul || a.epilogue == E::kRopeAppendKv) &&
       Aligned16(a.norm_weight));
  return a.n >= 1 && a.n <= kGemvMaxTokens && a.k > 0 && a.k % kChunk == 0 && a.m > 0 &&
         (a.rows_per_cta == 0 || a.rows_per_cta == 4 || a.rows_per_cta == 8) &&
         (a.epilogue != E::kSiluMul || a.m % 2 == 0) &&
         (a.dtype == DType::kBF16 || a.dtype == DType::kF16) && Aligned16(a.x) && Aligned16(a.w) &&
         a.y != nullptr && norm_ok && (a.epilogue != E::kRopeAppendKv || RopeOk(a));
}

void Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (!GemvSupports(a)) {
    throw std::invalid_argument("Gemv: unsupported shape n=" + std::to_string(a.n) +
                                " m=" + std::to_string(a.m) + " k=" + std::to_string(a.k) +
                                " (n in [1, 8], k % 8 == 0, even m for SiLU·mul, 16-byte "
                                "aligned, bf16/f16, RMSNorm prologue only with store, SiLU·mul "
                                "or RoPE, RoPE shapes matching the KV layout)");
  }
  if (a.dtype == DType::kBF16) {
    LaunchT<__nv_bfloat16>(a, stream);
  } else {
    LaunchT<__half>(a, stream);
  }
}

}  // namespace llm::cuda
