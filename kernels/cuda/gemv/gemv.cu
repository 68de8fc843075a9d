// Small-batch GEMV (design in gemv.h).
// Instantiations: {bf16, fp16} × N ∈ {1, 2, 4, 8} × (dtype and e4m3 weights: 5 epilogues + 3
// with the RMSNorm prologue) = 128, bf16 × N × weights × 4 with the folded RMSNorm = 32, and
// the ring kernel (GemvArgs::ring) {bf16, fp16} × N × weights × 5 epilogues = 80 (at n = 1 <= 64
// registers; dtype weights <= 112 so that two CTAs of 288 threads fit an SM's registers, e4m3
// (160 threads) <= 116; no spills).
// Registers: nvcc -Xptxas -v (the command in gemv.h); at n = 1 without spills: the dtype
// kernels at <= 64 (4 CTAs of 256 per SM; with the RMSNorm prologue <= 80, 3 CTAs: at 64 its
// RoPE variant spilled), the e4m3 ones at <= 80 (6 CTAs of 128; bench/RESULTS.md).
// One file for one kernel: GemvKernel's instantiations share the weight formats, the staged
// loads, the FMA loop, the prologue and the epilogues (device functions of this file only).
// Test:  the gemv*_gpu_test targets (ninja -C build <them>), then
//        (cd build && ctest -L gpu -R gemv); the fp8 kRopeAppendKv epilogue: the
//        kv_fp8*_gpu_test targets, ctest -L gpu -R kv_fp8 (GemvRopeFp8Gpu)
// Bench: ninja -C build bench_gemm_peak_gpu && ./build/bench_gemm_peak_gpu   (the "gemv" and
//        "decode_chain" lines)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/fp8.h"

namespace llm::cuda {
namespace {

constexpr int kRows = 4;  // output rows per group (kSiluMul: 2 gate + 2 up)
// 16-byte chunks per row per thread per stage. 1: two stages double buffered fit the n = 1
// kernels in 80 registers (with 2, the persistent loop spilled).
constexpr int kUnroll = 1;
constexpr int kChunk = 8;  // elements of x per 16-byte chunk
// CTAs per SM at n = 1 (__launch_bounds__): dtype weights 4 of 256 threads (<= 64 registers),
// so that every SM keeps 128 KiB of weights in flight (2 stages of 16 KiB per CTA); e4m3 6 of
// 128 (<= 80 registers; at 8 the fused RoPE spills). Before the RoPE tables and the prologue's
// rows moved to shared memory, the q|k|v GEMV needed 74 registers and ran 3 CTAs per SM
// (bench/RESULTS.md: what this kernel's speed depends on). LLM_GEMV_DTYPE_CTAS_PER_SM
// overrides the dtype figure (benchmarks).
#ifndef LLM_GEMV_DTYPE_CTAS_PER_SM
#define LLM_GEMV_DTYPE_CTAS_PER_SM 4
#endif
static_assert(kRows % 2 == 0, "kSiluMul pairs gate and up rows");

using ptx::BulkLoad;
using ptx::L2EvictFirstPolicy;
using ptx::LoadStream;  // the weights are read exactly once: stream them past L1
using ptx::MbarArrive;
using ptx::MbarExpectTx;
using ptx::MbarInit;
using ptx::MbarInitFence;
using ptx::MbarWait;
using ptx::NamedBarrier;
using ptx::SmemAddr;

template <typename T>
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[kChunk]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) f[i] = vec::ToF32(e[i]);
}

// The weight formats (the kernel's W parameter). A 16-byte chunk of a weight row holds
// kSubChunks × 8 weights; Unpack gives sub-chunk `sub` as 8 floats, exactly, to pair with one
// 16-byte chunk of x.
template <typename T>
struct DTypeWeights {  // w: dtype [m, k]
  using Element = T;
  static constexpr int kSubChunks = 1;
  static constexpr int kThreads = 256;                           // a 4096-wide row: 2 stages
  static constexpr int kCtasPerSm = LLM_GEMV_DTYPE_CTAS_PER_SM;  // at n = 1
  static constexpr int kStageChunks = kUnroll * kThreads;        // chunks of a row per stage
  __device__ static __forceinline__ void Unpack(const uint4& v, int /*sub*/, float (&f)[kChunk]) {
    cuda::Unpack<T>(v, f);
  }
};

struct Fp8Weights {  // w: e4m3 codes [m, k], w_scale: fp32 [m], applied after the reduction
  using Element = uint8_t;
  static constexpr int kSubChunks = 2;
  // Half the threads, so that a 4096-wide row is again 2 chunks per thread (2 stages): as many
  // bytes in flight per thread as the dtype kernel, and 6 CTAs per SM. With 256 threads (1 chunk
  // per thread at k = 4096: half the bytes in flight per SM) the Llama-3-8B chain took 2.46 ms
  // (2.84 TB/s of codes), with 128 2.20 ms (3.17), with 64 2.23 ms (gemv.h).
  static constexpr int kThreads = 128;
  static constexpr int kCtasPerSm = 6;  // at n = 1
  static constexpr int kStageChunks = kUnroll * kThreads;
  // Codes 4i .. 4i + 3 of a word as floats (vec::E4m3x4ToF32: exact).
  __device__ static __forceinline__ void Unpack(const uint4& v, int sub, float (&f)[kChunk]) {
    vec::E4m3x4ToF32(sub == 0 ? v.x : v.z, f);
    vec::E4m3x4ToF32(sub == 0 ? v.y : v.w, f + 4);
  }
};

template <typename W>
constexpr bool kIsFp8 = std::is_same_v<W, Fp8Weights>;

struct Stage {
  uint4 w[kRows][kUnroll];
};

// Row r of row group g (a CTA's unit of work): the weight row it reads.
template <GemvEpilogue E>
__device__ __forceinline__ int64_t WeightRow(const GemvArgs& a, int64_t g, int r) {
  if constexpr (E == GemvEpilogue::kRopeAppendKv) {
    // Group g: head g / (head_dim / 4), dims p, p + 1 and their partners p + half, p + half + 1.
    const int quarter = a.rope.head_dim / 4, half = a.rope.head_dim / 2;
    const int64_t head = g / quarter;
    const int p = int(g % quarter) * 2;
    return head * a.rope.head_dim + p + (r % 2) + (r >= 2 ? half : 0);
  } else if constexpr (E == GemvEpilogue::kSiluMul) {
    const int64_t half = a.m / 2;
    const int64_t col = g * (kRows / 2) + (r % (kRows / 2));
    const int64_t c = col < half ? col : half - 1;  // past the end: re-read a valid row
    return r < kRows / 2 ? c : half + c;
  } else {
    const int64_t j = g * kRows + r;
    return j < a.m ? j : a.m - 1;
  }
}

// Row groups of the matrix: kRows rows each (kSiluMul: kRows / 2 gate rows with their up rows;
// kRopeAppendKv: m / kRows groups as WeightRow maps them).
template <GemvEpilogue E>
__device__ __host__ __forceinline__ int64_t NumGroups(const GemvArgs& a) {
  const int64_t outputs = E == GemvEpilogue::kSiluMul ? a.m / 2 : a.m;
  const int64_t per_group = E == GemvEpilogue::kSiluMul ? kRows / 2 : kRows;
  return (outputs + per_group - 1) / per_group;
}

// Stage `stage` of row group g's weights into s.
template <typename W, GemvEpilogue E>
__device__ __forceinline__ void LoadStage(Stage& s, const GemvArgs& a, int64_t g, int stage,
                                          int64_t chunks) {
  using Element = typename W::Element;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint4* row = reinterpret_cast<const uint4*>(static_cast<const Element*>(a.w) +
                                                      WeightRow<E>(a, g, r) * a.k);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = int64_t(stage) * W::kStageChunks + u * W::kThreads + threadIdx.x;
      s.w[r][u] = c < chunks ? LoadStream(row + c) : uint4{};
    }
  }
}

// An activation chunk, loaded in program order (volatile: not moved across the weight loads or
// the other x loads). With plain loads, which the compiler schedules freely, the e4m3 kernel at
// n = 1 spills (52 bytes at the 80-register cap: two x chunks per weight chunk); the dtype
// kernel keeps the plain load (it spills with this one).
using ptx::LoadInOrder;
// One fp32 value, loaded where the program issues it (volatile: not sunk to its first use).
using ptx::LoadF32InOrder;

// The 8 activations of chunk c of token t: x as is, or with the RMSNorm prologue the
// normalized row the prologue left in shared memory (xs: [n, k / 8] chunks of dtype).
template <typename T, typename W, bool Norm>
__device__ __forceinline__ void LoadX(const GemvArgs& a, const uint4* xs, int t, int64_t c,
                                      float (&x)[kChunk]) {
  if constexpr (Norm) {
    Unpack<T>(xs[t * (a.k / kChunk) + c], x);
  } else {
    const uint4* row = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + t * a.k);
    if constexpr (kIsFp8<W>) {
      Unpack<T>(LoadInOrder(row + c), x);
    } else {
      Unpack<T>(row[c], x);
    }
  }
}

// Weight chunk c (16 bytes of each row) against x chunks c · kSubChunks + sub (the same k
// range): for e4m3 weights two 16-byte chunks of x per weight chunk.
template <typename T, typename W, bool Norm, int N>
__device__ __forceinline__ void FmaStage(const Stage& s, const GemvArgs& a, const uint4* xs, int n,
                                         int stage, int64_t chunks, float (&acc)[kRows][N]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = int64_t(stage) * W::kStageChunks + u * W::kThreads + threadIdx.x;
    if (c >= chunks) continue;
#pragma unroll
    for (int sub = 0; sub < W::kSubChunks; ++sub) {
      const int64_t xc = c * W::kSubChunks + sub;
      float w[kRows][kChunk];
#pragma unroll
      for (int r = 0; r < kRows; ++r) W::Unpack(s.w[r][u], sub, w[r]);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t >= n) break;
        float x[kChunk];
        LoadX<T, W, Norm>(a, xs, t, xc, x);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int i = 0; i < kChunk; ++i) acc[r][t] = fmaf(x[i], w[r][i], acc[r][t]);
        }
      }
    }
  }
}

// The RMSNorm prologue (after PdlWait): every token's 1 / rms over its fp32 residual row (each
// thread sums the squares of chunks tid, tid + kThreads, ..., then the CTA reduces in a fixed
// order), then the normalized rows dtype(g * (x * inv_rms)), as cuda::AddRmsNorm computes
// them, into shared memory (xs: n * k dtype values), where the FMAs read them: one pass over
// the residual per CTA (L2), and no activation traffic past it.
template <typename T, int kThreads, int N>
__device__ __forceinline__ void NormalizeToShared(const GemvArgs& a, int n, uint4* xs) {
  const int64_t chunks = a.k / kChunk;
  __shared__ float part[kThreads / 32][N];
  __shared__ float inv_rms[N];
  float ss[N];
#pragma unroll
  for (int t = 0; t < N; ++t) ss[t] = 0.f;
    // Not unrolled: the two weight stages loaded before PdlWait are live here (registers).
#pragma unroll 1
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
#pragma unroll 1
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    float g[kChunk];
    vec::LoadF32<kChunk>(a.norm_weight + c * kChunk, g);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) break;
      float r[kChunk];
      vec::LoadF32<kChunk>(static_cast<const float*>(a.x) + t * a.k + c * kChunk, r);
      const float inv = inv_rms[t];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) r[i] = g[i] * (r[i] * inv);
      vec::Store<T, kChunk>(reinterpret_cast<T*>(xs + t * chunks + c), r);
    }
  }
  __syncthreads();
}

// kRopeAppendKv's per-CTA inputs, staged in shared memory once per CTA (after PdlWait), so
// that no group's epilogue waits on a global load or computes a sine: the tokens' slots and
// the rotation's cos and sin of position · inv_freq[i] for every token and dim i < half (the
// CTA's threads compute them together; the same sincosf of the same fp32 angle as
// cuda::RopeAppendKv). Read by warp 0's epilogues after the group's barrier.
constexpr int kRopeMaxHalf = 128;  // head_dim <= 256
template <int N>
struct RopeStage {
  int64_t slot[N];
  float cos[N][kRopeMaxHalf];
  float sin[N][kRopeMaxHalf];
};

// The static shared memory beside the prologue's rows stays within the 48 KiB a launch gets
// without an opt-in attribute.
static_assert(kGemvNormSharedBytes + sizeof(RopeStage<kGemvMaxTokens>) + 4096 <= 48 * 1024,
              "prologue rows + RoPE tables + reduction scratch exceed 48 KiB");

template <int N>
__device__ __forceinline__ void StageRope(const GemvArgs& a, int n, int threads, RopeStage<N>& rs) {
  const int half = a.rope.head_dim / 2;
  if (threadIdx.x < n) rs.slot[threadIdx.x] = a.rope.slot_mapping[threadIdx.x];
#pragma unroll 1
  for (int idx = threadIdx.x; idx < n * half; idx += threads) {
    const int t = idx / half, i = idx % half;
    sincosf(static_cast<float>(a.rope.positions[t]) * a.rope.inv_freq[i], &rs.sin[t][i],
            &rs.cos[t][i]);
  }
}

// Warp 0's epilogue for row group g: lane (r, t) = lane / N, lane % N holds v, the sum of row r
// for token t (already scaled for e4m3 weights) when `mine`. total: warp 0's scratch.
template <typename T, GemvEpilogue E, bool Fold, int N>
__device__ __forceinline__ void Epilogue(const GemvArgs& a, int64_t g, int r, int t, bool mine,
                                         float v, float (&total)[kRows][N], const RopeStage<N>& rs,
                                         float xold, float gnext) {
  const int n = static_cast<int>(a.n);
  if constexpr (E == GemvEpilogue::kRopeAppendKv) {
    if (mine) total[r][t] = v;
    __syncwarp();
    if (!mine || r >= 2 || t >= n) return;
    const GemvRope& rp = a.rope;
    const int quarter = rp.head_dim / 4, half = rp.head_dim / 2;
    const int head = int(g / quarter);
    const int i = int(g % quarter) * 2 + r;  // the dim in the first half
    // As kStore and then cuda::RopeAppendKv: the sums rounded to T, the rotation in fp32.
    const float lo = vec::RoundTo<T>(total[r][t]), hi = vec::RoundTo<T>(total[r + 2][t]);
    const KvCacheFormat& fmt = rp.kv_format;
    T* dst;
    if (head < rp.num_heads) {
      dst = static_cast<T*>(a.y) + (int64_t(t) * rp.num_heads + head) * rp.head_dim;
    } else {
      const int64_t slot = rs.slot[t];
      if (slot < 0) return;
      const int kv_head = head - rp.num_heads;
      if (kv_head >= rp.num_kv_heads) {  // v: copied unchanged (fp8: quantized from T)
        const int64_t off = rp.layout.SlotOffset(slot, kv_head - rp.num_kv_heads);
        if (fmt.fp8) {
          uint8_t* d8 = static_cast<uint8_t*>(rp.v_cache) + off;
          d8[i] = F32ToE4m3(lo / fmt.v_scale);
          d8[i + half] = F32ToE4m3(hi / fmt.v_scale);
          return;
        }
        dst = static_cast<T*>(rp.v_cache) + off;
        dst[i] = vec::FromF32<T>(lo);
        dst[i + half] = vec::FromF32<T>(hi);
        return;
      }
      const int64_t off = rp.layout.SlotOffset(slot, kv_head);
      if (fmt.fp8) {  // k: the fp32 rotation quantized, as cuda::RopeAppendKv
        const float cs = rs.cos[t][i], sn = rs.sin[t][i];
        uint8_t* d8 = static_cast<uint8_t*>(rp.k_cache) + off;
        d8[i] = F32ToE4m3((lo * cs - hi * sn) / fmt.k_scale);
        d8[i + half] = F32ToE4m3((hi * cs + lo * sn) / fmt.k_scale);
        return;
      }
      dst = static_cast<T*>(rp.k_cache) + off;
    }
    const float cs = rs.cos[t][i], sn = rs.sin[t][i];
    dst[i] = vec::FromF32<T>(lo * cs - hi * sn);
    dst[i + half] = vec::FromF32<T>(hi * cs + lo * sn);
  } else if constexpr (E == GemvEpilogue::kSiluMul) {
    if (mine) total[r][t] = v;
    __syncwarp();
    if (!mine || r >= kRows / 2 || t >= n) return;
    const int64_t half = a.m / 2;
    const int64_t col = g * (kRows / 2) + r;
    if (col >= half) return;
    // As a GEMM into T and then cuda::SiluMul: both sums rounded to T, the product in fp32.
    const float gate = vec::RoundTo<T>(total[r][t]);
    const float up = vec::RoundTo<T>(total[r + kRows / 2][t]);
    static_cast<T*>(a.y)[t * half + col] = vec::FromF32<T>(gate / (1.f + expf(-gate)) * up);
  } else {
    const int64_t j = g * kRows + r;
    if constexpr (E == GemvEpilogue::kAccumulateF32 && Fold) {
      // The residual add (xold: y, loaded when the group started), the next RMSNorm's input
      // dtype(weight ⊙ y) and the group's sum of squares per token: lanes r·N + t of the
      // group's 4 rows, summed (r0 + r1) + (r2 + r3).
      const bool valid = mine && t < n && j < a.m;
      const float y = xold + v;
      float sq = valid ? y * y : 0.f;
      sq += __shfl_xor_sync(0xffffffffu, sq, N);
      sq += __shfl_xor_sync(0xffffffffu, sq, 2 * N);
      if (!valid) return;
      static_cast<float*>(a.y)[t * a.m + j] = y;
      static_cast<T*>(a.rms_x)[t * a.m + j] = vec::FromF32<T>(gnext * y);
      if (r == 0) a.rms_partials[t * ((a.m + kRows - 1) / kRows) + g] = sq;
      return;
    }
    if (!mine || t >= n || j >= a.m) return;
    if constexpr (E == GemvEpilogue::kAccumulateF32) {
      // One fp32 add per element (this kernel adds each once: y + v rounded as `y += v`, except
      // that red.add.f32 flushes subnormal inputs and results to zero), as a reduction the SM
      // does not wait for (RED): no load round trip in the group's epilogue.
      atomicAdd(static_cast<float*>(a.y) + t * a.m + j, v);
    } else if constexpr (E == GemvEpilogue::kStoreF32) {
      static_cast<float*>(a.y)[t * a.m + j] = v;
    } else {
      static_cast<T*>(a.y)[t * a.m + j] = vec::FromF32<T>(v);
    }
  }
}

// e4m3 row scales of the groups a CTA has in flight (at most three: the one being finished
// and the next two): thread r < kRows holds row r's scale of group gi in slot gi % 3.
struct ScaleSlots {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f;
  __device__ __forceinline__ void Set(int gi, float v) {
    const int slot = gi % 3;
    if (slot == 0) {
      s0 = v;
    } else if (slot == 1) {
      s1 = v;
    } else {
      s2 = v;
    }
  }
  // In warp 0 (all lanes): the sum v of row r of group gi times its scale (s = scale · sum,
  // before any rounding) where `mine`.
  __device__ __forceinline__ float Apply(int gi, int r, bool mine, float v) const {
    const int slot = gi % 3;
    const float held = slot == 0 ? s0 : slot == 1 ? s1 : s2;
    const float sc = __shfl_sync(0xffffffffu, held, r % kRows);
    return mine ? v * sc : v;
  }
};

template <int N>
__device__ __forceinline__ void ZeroAcc(float (&acc)[kRows][N]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = 0.f;
  }
}

// A finished group's sums in a fixed order: lanes (shuffles), then warps (shared memory `part`,
// the scratch of the group's parity; `barrier` syncs the CTA's computing threads between the
// two); acc is zeroed for the next group. False in warps other than 0; in warp 0, lane (r, t) =
// (lane / N, lane % N) gets v = the sum of row r for token t (when lane < kRows · N).
template <int kWarps, int N, typename Barrier>
__device__ __forceinline__ bool ReduceGroup(float (&acc)[kRows][N], float (&part)[kWarps][kRows][N],
                                            Barrier barrier, float& v) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float s = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) part[warp][r][t] = s;
    }
  }
  ZeroAcc<N>(acc);
  barrier();
  static_assert(kRows * kGemvMaxTokens <= 32, "one lane per (row, token)");
  if (warp != 0) return false;
  v = 0.f;
  if (lane < kRows * N) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += part[w][lane / N][lane % N];
  }
  return true;
}

// Persistent over row groups: CTA b computes groups b, b + gridDim.x, b + 2 gridDim.x, ... (the
// grid is at most one wave, Gemv() sizes it). Its work is a sequence of items (group, stage),
// double buffered across group boundaries: the next item's weights are in flight while this
// one's FMAs, and a finished group's reduction and epilogue, run. Each group's sums reduce in
// the same fixed order as with one CTA per group.
// Fold: the folded RMSNorm (GemvArgs::rms_partials): kAccumulateF32 produces, the others
// consume.
template <typename T, typename W, GemvEpilogue E, bool Norm, bool Fold, int N>
__global__ void __launch_bounds__(W::kThreads, N == 1 ? (Norm && !kIsFp8<W> ? 3 : W::kCtasPerSm)
                                                      : 1) GemvKernel(GemvArgs a) {
  constexpr int kWarps = W::kThreads / 32;
  constexpr bool kFoldOut = Fold && E == GemvEpilogue::kAccumulateF32;
  constexpr bool kFoldIn = Fold && !kFoldOut;
  using Element = typename W::Element;
  static_assert(sizeof(Element) * kChunk * W::kSubChunks == 16, "16-byte weight chunks");
  const int64_t chunks = a.k / (kChunk * W::kSubChunks);  // 16-byte chunks per weight row
  const int stages = static_cast<int>((chunks + W::kStageChunks - 1) / W::kStageChunks);
  const int64_t stride = gridDim.x;
  const int my_groups = static_cast<int>((NumGroups<E>(a) - 1 - blockIdx.x) / stride + 1);
  const int items = my_groups * stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  ScaleSlots scales;  // e4m3
  auto group_of = [&](int item) { return int64_t(blockIdx.x) + (item / stages) * stride; };
  auto load = [&](Stage& st, int item) {
    const int64_t g = group_of(item);
    const int stage = item % stages;
    LoadStage<W, E>(st, a, g, stage, chunks);
    if constexpr (kIsFp8<W>) {
      if (stage == 0 && threadIdx.x < kRows) {
        scales.Set(item / stages, a.w_scale[WeightRow<E>(a, g, threadIdx.x)]);
      }
    }
  };
  // Weights are immutable: the first two items stream in before the previous kernel completes.
  Stage s0, s1;
  load(s0, 0);
  if (items > 1) load(s1, 1);
  PdlWait();
  PdlTrigger();
  const int n = static_cast<int>(a.n);
  // The prologue's normalized rows (dynamic shared memory, kGemvNormSharedBytes).
  extern __shared__ uint4 xs[];
  if constexpr (Norm) NormalizeToShared<T, W::kThreads, N>(a, n, xs);
  __shared__ RopeStage<N> rope_stage;
  if constexpr (E == GemvEpilogue::kRopeAppendKv) StageRope<N>(a, n, W::kThreads, rope_stage);
  // Consumer: each warp's share of the sums of squares per token (read by warp 0 after the
  // first group's barrier); the loads stall only this prologue, with two items of weights in
  // flight.
  __shared__ float rms_part[kFoldIn ? kWarps : 1][N];
  if constexpr (kFoldIn) {
    float ss[N];
#pragma unroll
    for (int t = 0; t < N; ++t) ss[t] = 0.f;
    const int64_t np = a.rms_num_partials;
    // 8 loads per thread in flight per round (one round for 1024 partials at 256 threads).
    constexpr int kLoads = 8;
#pragma unroll 1
    for (int64_t i0 = threadIdx.x; i0 < np; i0 += kLoads * W::kThreads) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t >= n) break;
        float v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int64_t i = i0 + u * W::kThreads;
          v[u] = i < np ? a.rms_partials[t * np + i] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) ss[t] += v[u];
      }
    }
#pragma unroll
    for (int t = 0; t < N; ++t) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss[t] += __shfl_xor_sync(0xffffffffu, ss[t], o);
      if (lane == 0) rms_part[warp][t] = ss[t];
    }
  }
  // Producer: warp 0's lane (r, t) holds y[t, j] of row r of the group in progress and the
  // next RMSNorm's weight[j], loaded when the group's first stage starts (after PdlWait: y is
  // the previous kernels' residual), used by its epilogue.
  float xold = 0.f, gnext = 0.f;
  auto begin_group = [&](int item) {
    if constexpr (kFoldOut) {
      if (item % stages != 0 || warp != 0 || lane >= kRows * N) return;
      const int r = lane / N, t = lane % N;
      const int64_t j = group_of(item) * kRows + r;
      if (t < n && j < a.m) {
        xold = LoadF32InOrder(static_cast<const float*>(a.y) + t * a.m + j);
        gnext = LoadF32InOrder(a.rms_weight + j);
      }
    }
  };
  __shared__ float part[2][kWarps][kRows][N];  // by group parity: one barrier per group
  __shared__ float total[kRows][N];            // warp 0's epilogue scratch
  float acc[kRows][N];
  auto zero = [&] { ZeroAcc<N>(acc); };
  // After item `item`'s FMAs: when it was its group's last stage, reduce and finish the group.
  auto finish = [&](int item) {
    if (item % stages != stages - 1) return;
    const int gi = item / stages;
    float v;
    if (!ReduceGroup<kWarps, N>(
            acc, part[gi & 1], [] { __syncthreads(); }, v))
      return;
    const int r = lane / N, t = lane % N;
    const bool mine = lane < kRows * N;
    if constexpr (kIsFp8<W>) v = scales.Apply(gi, r, mine, v);
    if constexpr (kFoldIn) {  // the RMSNorm's 1 / rms, as cuda::AddRmsNorm computes it
      if (mine) {
        float ss = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) ss += rms_part[w][t];
        v *= 1.f / sqrtf(ss / static_cast<float>(a.k) + a.eps);
      }
    }
    Epilogue<T, E, Fold, N>(a, group_of(item), r, t, mine, v, total, rope_stage, xold, gnext);
  };
  // Each buffer is refilled with the item after next as soon as its FMAs have consumed it,
  // before the group's reduction.
  zero();
  for (int it = 0; it < items; it += 2) {
    begin_group(it);
    FmaStage<T, W, Norm, N>(s0, a, xs, n, it % stages, chunks, acc);
    if (it + 2 < items) load(s0, it + 2);
    finish(it);
    if (it + 1 < items) {
      begin_group(it + 1);
      FmaStage<T, W, Norm, N>(s1, a, xs, n, (it + 1) % stages, chunks, acc);
      if (it + 3 < items) load(s1, it + 3);
      finish(it + 1);
    }
  }
}

// ---- The ring kernel (GemvArgs::ring) ------------------------------------------------------
// Its weights come through a ring of stages in shared memory, filled by bulk copies that one
// producer warp issues as soon as a slot is free, so the registers hold no weights in flight
// and a CTA is one per SM at ~100 KiB: the next kernel's CTAs fit beside it. It lets dependents
// launch first thing (PdlTrigger before PdlWait), and its producer starts streaming before the
// previous kernel has finished (weights are immutable): a GEMV after an RMSNorm or the decode
// attention has its first GemvArgs::ring_kib per SM in shared memory before it may read x. Items,
// chunks per thread, FMAs and the reduction order are those of GemvKernel: the same bits.
template <typename W>
struct Ring {
  static constexpr int kRowBytes = W::kStageChunks * 16;  // a row's share of a stage
  static constexpr int kSlotBytes = kRows * kRowBytes;    // one (group, stage) item
  // Slots of a ring of `kib` KiB (at least 2), and the dynamic shared memory they take with
  // their two mbarriers each.
  __host__ __device__ static int Slots(int kib) {
    const int s = kib * 1024 / kSlotBytes;
    return s < 2 ? 2 : s;
  }
  static size_t SmemBytes(int kib) { return size_t(Slots(kib)) * (kSlotBytes + 16); }
};

template <typename T, typename W, GemvEpilogue E, int N>
__global__ void __launch_bounds__(W::kThreads + 32, 2) GemvRingKernel(GemvArgs a) {
  using R = Ring<W>;
  constexpr int kWarps = W::kThreads / 32;  // computing warps; warp kWarps is the producer
  static_assert(kUnroll == 1, "a slot holds one 16-byte chunk per row per computing thread");
  PdlTrigger();
  extern __shared__ __align__(128) uint8_t ring_smem[];
  const uint32_t ring = SmemAddr(ring_smem);
  const int num_slots = R::Slots(a.ring_kib);
  const uint32_t full = ring + num_slots * R::kSlotBytes;  // slot s: full + 8 s, empty + 8 s
  const uint32_t empty = full + 8 * num_slots;
  const int64_t chunks = a.k / (kChunk * W::kSubChunks);
  const int stages = static_cast<int>((chunks + W::kStageChunks - 1) / W::kStageChunks);
  const int64_t stride = gridDim.x;
  const int my_groups = static_cast<int>((NumGroups<E>(a) - 1 - blockIdx.x) / stride + 1);
  const int items = my_groups * stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto group_of = [&](int item) { return int64_t(blockIdx.x) + (item / stages) * stride; };
  if (threadIdx.x == 0) {
    for (int i = 0; i < num_slots; ++i) {
      MbarInit(full + 8 * i, 1);
      MbarInit(empty + 8 * i, kWarps);  // one arrival per computing warp
    }
    MbarInitFence();
  }
  __syncthreads();
  if (warp == kWarps) {  // the producer: item it into slot it % kSlots once that slot is free
    if (lane != 0) return;
    using Element = typename W::Element;
    const uint64_t policy = L2EvictFirstPolicy();
#pragma unroll 1
    for (int it = 0; it < items; ++it) {
      const int slot = it % num_slots, use = it / num_slots;
      // No slot frees before the computing warps pass PdlWait: wait there too (unbounded), not
      // in MbarWait's bounded spin, however long the kernels before this one run.
      if (it == num_slots) PdlWait();
      if (use > 0) MbarWait(empty + 8 * slot, (use - 1) & 1);
      const int64_t g = group_of(it);
      const int64_t c0 = int64_t(it % stages) * W::kStageChunks;
      const int64_t left = chunks - c0;
      const uint32_t bytes = uint32_t((left < W::kStageChunks ? left : W::kStageChunks) * 16);
      MbarExpectTx(full + 8 * slot, kRows * bytes);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const Element* row = static_cast<const Element*>(a.w) + WeightRow<E>(a, g, r) * a.k;
        BulkLoad(ring + slot * R::kSlotBytes + r * R::kRowBytes,
                 reinterpret_cast<const uint4*>(row) + c0, bytes, full + 8 * slot, policy);
      }
    }
    return;
  }
  // The computing warps. e4m3: the scales of the first two groups before PdlWait, then two
  // groups ahead.
  ScaleSlots scales;
  auto load_scale = [&](int gi) {
    if (kIsFp8<W> && threadIdx.x < kRows && gi < my_groups) {
      const int64_t g = int64_t(blockIdx.x) + gi * stride;
      scales.Set(gi, LoadF32InOrder(a.w_scale + WeightRow<E>(a, g, threadIdx.x)));
    }
  };
  load_scale(0);
  load_scale(1);
  PdlWait();
  const int n = static_cast<int>(a.n);
  __shared__ RopeStage<N> rope_stage;
  if constexpr (E == GemvEpilogue::kRopeAppendKv) StageRope<N>(a, n, W::kThreads, rope_stage);
  __shared__ float part[2][kWarps][kRows][N];  // by group parity: one barrier per group
  __shared__ float total[kRows][N];            // warp 0's epilogue scratch
  float acc[kRows][N];
  ZeroAcc<N>(acc);
  const uint4* slots = reinterpret_cast<const uint4*>(ring_smem);
#pragma unroll 1
  for (int it = 0; it < items; ++it) {
    const int slot = it % num_slots, stage = it % stages, gi = it / stages;
    if (stage == 0) load_scale(gi + 2);
    MbarWait(full + 8 * slot, (it / num_slots) & 1);
    Stage st;
    const int64_t c = int64_t(stage) * W::kStageChunks + threadIdx.x;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      st.w[r][0] = c < chunks ? slots[(slot * kRows + r) * W::kStageChunks + threadIdx.x] : uint4{};
    }
    __syncwarp();
    if (lane == 0) MbarArrive(empty + 8 * slot);  // this warp is done with the slot
    FmaStage<T, W, false, N>(st, a, nullptr, n, stage, chunks, acc);
    if (stage != stages - 1) continue;
    float v;
    if (!ReduceGroup<kWarps, N>(
            acc, part[gi & 1], [] { NamedBarrier(1, W::kThreads); }, v)) {
      continue;
    }
    const int r = lane / N, t = lane % N;
    const bool mine = lane < kRows * N;
    if constexpr (kIsFp8<W>) v = scales.Apply(gi, r, mine, v);
    Epilogue<T, E, false, N>(a, group_of(it), r, t, mine, v, total, rope_stage, 0.f, 0.f);
  }
}

template <typename T, typename W, GemvEpilogue E, int N>
void LaunchRing(const GemvArgs& a, cudaStream_t stream) {
  auto* kernel = GemvRingKernel<T, W, E, N>;
  // Every call (a per-device host attribute; allowed while a stream is captured).
  const size_t smem = Ring<W>::SmemBytes(a.ring_kib);
  LLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int64_t ctas = std::min<int64_t>(NumGroups<E>(a), int64_t(NumSms()) * std::max(a.waves, 1));
  if (a.max_ctas > 0) ctas = std::min<int64_t>(ctas, a.max_ctas);
  Launch(kernel, dim3(static_cast<unsigned>(ctas)), dim3(W::kThreads + 32), smem, stream, a);
}

// One persistent wave: min(row groups, SMs × resident CTAs of this instantiation).
template <typename T, typename W, GemvEpilogue E, bool Norm, bool Fold, int N>
void LaunchPersistent(const GemvArgs& a, cudaStream_t stream) {
  static std::atomic<int> ctas_per_sm{0};  // the same on every device of a process (one arch)
  int per_sm = ctas_per_sm.load(std::memory_order_relaxed);
  // With the prologue, occupancy at the largest row it may hold (an upper bound on its shared
  // memory: registers bound the CTAs per SM first).
  const size_t smem = Norm ? size_t(a.n * a.k) * sizeof(T) : 0;
  if (per_sm == 0) {
    LLM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, GemvKernel<T, W, E, Norm, Fold, N>, W::kThreads, Norm ? kGemvNormSharedBytes : 0));
    per_sm = std::max(per_sm, 1);
    ctas_per_sm.store(per_sm, std::memory_order_relaxed);
  }
  const int64_t groups = NumGroups<E>(a);
  const int64_t slots = int64_t(NumSms()) * per_sm * a.waves;
  int64_t ctas = a.waves <= 0 ? groups : std::min(groups, slots);
  if (a.max_ctas > 0) ctas = std::min<int64_t>(ctas, a.max_ctas);
  const dim3 grid(static_cast<unsigned>(ctas));
  Launch(GemvKernel<T, W, E, Norm, Fold, N>, grid, dim3(W::kThreads), smem, stream, a);
}

template <typename T, typename W, GemvEpilogue E, bool Norm, bool Fold = false>
void LaunchN(const GemvArgs& a, cudaStream_t stream) {
  if constexpr (!Norm && !Fold) {
    if (a.ring) {
      if (a.n <= 1) return LaunchRing<T, W, E, 1>(a, stream);
      if (a.n <= 2) return LaunchRing<T, W, E, 2>(a, stream);
      if (a.n <= 4) return LaunchRing<T, W, E, 4>(a, stream);
      return LaunchRing<T, W, E, 8>(a, stream);
    }
  }
  if (a.n <= 1) {
    LaunchPersistent<T, W, E, Norm, Fold, 1>(a, stream);
  } else if (a.n <= 2) {
    LaunchPersistent<T, W, E, Norm, Fold, 2>(a, stream);
  } else if (a.n <= 4) {
    LaunchPersistent<T, W, E, Norm, Fold, 4>(a, stream);
  } else {
    LaunchPersistent<T, W, E, Norm, Fold, 8>(a, stream);
  }
}

// The folded RMSNorm (bf16 only: GemvSupports).
template <typename W>
void LaunchFolded(const GemvArgs& a, cudaStream_t stream) {
  using E = GemvEpilogue;
  using B = __nv_bfloat16;
  switch (a.epilogue) {
    case E::kAccumulateF32:
      return LaunchN<B, W, E::kAccumulateF32, false, true>(a, stream);
    case E::kStore:
      return LaunchN<B, W, E::kStore, false, true>(a, stream);
    case E::kSiluMul:
      return LaunchN<B, W, E::kSiluMul, false, true>(a, stream);
    case E::kRopeAppendKv:
      return LaunchN<B, W, E::kRopeAppendKv, false, true>(a, stream);
    case E::kStoreF32:
      break;
  }
  throw std::invalid_argument("Gemv: no folded RMSNorm with kStoreF32");
}

template <typename T>
void LaunchT(const GemvArgs& a, cudaStream_t stream) {
  using E = GemvEpilogue;
  using D = DTypeWeights<T>;
  const bool norm = a.norm_weight != nullptr;
  if (a.rms_partials != nullptr) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return a.w_scale != nullptr ? LaunchFolded<Fp8Weights>(a, stream)
                                  : LaunchFolded<D>(a, stream);
    }
    throw std::invalid_argument("Gemv: the folded RMSNorm needs bf16");
  }
  if (a.w_scale != nullptr) {  // e4m3 weights
    using F = Fp8Weights;
    switch (a.epilogue) {
      case E::kStore:
        return norm ? LaunchN<T, F, E::kStore, true>(a, stream)
                    : LaunchN<T, F, E::kStore, false>(a, stream);
      case E::kStoreF32:
        return LaunchN<T, F, E::kStoreF32, false>(a, stream);
      case E::kAccumulateF32:
        return LaunchN<T, F, E::kAccumulateF32, false>(a, stream);
      case E::kSiluMul:
        return norm ? LaunchN<T, F, E::kSiluMul, true>(a, stream)
                    : LaunchN<T, F, E::kSiluMul, false>(a, stream);
      case E::kRopeAppendKv:
        return norm ? LaunchN<T, F, E::kRopeAppendKv, true>(a, stream)
                    : LaunchN<T, F, E::kRopeAppendKv, false>(a, stream);
    }
    return;
  }
  switch (a.epilogue) {
    case E::kStore:
      return norm ? LaunchN<T, D, E::kStore, true>(a, stream)
                  : LaunchN<T, D, E::kStore, false>(a, stream);
    case E::kStoreF32:
      return LaunchN<T, D, E::kStoreF32, false>(a, stream);
    case E::kAccumulateF32:
      return LaunchN<T, D, E::kAccumulateF32, false>(a, stream);
    case E::kSiluMul:
      return norm ? LaunchN<T, D, E::kSiluMul, true>(a, stream)
                  : LaunchN<T, D, E::kSiluMul, false>(a, stream);
    case E::kRopeAppendKv:
      return norm ? LaunchN<T, D, E::kRopeAppendKv, true>(a, stream)
                  : LaunchN<T, D, E::kRopeAppendKv, false>(a, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool RopeOk(const GemvArgs& a) {
  const GemvRope& r = a.rope;
  return r.head_dim > 0 && r.head_dim % 4 == 0 && r.head_dim <= 2 * kRopeMaxHalf &&
         r.num_heads > 0 && r.num_kv_heads > 0 &&
         a.m == int64_t(r.num_heads + 2 * r.num_kv_heads) * r.head_dim && r.positions &&
         r.slot_mapping && r.inv_freq && r.k_cache && r.v_cache &&
         r.layout.head_dim == r.head_dim && r.layout.num_kv_heads == r.num_kv_heads;
}

}  // namespace

bool GemvSupports(const GemvArgs& a) {
  using E = GemvEpilogue;
  const bool norm_ok =
      a.norm_weight == nullptr ||
      ((a.epilogue == E::kStore || a.epilogue == E::kSiluMul || a.epilogue == E::kRopeAppendKv) &&
       Aligned16(a.norm_weight) && GemvNormFits(a.n, a.k));
  // The folded RMSNorm: bf16, not with the prologue; the producer needs its outputs, the
  // consumer its count.
  const bool fold_ok =
      a.rms_partials == nullptr ||
      (a.dtype == DType::kBF16 && a.norm_weight == nullptr &&
       (a.epilogue == E::kAccumulateF32
            ? a.rms_weight != nullptr && a.rms_x != nullptr
            : a.epilogue != E::kStoreF32 && a.rms_num_partials == (a.k + kRows - 1) / kRows));
  // The ring kernel: no RMSNorm prologue or fold; a ring that fits beside the static scratch.
  const bool ring_ok = !a.ring || (a.norm_weight == nullptr && a.rms_partials == nullptr &&
                                   a.ring_kib >= 1 && a.ring_kib <= kGemvMaxRingKib);
  const bool fp8 = a.w_scale != nullptr;  // 16 codes per 16-byte chunk
  const int64_t chunk_elements = fp8 ? 2 * kChunk : kChunk;
  return a.n >= 1 && a.n <= kGemvMaxTokens && a.k > 0 && a.k % chunk_elements == 0 && a.m > 0 &&
         (a.epilogue != E::kSiluMul || a.m % 2 == 0) &&
         (a.dtype == DType::kBF16 || a.dtype == DType::kF16) && Aligned16(a.x) && Aligned16(a.w) &&
         a.y != nullptr && norm_ok && fold_ok && ring_ok &&
         (a.epilogue != E::kRopeAppendKv || RopeOk(a));
}

void Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (!GemvSupports(a)) {
    throw std::invalid_argument(
        "Gemv: unsupported shape n=" + std::to_string(a.n) + " m=" + std::to_string(a.m) +
        " k=" + std::to_string(a.k) +
        " (n in [1, 8], k % 8 == 0 (fp8 weights: k % 16 == 0), even m "
        "for SiLU·mul, 16-byte aligned, bf16/f16, RMSNorm prologue only "
        "with store, SiLU·mul or RoPE and n·k·2 <= " +
        std::to_string(kGemvNormSharedBytes) +
        " bytes, the folded RMSNorm only bf16 and without the prologue, the ring kernel "
        "without either, "
        "RoPE shapes matching the KV layout)");
  }
  if (a.dtype == DType::kBF16) {
    LaunchT<__nv_bfloat16>(a, stream);
  } else {
    LaunchT<__half>(a, stream);
  }
}

}  // namespace llm::cuda
