// Mixture-of-experts kernels (kernels/cuda/moe/moe.h): routing, grouping, the grouped GEMM and
// the combine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/moe/moe.h"

namespace llm::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRouteWarps = 4;      // tokens per routing CTA, one warp each
constexpr int kGroupThreads = 256;  // the counting and placing CTAs (one per expert)

// ---- routing: one warp per token ------------------------------------------------------------

__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteKernel(const float* logits, int num_tokens, int num_experts, int top_k, bool normalize,
                   int32_t* experts, float* weights) {
  PdlWait();
  PdlTrigger();
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * kRouteWarps + threadIdx.x / 32;
  if (t >= num_tokens) return;  // a whole warp
  constexpr int kPer = kMoeMaxExperts / 32;
  // Lane l holds experts l, l + 32, ...: within a lane, ascending index.
  float p[kPer];
  const float* row = logits + int64_t(t) * num_experts;
  float max_v = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < num_experts ? row[e] : -INFINITY;
    max_v = fmaxf(max_v, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) max_v = fmaxf(max_v, __shfl_xor_sync(kFullMask, max_v, o));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    p[i] = lane + 32 * i < num_experts ? expf(p[i] - max_v) : 0.f;
    sum += p[i];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFullMask, sum, o);
    // Probabilities >= 0; a chosen or absent expert is marked -1. A non-finite logit makes them
    // NaN: those count as 0, so that the top k are still k distinct real experts (the lowest
    // indices) and no later kernel indexes past the experts (the token's output is NaN anyway).
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float q = p[i] / sum;
    p[i] = lane + 32 * i < num_experts ? (q >= 0.f ? q : 0.f) : -1.f;
  }
  float chosen_v[kMoeMaxTopK];
  float chosen_sum = 0.f;
  for (int j = 0; j < top_k; ++j) {
    float best_v = -1.f;
    int best_e = kMoeMaxExperts;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (p[i] > best_v) {  // strict: the lane's lower index wins a tie
        best_v = p[i];
        best_e = lane + 32 * i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(kFullMask, best_v, o);
      const int e = __shfl_xor_sync(kFullMask, best_e, o);
      if (v > best_v || (v == best_v && e < best_e)) {
        best_v = v;
        best_e = e;
      }
    }
    if (lane == best_e % 32) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (i == best_e / 32) p[i] = -1.f;
      }
    }
    chosen_v[j] = best_v;
    chosen_sum += best_v;  // in rank order, as cpu::MoeRoute
    if (lane == 0) experts[int64_t(t) * top_k + j] = best_e;
  }
  if (lane == 0) {
    for (int j = 0; j < top_k; ++j) {
      weights[int64_t(t) * top_k + j] = normalize ? chosen_v[j] / chosen_sum : chosen_v[j];
    }
  }
}

// ---- grouping: counts, offsets and tiles, then each expert's pairs in pair order ------------

// Block-wide sum of one int per thread (kGroupThreads threads); every thread gets it.
__device__ int BlockSum(int v, int* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  int total = 0;
  for (int w = 0; w < kGroupThreads / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// CTA e: offsets[e + 1] = the number of pairs routed to expert e (MoeScanKernel sums them).
__global__ void __launch_bounds__(kGroupThreads)
    MoeCountKernel(const int32_t* experts, int num_pairs, int32_t* offsets) {
  __shared__ int scratch[kGroupThreads / 32];
  PdlWait();
  PdlTrigger();
  const int e = blockIdx.x;
  int c = 0;
  for (int p = threadIdx.x; p < num_pairs; p += kGroupThreads) c += experts[p] == e;
  c = BlockSum(c, scratch);
  if (threadIdx.x == 0) offsets[e + 1] = c;
}

// One thread: the counts become offsets, and each expert's rows are cut into tiles.
__global__ void MoeScanKernel(int num_experts, int32_t* offsets, int32_t* tile_expert,
                              int32_t* tile_begin, int32_t* num_tiles) {
  PdlWait();
  PdlTrigger();
  if (threadIdx.x != 0) return;
  offsets[0] = 0;
  int tiles = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int count = offsets[e + 1];
    offsets[e + 1] = offsets[e] + count;
    for (int b = 0; b < count; b += kMoeTileRows) {
      tile_expert[tiles] = e;
      tile_begin[tiles] = offsets[e] + b;
      ++tiles;
    }
  }
  *num_tiles = tiles;
}

// CTA e: expert e's pairs, in pair order, at its offset: a block-wide exclusive scan of
// "routed to e" over chunks of the pairs (no atomics: the order is deterministic).
__global__ void __launch_bounds__(kGroupThreads)
    MoePlaceKernel(const int32_t* experts, int num_pairs, const int32_t* offsets,
                   int32_t* sorted_pairs, int32_t* pair_rows) {
  __shared__ int warp_counts[kGroupThreads / 32];
  PdlWait();
  PdlTrigger();
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int base = offsets[e];
  const int end = offsets[e + 1];
  for (int start = 0; start < num_pairs && base < end; start += kGroupThreads) {
    const int p = start + threadIdx.x;
    const bool mine = p < num_pairs && experts[p] == e;
    const unsigned ballot = __ballot_sync(kFullMask, mine);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kGroupThreads / 32; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (mine) {
      const int row = base + before + __popc(ballot & ((1u << lane) - 1u));
      sorted_pairs[row] = p;
      pair_rows[p] = row;
    }
    base += total;
    __syncthreads();  // warp_counts is rewritten by the next chunk
  }
}

// kV2: the whole grouping in one CTA. Counts by shared-memory atomics (exact in any order), the
// scan and the tile map, then the pairs placed chunk by chunk in pair order: a pair's row is its
// expert's running base, plus its expert's pairs in the chunk's earlier warps, plus its rank
// among its warp's lanes of the same expert (__match_any_sync).
constexpr int kGroupOneThreads = 1024;

__global__ void __launch_bounds__(kGroupOneThreads)
    MoeGroupOneKernel(const int32_t* experts, int num_pairs, int num_experts, int32_t* offsets,
                      int32_t* sorted_pairs, int32_t* pair_rows, int32_t* tile_expert,
                      int32_t* tile_begin, int32_t* num_tiles) {
  constexpr int kWarps = kGroupOneThreads / 32;
  __shared__ int base[kMoeMaxExperts];  // counts, then each expert's next row
  __shared__ int start[kMoeMaxExperts + 1], tile_start[kMoeMaxExperts + 1];
  __shared__ int warp_count[kWarps][kMoeMaxExperts];
  PdlWait();
  PdlTrigger();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int e = tid; e < num_experts; e += kGroupOneThreads) base[e] = 0;
  for (int i = tid; i < kWarps * kMoeMaxExperts; i += kGroupOneThreads) {
    warp_count[i / kMoeMaxExperts][i % kMoeMaxExperts] = 0;
  }
  __syncthreads();
  for (int p = tid; p < num_pairs; p += kGroupOneThreads) atomicAdd(&base[experts[p]], 1);
  __syncthreads();
  if (warp == 0) {  // exclusive scans of the counts and of the tiles, 8 experts a lane
    constexpr int kPer = kMoeMaxExperts / 32;
    int rows = 0, tiles = 0;
    for (int i = 0; i < kPer; ++i) {
      const int e = lane * kPer + i;
      const int c = e < num_experts ? base[e] : 0;
      rows += c;
      tiles += (c + kMoeTileRows - 1) / kMoeTileRows;
    }
    int rows_before = rows, tiles_before = tiles;  // inclusive warp scans, then exclusive
    for (int o = 1; o < 32; o <<= 1) {
      const int r = __shfl_up_sync(kFullMask, rows_before, o);
      const int t = __shfl_up_sync(kFullMask, tiles_before, o);
      if (lane >= o) {
        rows_before += r;
        tiles_before += t;
      }
    }
    rows_before -= rows;
    tiles_before -= tiles;
    for (int i = 0; i < kPer; ++i) {
      const int e = lane * kPer + i;
      if (e < num_experts) {
        start[e] = rows_before;
        tile_start[e] = tiles_before;
        rows_before += base[e];
        tiles_before += (base[e] + kMoeTileRows - 1) / kMoeTileRows;
      }
    }
    if (lane == 31) {  // the last lane's running sums are the totals
      start[num_experts] = rows_before;
      tile_start[num_experts] = tiles_before;
    }
  }
  __syncthreads();
  for (int e = tid; e < num_experts; e += kGroupOneThreads) {
    offsets[e] = start[e];
    int t = tile_start[e];
    for (int b = start[e]; b < start[e + 1]; b += kMoeTileRows, ++t) {
      tile_expert[t] = e;
      tile_begin[t] = b;
    }
    base[e] = start[e];
  }
  if (tid == 0) {
    offsets[num_experts] = start[num_experts];
    *num_tiles = tile_start[num_experts];
  }
  __syncthreads();
  for (int chunk = 0; chunk < num_pairs; chunk += kGroupOneThreads) {
    const int p = chunk + tid;
    const int e = p < num_pairs ? experts[p] : -1;
    const unsigned peers = __match_any_sync(kFullMask, e);
    const bool leader = lane == __ffs(peers) - 1;
    if (leader && e >= 0) warp_count[warp][e] = __popc(peers);
    __syncthreads();
    if (e >= 0) {
      int row = base[e] + __popc(peers & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) row += warp_count[w][e];
      sorted_pairs[row] = p;
      pair_rows[p] = row;
    }
    __syncthreads();
    for (int x = tid; x < num_experts; x += kGroupOneThreads) {
      int added = 0;
      for (int w = 0; w < kWarps; ++w) added += warp_count[w][x];
      base[x] += added;
    }
    __syncthreads();
    if (leader && e >= 0) warp_count[warp][e] = 0;
    __syncthreads();
  }
}

// ---- the grouped GEMM: mma.sync m16n8k16 tiles of 64 sorted rows x 64 outputs -----------------

constexpr int kGemmThreads = 128;  // 4 warps, 2 x 2, each 32 x 32 of the tile
constexpr int kBm = kMoeTileRows, kBn = 64, kBk = 32;
constexpr int kSmemStride = kBk + 8;  // 80-byte rows: ldmatrix without bank conflicts

// kStages k-tiles in flight (cp.async groups): 2 (kV1), 4 (kV2).
template <typename T, bool kOutF32, int kStages>
__global__ void __launch_bounds__(kGemmThreads)
    MoeGemmKernel(const T* x, bool gather, int top_k, const T* w, void* out, int n, int k,
                  const int32_t* sorted_pairs, const int32_t* offsets, const int32_t* tile_expert,
                  const int32_t* tile_begin, const int32_t* num_tiles) {
  __shared__ alignas(16) T a_s[kStages][kBm][kSmemStride];
  __shared__ alignas(16) T b_s[kStages][kBn][kSmemStride];
  __shared__ int a_rows[kBm];
  PdlWait();
  PdlTrigger();
  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile], row0 = tile_begin[tile];
  const int rows = min(kBm, offsets[e + 1] - row0);
  const int n0 = blockIdx.x * kBn;
  const T* we = w + int64_t(e) * n * k;
  if (threadIdx.x < kBm) {
    const int r = row0 + int(threadIdx.x);
    a_rows[threadIdx.x] = int(threadIdx.x) < rows ? (gather ? sorted_pairs[r] / top_k : r) : -1;
  }
  __syncthreads();
  auto load = [&](int stage, int k0) {
    for (int c = threadIdx.x; c < kBm * kBk / 8; c += kGemmThreads) {
      const int r = c / (kBk / 8), col = k0 + (c % (kBk / 8)) * 8;
      const int src = a_rows[r];
      const bool ok = src >= 0 && col < k;
      ptx::CpAsync16(ptx::SmemAddr(&a_s[stage][r][col - k0]), ok ? x + int64_t(src) * k + col : x,
                     ok ? 16 : 0);
    }
    for (int c = threadIdx.x; c < kBn * kBk / 8; c += kGemmThreads) {
      const int r = c / (kBk / 8), col = k0 + (c % (kBk / 8)) * 8;
      const bool ok = n0 + r < n && col < k;
      ptx::CpAsync16(ptx::SmemAddr(&b_s[stage][r][col - k0]),
                     ok ? we + int64_t(n0 + r) * k + col : we, ok ? 16 : 0);
    }
    ptx::CpAsyncCommit();
  };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
  float acc[2][4][4] = {};
  const int k_tiles = (k + kBk - 1) / kBk;
  // Tiles 0 .. kStages - 2 in flight; each iteration waits for tile kt, then refills the
  // stage iteration kt - 1 read (every thread is past it: the barrier) with tile
  // kt + kStages - 1. An empty commit where no tile is left keeps the group count uniform.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < k_tiles) {
      load(st, st * kBk);
    } else {
      ptx::CpAsyncCommit();
    }
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      load(next % kStages, next * kBk);
    } else {
      ptx::CpAsyncCommit();
    }
    const int s = kt % kStages;
#pragma unroll
    for (int kk = 0; kk < kBk; kk += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        ptx::LdMatrixX4(a[mi],
                        ptx::SmemAddr(&a_s[s][wm + mi * 16 + lane % 16][kk + (lane / 16) * 8]));
      }
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        uint32_t b[4];
        const int nr = wn + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        ptx::LdMatrixX4(b, ptx::SmemAddr(&b_s[s][nr][kk + ((lane >> 3) & 1) * 8]));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          ptx::Mma16816<T>(acc[mi][2 * nj], a[mi], b[0], b[1]);
          ptx::Mma16816<T>(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
  ptx::CpAsyncWaitAll();  // no copy may land in shared memory after the CTA exits
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int col = n0 + wn + ni * 8 + c2;
      if (col >= n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm + mi * 16 + g + h * 8;
        if (r >= rows) continue;
        const int64_t at = int64_t(row0 + r) * n + col;
        const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if constexpr (kOutF32) {
          *reinterpret_cast<float2*>(static_cast<float*>(out) + at) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<uint32_t*>(static_cast<T*>(out) + at) = vec::PackPair<T>(v0, v1);
        }
      }
    }
  }
}

// ---- kV2, steps of at most kMoeGemvMaxTokens tokens: a GEMV over each chosen expert --------

// CTA (output block, tile): the tile's expert has rows <= kMoeGemvMaxTokens (one per token);
// each warp computes kGemvWarpRows output features for every row at once, its lanes streaming
// the weight rows in 16-byte chunks (each byte read once per tile) against the rows' inputs
// (a few KB, read through L1).
constexpr int kGemvThreads = 256;
constexpr int kGemvWarpRows = 2;
constexpr int kGemvCtaRows = kGemvThreads / 32 * kGemvWarpRows;

template <typename T, bool kOutF32>
__global__ void __launch_bounds__(kGemvThreads)
    MoeGemvKernel(const T* x, bool gather, int top_k, const T* w, void* out, int n, int k,
                  const int32_t* sorted_pairs, const int32_t* offsets, const int32_t* tile_expert,
                  const int32_t* tile_begin, const int32_t* num_tiles) {
  constexpr int kMaxRows = kMoeGemvMaxTokens;
  PdlWait();
  PdlTrigger();
  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j0 = blockIdx.x * kGemvCtaRows + warp * kGemvWarpRows;
  if (j0 >= n) return;  // a whole warp
  // The tile's rows (its expert's, at most one per token: <= kMaxRows when the host chose this
  // kernel), kMaxRows at a time should a caller break that.
  const int rows_end = min(tile_begin[tile] + kMoeTileRows, offsets[e + 1]);
  for (int row0 = tile_begin[tile]; row0 < rows_end; row0 += kMaxRows) {
    const int rows = min(kMaxRows, rows_end - row0);
    const T* in[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      const int row = row0 + min(r, rows - 1);
      in[r] = x + int64_t(gather ? sorted_pairs[row] / top_k : row) * k;
    }
    const T* we = w + int64_t(e) * n * k;
    float acc[kGemvWarpRows][kMaxRows] = {};
    for (int c = lane * vec::kVec; c < k; c += 32 * vec::kVec) {
      uint4 wv[kGemvWarpRows];
#pragma unroll
      for (int i = 0; i < kGemvWarpRows; ++i) {
        const int j = min(j0 + i, n - 1);
        wv[i] = ptx::LoadStream(reinterpret_cast<const uint4*>(we + int64_t(j) * k + c));
      }
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        if (r < rows) {
          const uint4 xv = *reinterpret_cast<const uint4*>(in[r] + c);
          const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
          for (int i = 0; i < kGemvWarpRows; ++i) {
            const T* w8 = reinterpret_cast<const T*>(&wv[i]);
#pragma unroll
            for (int q = 0; q < vec::kVec; ++q) {
              acc[i][r] = fmaf(vec::ToF32(w8[q]), vec::ToF32(xe[q]), acc[i][r]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kGemvWarpRows; ++i) {
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        float v = acc[i][r];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
        const int j = j0 + i;
        if (lane == 0 && r < rows && j < n) {
          const int64_t at = int64_t(row0 + r) * n + j;
          if constexpr (kOutF32) {
            static_cast<float*>(out)[at] = v;
          } else {
            static_cast<T*>(out)[at] = vec::FromF32<T>(v);
          }
        }
      }
    }
  }
}

// ---- the combine: one CTA per token ---------------------------------------------------------

constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* rows, const int32_t* experts, const float* weights,
                     const int32_t* pair_rows, int top_k, int hidden, float* residual,
                     bool accumulate) {
  PdlWait();
  PdlTrigger();
  const int64_t t = blockIdx.x;
  // The token's slots by ascending expert (insertion sort; every thread the same).
  int order[kMoeMaxTopK];
  for (int j = 0; j < top_k; ++j) {
    int i = j;
    while (i > 0 && experts[t * top_k + order[i - 1]] > experts[t * top_k + j]) {
      order[i] = order[i - 1];
      --i;
    }
    order[i] = j;
  }
  for (int h = threadIdx.x; h < hidden; h += kCombineThreads) {
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const int64_t p = t * top_k + order[j];
      acc += rows[int64_t(pair_rows[p]) * hidden + h] * weights[p];
    }
    float* dst = residual + t * hidden + h;
    *dst = accumulate ? *dst + acc : acc;
  }
}

void CheckRouting(const MoeRouting& r, const char* op) {
  if (!r.experts || !r.weights || !r.offsets || !r.sorted_pairs || !r.pair_rows || !r.tile_expert ||
      !r.tile_begin || !r.num_tiles) {
    throw std::invalid_argument(std::string(op) + ": a MoeRouting array is null");
  }
}

}  // namespace

void MoeRoute(const float* logits, int64_t num_tokens, int num_experts, int top_k, bool normalize,
              const MoeRouting& r, cudaStream_t stream, MoeKernels kernels) {
  CheckRouting(r, "MoeRoute");
  if (num_experts < 1 || num_experts > kMoeMaxExperts || top_k < 1 || top_k > kMoeMaxTopK ||
      top_k > num_experts) {
    throw std::invalid_argument("MoeRoute: " + std::to_string(num_experts) + " experts, top " +
                                std::to_string(top_k) + " (at most " +
                                std::to_string(kMoeMaxExperts) + " experts, top " +
                                std::to_string(kMoeMaxTopK) + ")");
  }
  if (num_tokens <= 0) return;
  const int pairs = int(num_tokens * top_k);
  Launch(MoeRouteKernel, dim3(unsigned((num_tokens + kRouteWarps - 1) / kRouteWarps)),
         dim3(kRouteWarps * 32), 0, stream, logits, int(num_tokens), num_experts, top_k, normalize,
         r.experts, r.weights);
  if (kernels == MoeKernels::kV2) {
    Launch(MoeGroupOneKernel, dim3(1), dim3(kGroupOneThreads), 0, stream,
           static_cast<const int32_t*>(r.experts), pairs, num_experts, r.offsets, r.sorted_pairs,
           r.pair_rows, r.tile_expert, r.tile_begin, r.num_tiles);
    LLM_CUDA_CHECK(cudaGetLastError());
    return;
  }
  Launch(MoeCountKernel, dim3(unsigned(num_experts)), dim3(kGroupThreads), 0, stream,
         static_cast<const int32_t*>(r.experts), pairs, r.offsets);
  Launch(MoeScanKernel, dim3(1), dim3(32), 0, stream, num_experts, r.offsets, r.tile_expert,
         r.tile_begin, r.num_tiles);
  Launch(MoePlaceKernel, dim3(unsigned(num_experts)), dim3(kGroupThreads), 0, stream,
         static_cast<const int32_t*>(r.experts), pairs, static_cast<const int32_t*>(r.offsets),
         r.sorted_pairs, r.pair_rows);
  LLM_CUDA_CHECK(cudaGetLastError());
}

void MoeGroupedGemm(const void* x, bool gather, int top_k, const void* w, DType dtype, void* out,
                    bool out_f32, int64_t n, int64_t k, int64_t num_pairs, int num_experts,
                    const MoeRouting& r, cudaStream_t stream, MoeKernels kernels) {
  CheckRouting(r, "MoeGroupedGemm");
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    throw std::invalid_argument("MoeGroupedGemm: dtype must be BF16 or F16, got " +
                                std::string(DTypeName(dtype)));
  }
  if (top_k < 1 || top_k > kMoeMaxTopK) {
    throw std::invalid_argument("MoeGroupedGemm: top_k " + std::to_string(top_k));
  }
  if (n <= 0 || k <= 0 || n % 8 != 0 || k % 8 != 0) {
    throw std::invalid_argument("MoeGroupedGemm: n (" + std::to_string(n) + ") and k (" +
                                std::to_string(k) + ") must be positive multiples of 8");
  }
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(x) || !aligned(w) || !aligned(out)) {
    throw std::invalid_argument("MoeGroupedGemm: x, w and out must be 16-byte aligned");
  }
  if (num_pairs <= 0) return;
  const int64_t tokens = num_pairs / top_k;
  // kV2's GEMV: every expert has at most `tokens` rows, so one tile each, and at most
  // num_pairs tiles are not empty.
  const bool gemv = kernels == MoeKernels::kV2 && tokens <= kMoeGemvMaxTokens;
  const int64_t tiles = MoeMaxTiles(num_pairs, num_experts);
  const dim3 grid = gemv ? dim3(unsigned((n + kGemvCtaRows - 1) / kGemvCtaRows),
                                unsigned(std::min<int64_t>(tiles, num_pairs)))
                         : dim3(unsigned((n + kBn - 1) / kBn), unsigned(tiles));
  const dim3 block(gemv ? kGemvThreads : kGemmThreads);
  auto run = [&](auto tag, auto out_f32_tag) {
    using T = decltype(tag);
    constexpr bool kF32 = decltype(out_f32_tag)::value;
    auto kernel = gemv                         ? MoeGemvKernel<T, kF32>
                  : kernels == MoeKernels::kV2 ? MoeGemmKernel<T, kF32, 4>
                                               : MoeGemmKernel<T, kF32, 2>;
    Launch(kernel, grid, block, 0, stream, static_cast<const T*>(x), gather, top_k,
           static_cast<const T*>(w), out, int(n), int(k),
           static_cast<const int32_t*>(r.sorted_pairs), static_cast<const int32_t*>(r.offsets),
           static_cast<const int32_t*>(r.tile_expert), static_cast<const int32_t*>(r.tile_begin),
           static_cast<const int32_t*>(r.num_tiles));
  };
  if (dtype == DType::kBF16) {
    out_f32 ? run(__nv_bfloat16{}, std::true_type{}) : run(__nv_bfloat16{}, std::false_type{});
  } else {
    out_f32 ? run(__half{}, std::true_type{}) : run(__half{}, std::false_type{});
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

void MoeCombine(const float* rows, const MoeRouting& r, int64_t num_tokens, int top_k,
                int64_t hidden, float* residual, bool accumulate, cudaStream_t stream) {
  CheckRouting(r, "MoeCombine");
  if (top_k < 1 || top_k > kMoeMaxTopK) {
    throw std::invalid_argument("MoeCombine: top_k " + std::to_string(top_k));
  }
  if (num_tokens <= 0 || hidden <= 0) return;
  Launch(MoeCombineKernel, dim3(unsigned(num_tokens)), dim3(kCombineThreads), 0, stream, rows,
         static_cast<const int32_t*>(r.experts), static_cast<const float*>(r.weights),
         static_cast<const int32_t*>(r.pair_rows), top_k, int(hidden), residual, accumulate);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
