// The small-batch GEMV's device code shared by its two kernels (design in gemv.h): the
// register kernel (gemv.cu) and the ring kernel (gemv_ring.cu). The weight formats, the row
// groups and their stages, the FMA loop, the fused epilogues and the fixed-order reduction, so
// that both kernels compute the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/fp8.h"

namespace llm::cuda {

// The ring kernel for every dtype, weight format, epilogue and n (gemv_ring.cu); Gemv() calls
// it for GemvArgs::ring after its checks.
void GemvRingLaunch(const GemvArgs& a, cudaStream_t stream);

namespace gemv_detail {

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
    gemv_detail::Unpack<T>(v, f);
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
  // before any rounding) where `mine`. A product rounded on its own (__fmul_rn: never
  // contracted into an FMA with what the epilogue adds next, such as the folded residual's
  // xold + s): where every lane is `mine` (kRows · N = 32) the compiler fused it into
  // fma(sum, scale, xold) in one kernel and not in another, and fused it at n = 8 but not at
  // n <= 4 (a token's residual depended on the batch size).
  __device__ __forceinline__ float Apply(int gi, int r, bool mine, float v) const {
    const int slot = gi % 3;
    const float held = slot == 0 ? s0 : slot == 1 ? s1 : s2;
    const float sc = __shfl_sync(0xffffffffu, held, r % kRows);
    return mine ? __fmul_rn(v, sc) : v;
  }
};

// The folded RMSNorm's producer (kAccumulateF32 with rms_partials): lane (r, t) of warp 0, at
// its group's first stage, loads y[t, j] (the residual it adds to) and the next RMSNorm's
// weight[j] for the group's epilogue.
__device__ __forceinline__ void LoadFoldRow(const GemvArgs& a, int t, int n, int64_t j, float& xold,
                                            float& gnext) {
  if (t < n && j < a.m) {
    xold = ptx::LoadF32InOrder(static_cast<const float*>(a.y) + t * a.m + j);
    gnext = ptx::LoadF32InOrder(a.rms_weight + j);
  }
}

// The folded RMSNorm's consumer prologue (GemvArgs::rms_partials): each warp's share of the
// sums of squares per token into rms_part[warp][t], summed by warp 0 after a group's barrier
// in a fixed order. 8 loads per thread in flight per round (one round for 1024 partials at 256
// threads).
template <int kThreads, int N>
__device__ __forceinline__ void SumPartials(const GemvArgs& a, int n,
                                            float (&rms_part)[kThreads / 32][N]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float ss[N];
#pragma unroll
  for (int t = 0; t < N; ++t) ss[t] = 0.f;
  const int64_t np = a.rms_num_partials;
  constexpr int kLoads = 8;
#pragma unroll 1
  for (int64_t i0 = threadIdx.x; i0 < np; i0 += kLoads * kThreads) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) break;
      float v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t i = i0 + u * kThreads;
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

}  // namespace gemv_detail
}  // namespace llm::cuda
