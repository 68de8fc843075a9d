// Mixture-of-experts kernels (kernels/cuda/moe/moe.h): routing, grouping, the grouped GEMM and
// the combine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
    // Probabilities >= 0; a chosen or absent expert is marked -1.
#pragma unroll
  for (int i = 0; i < kPer; ++i) p[i] = lane + 32 * i < num_experts ? p[i] / sum : -1.f;
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

// ---- the grouped GEMM: mma.sync m16n8k16 tiles of 64 sorted rows x 64 outputs -----------------

constexpr int kGemmThreads = 128;  // 4 warps, 2 x 2, each 32 x 32 of the tile
constexpr int kBm = kMoeTileRows, kBn = 64, kBk = 32;
constexpr int kSmemStride = kBk + 8;  // 80-byte rows: ldmatrix without bank conflicts

template <typename T, bool kOutF32>
__global__ void __launch_bounds__(kGemmThreads)
    MoeGemmKernel(const T* x, bool gather, int top_k, const T* w, void* out, int n, int k,
                  const int32_t* sorted_pairs, const int32_t* offsets, const int32_t* tile_expert,
                  const int32_t* tile_begin, const int32_t* num_tiles) {
  __shared__ alignas(16) T a_s[2][kBm][kSmemStride];
  __shared__ alignas(16) T b_s[2][kBn][kSmemStride];
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
  load(0, 0);
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) {
      load((kt + 1) & 1, (kt + 1) * kBk);
      ptx::CpAsyncWait<1>();
    } else {
      ptx::CpAsyncWait<0>();
    }
    __syncthreads();
    const int s = kt & 1;
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
    __syncthreads();  // the next iteration's load overwrites this stage
  }
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
              const MoeRouting& r, cudaStream_t stream) {
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
                    const MoeRouting& r, cudaStream_t stream) {
  CheckRouting(r, "MoeGroupedGemm");
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    throw std::invalid_argument("MoeGroupedGemm: dtype must be BF16 or F16, got " +
                                std::string(DTypeName(dtype)));
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
  const dim3 grid(unsigned((n + kBn - 1) / kBn), unsigned(MoeMaxTiles(num_pairs, num_experts)));
  const dim3 block(kGemmThreads);
  auto run = [&](auto tag, auto out_f32_tag) {
    using T = decltype(tag);
    constexpr bool kF32 = decltype(out_f32_tag)::value;
    Launch(MoeGemmKernel<T, kF32>, grid, block, 0, stream, static_cast<const T*>(x), gather, top_k,
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
