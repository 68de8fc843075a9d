// The mixture-of-experts grouped GEMMs (kernels/cuda/moe/moe.h: MoeGroupedGemm): mma.sync tiles
// of each expert's sorted rows, and kV2's GEMV for steps of at most kMoeGemvMaxTokens tokens.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/moe/moe.h"

namespace llm::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

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

}  // namespace

void MoeGroupedGemm(const void* x, bool gather, int top_k, const void* w, DType dtype, void* out,
                    bool out_f32, int64_t n, int64_t k, int64_t num_pairs, int num_experts,
                    const MoeRouting& r, cudaStream_t stream, MoeKernels kernels) {
  if (!r.complete()) {
    throw std::invalid_argument("MoeGroupedGemm: a MoeRouting array is null");
  }
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

}  // namespace llm::cuda
