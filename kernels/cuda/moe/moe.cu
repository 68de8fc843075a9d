// Mixture-of-experts kernels (kernels/cuda/moe/moe.h): routing, grouping and the combine (the
// grouped GEMMs: moe_gemm.cu).

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/moe/combine.cuh"
#include "kernels/cuda/moe/moe.h"

namespace llm::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRouteWarps = 4;      // tokens per routing CTA, one warp each
constexpr int kGroupThreads = 256;  // the counting and placing CTAs (one per expert)

// ---- routing: one warp per token ------------------------------------------------------------

// Token t's routing by one warp (lane: its lane). chosen (optional): the token's experts in
// rank order, also written there (by lane 0).
__device__ __forceinline__ void RouteToken(const float* logits, int t, int num_experts, int top_k,
                                           bool normalize, int32_t* experts, float* weights,
                                           int lane, int* chosen = nullptr) {
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
    if (lane == 0) {
      experts[int64_t(t) * top_k + j] = best_e;
      if (chosen != nullptr) chosen[j] = best_e;
    }
  }
  if (lane == 0) {
    for (int j = 0; j < top_k; ++j) {
      weights[int64_t(t) * top_k + j] = normalize ? chosen_v[j] / chosen_sum : chosen_v[j];
    }
  }
}

__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteKernel(const float* logits, int num_tokens, int num_experts, int top_k, bool normalize,
                   int32_t* experts, float* weights) {
  PdlWait();
  PdlTrigger();
  const int t = blockIdx.x * kRouteWarps + threadIdx.x / 32;
  if (t >= num_tokens) return;  // a whole warp
  RouteToken(logits, t, num_experts, top_k, normalize, experts, weights, threadIdx.x % 32);
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

// The grouping by one CTA of kGroupOneThreads threads (MoeGroupOneKernel, MoeRouteGroupKernel).
__device__ __forceinline__ void GroupPairs(const int32_t* experts, int num_pairs, int num_experts,
                                           int32_t* offsets, int32_t* sorted_pairs,
                                           int32_t* pair_rows, int32_t* tile_expert,
                                           int32_t* tile_begin, int32_t* num_tiles, int tile_rows) {
  constexpr int kWarps = kGroupOneThreads / 32;
  __shared__ int base[kMoeMaxExperts];  // counts, then each expert's next row
  __shared__ int start[kMoeMaxExperts + 1], tile_start[kMoeMaxExperts + 1];
  __shared__ int warp_count[kWarps][kMoeMaxExperts];
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
      tiles += (c + tile_rows - 1) / tile_rows;
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
        tiles_before += (base[e] + tile_rows - 1) / tile_rows;
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
    for (int b = start[e]; b < start[e + 1]; b += tile_rows, ++t) {
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

__global__ void __launch_bounds__(kGroupOneThreads)
    MoeGroupOneKernel(const int32_t* experts, int num_pairs, int num_experts, int32_t* offsets,
                      int32_t* sorted_pairs, int32_t* pair_rows, int32_t* tile_expert,
                      int32_t* tile_begin, int32_t* num_tiles, int tile_rows) {
  PdlWait();
  PdlTrigger();
  GroupPairs(experts, num_pairs, num_experts, offsets, sorted_pairs, pair_rows, tile_expert,
             tile_begin, num_tiles, tile_rows);
}

// kV3's small steps: the routing (warp w routes tokens w, w + 32, ...) and the grouping in one
// CTA. The grouping reads the experts this CTA wrote to global memory: __syncthreads makes a
// block's global writes visible to the whole block.
__global__ void __launch_bounds__(kGroupOneThreads)
    MoeRouteGroupKernel(const float* logits, int num_tokens, int num_experts, int top_k,
                        bool normalize, int32_t* experts, float* weights, int32_t* offsets,
                        int32_t* sorted_pairs, int32_t* pair_rows, int32_t* tile_expert,
                        int32_t* tile_begin, int32_t* num_tiles, int tile_rows) {
  PdlWait();
  PdlTrigger();
  for (int t = threadIdx.x / 32; t < num_tokens; t += kGroupOneThreads / 32) {
    RouteToken(logits, t, num_experts, top_k, normalize, experts, weights, threadIdx.x % 32);
  }
  __syncthreads();
  GroupPairs(experts, num_tokens * top_k, num_experts, offsets, sorted_pairs, pair_rows,
             tile_expert, tile_begin, num_tiles, tile_rows);
}

// kV3's smallest steps (at most kWarpGroupPairs pairs: batch 1-4 of top 8, up to 16 tokens of
// top 2): the routing (warp w routes tokens w, w + 4, ...; their experts also go to shared
// memory) and then the grouping by one warp, with no atomics and one barrier: lane p holds pair
// p's expert, its row is the number of pairs before it in (expert, pair) order, an expert's
// first pair opens its one tile (kMoeTileRows >= the pairs) and offsets[x] counts the pairs of
// experts below x. MoeRouteGroupKernel took 7.1 us per layer of Qwen3-30B-A3B at batch 1 on the
// H100 (its 1024 threads through ten barriers): bench/RESULTS.md.
constexpr int kWarpGroupPairs = 32;
constexpr int kWarpGroupWarps = 4;
static_assert(kMoeTileRows >= kWarpGroupPairs, "one tile per expert");

__global__ void __launch_bounds__(kWarpGroupWarps * 32)
    MoeRouteGroupWarpKernel(const float* logits, int num_tokens, int num_experts, int top_k,
                            bool normalize, int32_t* experts, float* weights, int32_t* offsets,
                            int32_t* sorted_pairs, int32_t* pair_rows, int32_t* tile_expert,
                            int32_t* tile_begin, int32_t* num_tiles) {
  __shared__ int pair_expert[kWarpGroupPairs];
  PdlWait();
  PdlTrigger();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int t = warp; t < num_tokens; t += kWarpGroupWarps) {
    RouteToken(logits, t, num_experts, top_k, normalize, experts, weights, lane,
               pair_expert + t * top_k);
  }
  __syncthreads();
  if (warp != 0) return;
  const int pairs = num_tokens * top_k;
  const bool valid = lane < pairs;
  const int e = valid ? pair_expert[lane] : num_experts;  // past every expert
  const unsigned same = __match_any_sync(kFullMask, e);
  const unsigned firsts = __ballot_sync(kFullMask, valid && lane == __ffs(same) - 1);
  // Offsets: lane l counts for experts l, l + 32, ... (up to num_experts inclusive).
  constexpr int kSpan = kMoeMaxExperts / 32 + 1;
  int below[kSpan] = {};
  int row = 0, tile = 0;
  for (int q = 0; q < pairs; ++q) {
    const int eq = pair_expert[q];
    row += eq < e || (eq == e && q < lane);
    tile += (firsts >> q & 1u) && eq < e;
#pragma unroll
    for (int i = 0; i < kSpan; ++i) below[i] += eq < lane + 32 * i;
  }
#pragma unroll
  for (int i = 0; i < kSpan; ++i) {
    if (lane + 32 * i <= num_experts) offsets[lane + 32 * i] = below[i];
  }
  if (valid) {
    sorted_pairs[row] = lane;
    pair_rows[lane] = row;
    if (firsts >> lane & 1u) {
      tile_expert[tile] = e;
      tile_begin[tile] = row;
    }
  }
  if (lane == 0) *num_tiles = __popc(firsts);
}

// ---- the combine: CTAs of 128 threads x 4 columns per token ----------------------------------

// Each CTA does 512 columns of one token (a batch-1 step: hidden / 512 CTAs; the first version,
// one 128-thread CTA per token walking its columns with two dependent loads per column, took
// 27 us per layer at batch 1 on the H200). The token's rows and weights are read once, before
// the columns; every column sums its top_k rows by ascending expert, as cpu::MoeCombine.
constexpr int kCombineThreads = 128;
constexpr int kCombineCols = 4 * kCombineThreads;

__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(moe_detail::CombineSource src, float* residual, bool accumulate) {
  PdlWait();
  PdlTrigger();
  const int64_t t = blockIdx.x;
  const int hidden = int(src.hidden);
  const moe_detail::CombineToken token = src.Token(t);
  float* dst = residual + t * hidden;
  const int begin = blockIdx.y * kCombineCols;
  if (hidden % 4 == 0) {  // 16-byte rows: 4 columns a thread
    const int h = begin + 4 * threadIdx.x;
    if (h >= hidden) return;
    float acc[4];
    token.Sum<4>(h, acc);
    float4* out = reinterpret_cast<float4*>(dst + h);
    if (accumulate) {
      const float4 old = *out;
      *out = make_float4(old.x + acc[0], old.y + acc[1], old.z + acc[2], old.w + acc[3]);
    } else {
      *out = make_float4(acc[0], acc[1], acc[2], acc[3]);
    }
    return;
  }
  for (int h = begin + threadIdx.x; h < min(hidden, begin + kCombineCols); h += kCombineThreads) {
    float acc[1];
    token.Sum<1>(h, acc);
    dst[h] = accumulate ? dst[h] + acc[0] : acc[0];
  }
}

}  // namespace

void MoeRoute(const float* logits, int64_t num_tokens, int num_experts, int top_k, bool normalize,
              const MoeRouting& r, cudaStream_t stream, MoeKernels kernels) {
  if (!r.complete()) throw std::invalid_argument("MoeRoute: a MoeRouting array is null");
  if (num_experts < 1 || num_experts > kMoeMaxExperts || top_k < 1 || top_k > kMoeMaxTopK ||
      top_k > num_experts) {
    throw std::invalid_argument("MoeRoute: " + std::to_string(num_experts) + " experts, top " +
                                std::to_string(top_k) + " (at most " +
                                std::to_string(kMoeMaxExperts) + " experts, top " +
                                std::to_string(kMoeMaxTopK) + ")");
  }
  if (num_tokens <= 0) return;
  const int pairs = int(num_tokens * top_k);
  const int tile_rows = MoeTileRows(pairs, num_experts, kernels);
  if (kernels >= MoeKernels::kV3 && pairs <= kWarpGroupPairs) {  // (64-row tiles: one each)
    Launch(MoeRouteGroupWarpKernel, dim3(1), dim3(kWarpGroupWarps * 32), 0, stream, logits,
           int(num_tokens), num_experts, top_k, normalize, r.experts, r.weights, r.offsets,
           r.sorted_pairs, r.pair_rows, r.tile_expert, r.tile_begin, r.num_tiles);
    LLM_CUDA_CHECK(cudaGetLastError());
    return;
  }
  static_assert(kMoeFusedRouteV5Tokens <= kGroupOneThreads / 32, "one token per warp");
  const int fused_max =
      kernels == MoeKernels::kV5 ? kMoeFusedRouteV5Tokens : kMoeFusedRouteMaxTokens;
  if (kernels >= MoeKernels::kV3 && num_tokens <= fused_max) {
    Launch(MoeRouteGroupKernel, dim3(1), dim3(kGroupOneThreads), 0, stream, logits, int(num_tokens),
           num_experts, top_k, normalize, r.experts, r.weights, r.offsets, r.sorted_pairs,
           r.pair_rows, r.tile_expert, r.tile_begin, r.num_tiles, tile_rows);
    LLM_CUDA_CHECK(cudaGetLastError());
    return;
  }
  Launch(MoeRouteKernel, dim3(unsigned((num_tokens + kRouteWarps - 1) / kRouteWarps)),
         dim3(kRouteWarps * 32), 0, stream, logits, int(num_tokens), num_experts, top_k, normalize,
         r.experts, r.weights);
  if (kernels != MoeKernels::kV1) {
    Launch(MoeGroupOneKernel, dim3(1), dim3(kGroupOneThreads), 0, stream,
           static_cast<const int32_t*>(r.experts), pairs, num_experts, r.offsets, r.sorted_pairs,
           r.pair_rows, r.tile_expert, r.tile_begin, r.num_tiles, tile_rows);
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

void MoeCombine(const float* rows, const MoeRouting& r, int64_t num_tokens, int top_k,
                int64_t hidden, float* residual, bool accumulate, cudaStream_t stream) {
  if (!r.complete()) throw std::invalid_argument("MoeCombine: a MoeRouting array is null");
  if (top_k < 1 || top_k > kMoeMaxTopK) {
    throw std::invalid_argument("MoeCombine: top_k " + std::to_string(top_k));
  }
  if (num_tokens <= 0 || hidden <= 0) return;
  const unsigned col_blocks = unsigned((hidden + kCombineCols - 1) / kCombineCols);
  Launch(MoeCombineKernel, dim3(unsigned(num_tokens), col_blocks), dim3(kCombineThreads), 0, stream,
         moe_detail::CombineSourceOf(rows, r, top_k, hidden), residual, accumulate);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
