// The mixture-of-experts grouped GEMMs (kernels/cuda/moe/moe.h: MoeGroupedGemm): mma.sync tiles
// of each expert's sorted rows (bf16 / fp16, or W8A8 e4m3), and a GEMV (kV2's steps of at most
// kMoeGemvMaxTokens tokens, and fp8 weight-only).
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
#include "kernels/cuda/moe/fragment_store.cuh"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/moe/moe_gemm_wgmma.h"

namespace llm::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// A step whose experts average at most this many rows: kV3's tiles put their 4 warps side by
// side along n (64 x 16 each), and kV4 keeps those tiles (kV5 takes the wgmma ones).
constexpr int64_t kNarrowRows = 32;
bool Narrow(const MoeGemm& g) { return g.num_pairs <= kNarrowRows * g.num_experts; }

// ---- the grouped GEMM: mma.sync tiles of 64 sorted rows x 64 outputs -------------------------
// A stage holds 64 bytes of k per row (32 bf16 / fp16 elements, or 64 e4m3 codes), rows padded
// to 80 bytes (ldmatrix without bank conflicts). kFp8 (W8A8): x and w are e4m3 codes and T is
// out's dtype; each 32-byte step of k is one m16n8k32 e4m3 mma where 16-bit types take one
// m16n8k16, on the same ldmatrix addresses (ptx::Mma16832E4m3).

constexpr int kGemmThreads = 128;  // 4 warps: kWarpsM x (4 / kWarpsM) over the tile
constexpr int kBm = kMoeTileRows, kBn = 64;
constexpr int kRowBytes = 64;
constexpr int kStrideBytes = kRowBytes + 16;

// kStages k-tiles in flight (cp.async groups): 2 (kV1), 4 (kV2, kV3). kWarpsM: 2 (each warp
// 32 x 32 of the tile: kV1, kV2, kV3 when experts average many rows) or 1 (each warp 64 x 16:
// kV3 when they average few, so that the rows an expert has are every warp's work). kSkip
// (kV3): the A rows past the tile's last are not copied and the 16-row fragments past it
// neither loaded nor multiplied (their outputs would be discarded).
template <typename T, bool kOutF32, int kStages, bool kFp8, int kWarpsM = 2, bool kSkip = false>
__global__ void __launch_bounds__(kGemmThreads)
    MoeGemmKernel(const void* x_in, const float* x_scale, bool gather, int top_k, const void* w_in,
                  const float* w_scale, void* out, int n, int k, const int32_t* sorted_pairs,
                  const int32_t* offsets, const int32_t* tile_expert, const int32_t* tile_begin,
                  const int32_t* num_tiles) {
  using E = std::conditional_t<kFp8, uint8_t, T>;
  constexpr int kChunk = 16 / int(sizeof(E));         // elements per 16-byte copy
  constexpr int kTileK = kRowBytes / int(sizeof(E));  // elements of k per stage
  constexpr int kRowChunks = kRowBytes / 16;
  constexpr int kWarpM = kBm / kWarpsM, kWarpN = kBn * kWarpsM / 4;  // a warp's part
  constexpr int kMi = kWarpM / 16, kNj = kWarpN / 16;                // its m16 fragments, n16 pairs
  static_assert(kWarpsM == 1 || kWarpsM == 2, "4 warps: 1 x 4 or 2 x 2");
  __shared__ alignas(16) uint8_t a_s[kStages][kBm][kStrideBytes];
  __shared__ alignas(16) uint8_t b_s[kStages][kBn][kStrideBytes];
  __shared__ int a_rows[kBm];
  PdlWait();
  PdlTrigger();
  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile], row0 = tile_begin[tile];
  const int rows = min(kBm, offsets[e + 1] - row0);
  const int n0 = blockIdx.x * kBn;
  const E* x = static_cast<const E*>(x_in);
  const E* we = static_cast<const E*>(w_in) + int64_t(e) * n * k;
  if (threadIdx.x < kBm) {
    const int r = row0 + int(threadIdx.x);
    a_rows[threadIdx.x] = int(threadIdx.x) < rows ? (gather ? sorted_pairs[r] / top_k : r) : -1;
  }
  __syncthreads();
  // kSkip: the A rows copied, whole 16-row fragments (rows past `rows` within the last one are
  // zero-filled: their a_rows entry is -1, a copy of 0 source bytes).
  const int a_rows_used = kSkip ? (rows + 15) / 16 * 16 : kBm;
  auto load = [&](int stage, int k0) {
    for (int c = threadIdx.x; c < a_rows_used * kRowChunks; c += kGemmThreads) {
      const int r = c / kRowChunks, part = c % kRowChunks, col = k0 + part * kChunk;
      const int src = a_rows[r];
      const bool ok = src >= 0 && col < k;
      ptx::CpAsync16(ptx::SmemAddr(&a_s[stage][r][part * 16]), ok ? x + int64_t(src) * k + col : x,
                     ok ? 16 : 0);
    }
    for (int c = threadIdx.x; c < kBn * kRowChunks; c += kGemmThreads) {
      const int r = c / kRowChunks, part = c % kRowChunks, col = k0 + part * kChunk;
      const bool ok = n0 + r < n && col < k;
      ptx::CpAsync16(ptx::SmemAddr(&b_s[stage][r][part * 16]),
                     ok ? we + int64_t(n0 + r) * k + col : we, ok ? 16 : 0);
    }
    ptx::CpAsyncCommit();
  };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = (warp / (4 / kWarpsM)) * kWarpM, wn = (warp % (4 / kWarpsM)) * kWarpN;
  // The warp's fragments that hold rows (kSkip; all of them otherwise): mi < live.
  const int live = kSkip ? min(kMi, max(0, (rows - wm + 15) / 16)) : kMi;
  float acc[kMi][2 * kNj][4] = {};
  const int k_tiles = (k + kTileK - 1) / kTileK;
  // Tiles 0 .. kStages - 2 in flight; each iteration waits for tile kt, then refills the
  // stage iteration kt - 1 read (every thread is past it: the barrier) with tile
  // kt + kStages - 1. An empty commit where no tile is left keeps the group count uniform.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < k_tiles) {
      load(st, st * kTileK);
    } else {
      ptx::CpAsyncCommit();
    }
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      load(next % kStages, next * kTileK);
    } else {
      ptx::CpAsyncCommit();
    }
    const int s = kt % kStages;
    if (live == 0) continue;  // kSkip: a warp below the tile's rows (warp-uniform)
#pragma unroll
    for (int kk = 0; kk < kRowBytes; kk += 32) {  // bytes: 16 elements, or 32 codes
      uint32_t a[kMi][4];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        if (mi < live) {
          ptx::LdMatrixX4(a[mi],
                          ptx::SmemAddr(&a_s[s][wm + mi * 16 + lane % 16][kk + (lane / 16) * 16]));
        }
      }
#pragma unroll
      for (int nj = 0; nj < kNj; ++nj) {
        uint32_t b[4];
        const int nr = wn + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        ptx::LdMatrixX4(b, ptx::SmemAddr(&b_s[s][nr][kk + ((lane >> 3) & 1) * 16]));
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi) {
          if (mi >= live) continue;
          if constexpr (kFp8) {
            ptx::Mma16832E4m3(acc[mi][2 * nj], a[mi], b[0], b[1]);
            ptx::Mma16832E4m3(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
          } else {
            ptx::Mma16816<T>(acc[mi][2 * nj], a[mi], b[0], b[1]);
            ptx::Mma16816<T>(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
          }
        }
      }
    }
  }
  ptx::CpAsyncWaitAll();  // no copy may land in shared memory after the CTA exits
  const int g = lane / 4, c2 = (lane % 4) * 2;
  const moe_detail::FragmentStore<T, kOutF32, kFp8> store{out, n,       row0,    rows,
                                                          e,   w_scale, x_scale, a_rows};
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 2 * kNj; ++ni) {
      const int col = n0 + wn + ni * 8 + c2;
      if (col < n) store(wm + mi * 16 + g, col, acc[mi][ni]);
    }
  }
}

// ---- the GEMV: kV2's steps of at most kMoeGemvMaxTokens tokens, and fp8 weight-only ---------

// CTA (output block, tile): each warp computes kGemvWarpRows output features for the tile's rows
// kMoeGemvMaxTokens at a time (the expert's rows when the host chose this kernel for a small
// step: at most one per token), its lanes streaming the weight rows in 16-byte chunks (each
// byte read once per kMoeGemvMaxTokens rows) against the rows' inputs (a few KB, read through
// L1). kFp8: w holds e4m3 codes (16 per chunk) and w_scale their row scales.
constexpr int kGemvThreads = 256;
constexpr int kGemvWarpRows = 2;
constexpr int kGemvCtaRows = kGemvThreads / 32 * kGemvWarpRows;

template <typename T, bool kOutF32, bool kFp8>
__global__ void __launch_bounds__(kGemvThreads)
    MoeGemvKernel(const T* x, bool gather, int top_k, const void* w_in, const float* w_scale,
                  void* out, int n, int k, const int32_t* sorted_pairs, const int32_t* offsets,
                  const int32_t* tile_expert, const int32_t* tile_begin, const int32_t* num_tiles) {
  constexpr int kMaxRows = kMoeGemvMaxTokens;
  using W = std::conditional_t<kFp8, uint8_t, T>;
  constexpr int kElems = 16 / int(sizeof(W));  // weights per 16-byte chunk
  PdlWait();
  PdlTrigger();
  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j0 = blockIdx.x * kGemvCtaRows + warp * kGemvWarpRows;
  if (j0 >= n) return;  // a whole warp
  const W* we = static_cast<const W*>(w_in) + int64_t(e) * n * k;
  const int rows_end = min(tile_begin[tile] + kMoeTileRows, offsets[e + 1]);
  for (int row0 = tile_begin[tile]; row0 < rows_end; row0 += kMaxRows) {
    const int rows = min(kMaxRows, rows_end - row0);
    const T* in[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      const int row = row0 + min(r, rows - 1);
      in[r] = x + int64_t(gather ? sorted_pairs[row] / top_k : row) * k;
    }
    float acc[kGemvWarpRows][kMaxRows] = {};
    for (int c = lane * kElems; c < k; c += 32 * kElems) {
      float wf[kGemvWarpRows][kElems];
#pragma unroll
      for (int i = 0; i < kGemvWarpRows; ++i) {
        const int j = min(j0 + i, n - 1);
        const uint4 wv = ptx::LoadStream(reinterpret_cast<const uint4*>(we + int64_t(j) * k + c));
        if constexpr (kFp8) {
          vec::E4m3x4ToF32(wv.x, &wf[i][0]);
          vec::E4m3x4ToF32(wv.y, &wf[i][4]);
          vec::E4m3x4ToF32(wv.z, &wf[i][8]);
          vec::E4m3x4ToF32(wv.w, &wf[i][12]);
        } else {
          const T* w8 = reinterpret_cast<const T*>(&wv);
#pragma unroll
          for (int q = 0; q < kElems; ++q) wf[i][q] = vec::ToF32(w8[q]);
        }
      }
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        if (r < rows) {
#pragma unroll
          for (int h = 0; h < kElems / vec::kVec; ++h) {
            const uint4 xv = *reinterpret_cast<const uint4*>(in[r] + c + h * vec::kVec);
            const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
            for (int i = 0; i < kGemvWarpRows; ++i) {
#pragma unroll
              for (int q = 0; q < vec::kVec; ++q) {
                acc[i][r] = fmaf(wf[i][h * vec::kVec + q], vec::ToF32(xe[q]), acc[i][r]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kGemvWarpRows; ++i) {
      const int j = j0 + i;
      const float scale = kFp8 && j < n ? w_scale[int64_t(e) * n + j] : 1.f;
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        float v = acc[i][r];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
        if (lane == 0 && r < rows && j < n) {
          v *= scale;
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

// ---- kV3's GEMV: a cp.async ring per lane, kMaxRows rows per pass, SiLU·mul epilogue ------

// As MoeGemvKernel, CTA (outputs, tile) with 8 warps of two weight rows each, but each lane
// copies its 16-byte chunks of the two rows into its own slots of a shared-memory ring,
// kGemvStages - 1 chunks of each row ahead of the one it multiplies: 32 KiB per CTA. The batch-1
// variants take 38-56 registers (4-6 CTAs per SM: 72-108 KiB of weights in flight), the 8-row
// and fp8 ones 73-98 (2-3 CTAs, 36-54 KiB); MoeGemvKernel's registers held two chunks per lane
// (~32 KiB per SM: 1.4-2.0 TB/s on the H200, bench/RESULTS.md V2).
// Each lane reads back only what it copied: no barrier. kMaxRows: the tile's rows per pass
// (the host picks the smallest power of two >= the step's tokens, so that a batch-1 step keeps
// one accumulator per weight row). kSilu: the warp's rows are gate row j and up row n / 2 + j,
// and it writes SiLU(gate) · up (MoeGemm::silu_mul).
constexpr int kGemvStages = 4;

template <typename T, bool kOutF32, bool kFp8, bool kSilu, int kMaxRows>
__global__ void __launch_bounds__(kGemvThreads)
    MoeGemvRingKernel(const T* x, bool gather, int top_k, const void* w_in, const float* w_scale,
                      void* out, int n, int k, const int32_t* sorted_pairs, const int32_t* offsets,
                      const int32_t* tile_expert, const int32_t* tile_begin,
                      const int32_t* num_tiles, int tile_rows) {
  static_assert(!(kSilu && kOutF32), "SiLU·mul writes dtype");
  using W = std::conditional_t<kFp8, uint8_t, T>;
  constexpr int kElems = 16 / int(sizeof(W));  // weights per 16-byte chunk
  __shared__ alignas(16) uint4 ring[kGemvStages][2][kGemvThreads];
  PdlWait();
  PdlTrigger();
  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;  // (tile_expert past num_tiles holds no step's values)
  const int e = tile_expert[tile], first = tile_begin[tile];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = n / 2;
  int row_a, row_b;  // the warp's two weight rows
  if constexpr (kSilu) {
    row_a = blockIdx.x * (kGemvThreads / 32) + warp;
    if (row_a >= half) return;  // a whole warp
    row_b = half + row_a;
  } else {
    row_a = blockIdx.x * kGemvCtaRows + warp * 2;
    if (row_a >= n) return;
    row_b = min(row_a + 1, n - 1);
  }
  const W* we = static_cast<const W*>(w_in) + int64_t(e) * n * k;
  const uint4* wa = reinterpret_cast<const uint4*>(we + int64_t(row_a) * k);
  const uint4* wb = reinterpret_cast<const uint4*>(we + int64_t(row_b) * k);
  const int chunks = k / kElems, steps = (chunks + 31) / 32;
  // Step s: chunk s * 32 + lane of both rows into slot s % kGemvStages (zeros past the row).
  auto issue = [&](int s) {
    if (s < steps) {
      const int c = s * 32 + lane;
      const bool ok = c < chunks;
      ptx::CpAsync16(ptx::SmemAddr(&ring[s % kGemvStages][0][threadIdx.x]), ok ? wa + c : wa,
                     ok ? 16 : 0);
      ptx::CpAsync16(ptx::SmemAddr(&ring[s % kGemvStages][1][threadIdx.x]), ok ? wb + c : wb,
                     ok ? 16 : 0);
    }
    ptx::CpAsyncCommit();  // empty past the last step: the group count stays uniform
  };
  const int rows_end = min(first + tile_rows, offsets[e + 1]);
  for (int row0 = first; row0 < rows_end; row0 += kMaxRows) {
#pragma unroll
    for (int s = 0; s < kGemvStages - 1; ++s) issue(s);
    const int rows = min(kMaxRows, rows_end - row0);
    int src[kMaxRows];  // the rows of x
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      const int row = row0 + min(r, rows - 1);
      src[r] = gather ? sorted_pairs[row] / top_k : row;
    }
    float acc[2][kMaxRows] = {};
    for (int s = 0; s < steps; ++s) {
      ptx::CpAsyncWait<kGemvStages - 2>();
      // A slot is read only where its chunk is multiplied, so that the copy refilling it (the
      // next step's issue, into the slot step s - 1 read) follows a read whose value was used.
      const int c = s * 32 + lane;
      uint4 va{}, vb{};
      if (c < chunks) {
        va = ring[s % kGemvStages][0][threadIdx.x];
        vb = ring[s % kGemvStages][1][threadIdx.x];
      }
      issue(s + kGemvStages - 1);
      if (c >= chunks) continue;
#pragma unroll
      for (int h = 0; h < kElems / vec::kVec; ++h) {  // 8 weights of each row at a time
        float fa[vec::kVec], fb[vec::kVec];
        if constexpr (kFp8) {
          vec::E4m3x4ToF32(h == 0 ? va.x : va.z, fa);
          vec::E4m3x4ToF32(h == 0 ? va.y : va.w, fa + 4);
          vec::E4m3x4ToF32(h == 0 ? vb.x : vb.z, fb);
          vec::E4m3x4ToF32(h == 0 ? vb.y : vb.w, fb + 4);
        } else {
          const T* pa = reinterpret_cast<const T*>(&va);
          const T* pb = reinterpret_cast<const T*>(&vb);
#pragma unroll
          for (int q = 0; q < vec::kVec; ++q) {
            fa[q] = vec::ToF32(pa[q]);
            fb[q] = vec::ToF32(pb[q]);
          }
        }
#pragma unroll
        for (int r = 0; r < kMaxRows; ++r) {
          if (r < rows) {
            const uint4 xv = *reinterpret_cast<const uint4*>(x + int64_t(src[r]) * k +
                                                             int64_t(c) * kElems + h * vec::kVec);
            const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
            for (int q = 0; q < vec::kVec; ++q) {
              const float xq = vec::ToF32(xe[q]);
              acc[0][r] = fmaf(fa[q], xq, acc[0][r]);
              acc[1][r] = fmaf(fb[q], xq, acc[1][r]);
            }
          }
        }
      }
    }
    ptx::CpAsyncWaitAll();  // the empty tail groups; the ring is refilled by the next pass
    const float scale_a = kFp8 ? w_scale[int64_t(e) * n + row_a] : 1.f;
    const float scale_b = kFp8 ? w_scale[int64_t(e) * n + row_b] : 1.f;
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      float va = acc[0][r], vb = acc[1][r];
      for (int o = 16; o > 0; o >>= 1) {
        va += __shfl_xor_sync(kFullMask, va, o);
        vb += __shfl_xor_sync(kFullMask, vb, o);
      }
      if (lane != 0 || r >= rows) continue;
      va *= scale_a;
      vb *= scale_b;
      if constexpr (kSilu) {
        // As the GEMM into T and then cuda::SiluMul: both sums rounded to T, the rest in fp32.
        const float g = vec::RoundTo<T>(va), u = vec::RoundTo<T>(vb);
        static_cast<T*>(out)[int64_t(row0 + r) * half + row_a] =
            vec::FromF32<T>(g / (1.f + expf(-g)) * u);
      } else {
        const int64_t at = int64_t(row0 + r) * n + row_a;
        const bool second = row_a + 1 < n;
        if constexpr (kOutF32) {
          static_cast<float*>(out)[at] = va;
          if (second) static_cast<float*>(out)[at + 1] = vb;
        } else {
          static_cast<T*>(out)[at] = vec::FromF32<T>(va);
          if (second) static_cast<T*>(out)[at + 1] = vec::FromF32<T>(vb);
        }
      }
    }
  }
}

}  // namespace

bool MoeUsesGemv(const MoeGemm& g, MoeKernels kernels) {
  const bool fp8_w = g.w_scale != nullptr, w8a8 = g.x_scale != nullptr;
  const int64_t tokens = g.top_k > 0 ? g.num_pairs / g.top_k : 0;
  return (fp8_w && !w8a8) || (!fp8_w && kernels != MoeKernels::kV1 && tokens <= kMoeGemvMaxTokens);
}

bool MoeFusesSiluMul(const MoeGemm& g, MoeKernels kernels) {
  return kernels >= MoeKernels::kV3 && MoeUsesGemv(g, kernels) && !g.out_f32 && g.n % 2 == 0;
}

int MoeWgmmaCols(const MoeGemm& g, MoeKernels kernels) {
  // kV4 runs the steps wider than Narrow on warpgroup MMAs, kV5 every tile step.
  if (kernels < MoeKernels::kV4 || MoeUsesGemv(g, kernels)) return 0;
  if (kernels == MoeKernels::kV4 && Narrow(g)) return 0;
  if (g.wgmma_cols != 0) return g.wgmma_cols;
  // 128 on 64-row tiles, 256 on 128-row ones: the faster of each pair on the H100
  // (bench/RESULTS.md: 64 x 128 1-2% over 64 x 256; 128 x 256 1.25x 128 x 128 on
  // Qwen3-30B-A3B's gate|up at 4,096 tokens).
  return MoeTileRows(g.num_pairs, g.num_experts, kernels) == kMoeWideTileRows ? 256 : 128;
}

void MoeGroupedGemm(const MoeGemm& g, const MoeRouting& r, cudaStream_t stream,
                    MoeKernels kernels) {
  if (!r.complete()) {
    throw std::invalid_argument("MoeGroupedGemm: a MoeRouting array is null");
  }
  if (g.dtype != DType::kBF16 && g.dtype != DType::kF16) {
    throw std::invalid_argument("MoeGroupedGemm: dtype must be BF16 or F16, got " +
                                std::string(DTypeName(g.dtype)));
  }
  if (g.top_k < 1 || g.top_k > kMoeMaxTopK) {
    throw std::invalid_argument("MoeGroupedGemm: top_k " + std::to_string(g.top_k));
  }
  const bool fp8_w = g.w_scale != nullptr, w8a8 = g.x_scale != nullptr;
  if (w8a8 && !fp8_w) {
    throw std::invalid_argument("MoeGroupedGemm: e4m3 inputs (x_scale) need e4m3 weights");
  }
  const int64_t align = fp8_w ? 16 : 8;
  if (g.n <= 0 || g.k <= 0 || g.n % 8 != 0 || g.k % align != 0) {
    throw std::invalid_argument("MoeGroupedGemm: n (" + std::to_string(g.n) + ") must be a " +
                                "positive multiple of 8 and k (" + std::to_string(g.k) + ") of " +
                                std::to_string(align));
  }
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(g.x) || !aligned(g.w) || !aligned(g.out)) {
    throw std::invalid_argument("MoeGroupedGemm: x, w and out must be 16-byte aligned");
  }
  if (g.silu_mul && !MoeFusesSiluMul(g, kernels)) {
    throw std::invalid_argument(
        "MoeGroupedGemm: silu_mul needs kernel set v3-v5's GEMV (steps of at most " +
        std::to_string(kMoeGemvMaxTokens) + " tokens, or weight-only fp8) and out in dtype");
  }
  if (g.num_pairs <= 0) return;
  const int64_t tokens = g.num_pairs / g.top_k;
  // The GEMV: kV2-kV5's small steps (every expert has at most `tokens` rows, so one tile
  // each, and at most num_pairs tiles are not empty) and every weight-only fp8 call.
  const bool gemv = MoeUsesGemv(g, kernels);
  const bool v3 = kernels >= MoeKernels::kV3;
  const int64_t tiles = MoeMaxTiles(g.num_pairs, g.num_experts);
  const int64_t gemv_x = g.silu_mul ? (g.n / 2 + kGemvThreads / 32 - 1) / (kGemvThreads / 32)
                                    : (g.n + kGemvCtaRows - 1) / kGemvCtaRows;
  const dim3 grid = gemv ? dim3(unsigned(gemv_x), unsigned(std::min<int64_t>(tiles, g.num_pairs)))
                         : dim3(unsigned((g.n + kBn - 1) / kBn), unsigned(tiles));
  const dim3 block(gemv ? kGemvThreads : kGemmThreads);
  const auto* sorted = static_cast<const int32_t*>(r.sorted_pairs);
  if (g.wgmma_cols != 0 && g.wgmma_cols != 128 && g.wgmma_cols != 256) {
    throw std::invalid_argument("MoeGroupedGemm: wgmma_cols " + std::to_string(g.wgmma_cols) +
                                " (0, 128 or 256)");
  }
  // The routing's tiles (kV4's widest steps: 128 rows; their GEMMs are the wgmma tiles, and a
  // weight-only fp8 GEMV reads tiles of this many rows).
  const int tile_rows = MoeTileRows(g.num_pairs, g.num_experts, kernels);
  if (const int cols = MoeWgmmaCols(g, kernels); cols != 0) {  // kV4's wider steps, kV5's all
    moe_detail::LaunchMoeGemmWgmma(g, r, tile_rows, cols, stream);
    LLM_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // kV3-kV5's GEMV: rows per pass, the smallest power of two >= the step's tokens (at most 8).
  const int pass_rows = tokens <= 1 ? 1 : tokens <= 2 ? 2 : tokens <= 4 ? 4 : 8;
  auto run = [&](auto tag, auto out_f32_tag, auto fp8_tag) {
    using T = decltype(tag);
    constexpr bool kF32 = decltype(out_f32_tag)::value, kFp8 = decltype(fp8_tag)::value;
    const int n = int(g.n), k = int(g.k);
    const T* x = static_cast<const T*>(g.x);
    if (gemv && v3) {
      auto ring = [&](auto silu_tag, auto rows_tag) {
        constexpr bool kSilu = decltype(silu_tag)::value;
        if constexpr (!(kSilu && kF32)) {
          Launch(MoeGemvRingKernel<T, kF32, kFp8, kSilu, decltype(rows_tag)::value>, grid, block, 0,
                 stream, x, g.gather, g.top_k, g.w, g.w_scale, g.out, n, k, sorted, r.offsets,
                 r.tile_expert, r.tile_begin, r.num_tiles, tile_rows);
        }
      };
      auto by_rows = [&](auto silu_tag) {
        switch (pass_rows) {
          case 1:
            ring(silu_tag, std::integral_constant<int, 1>{});
            break;
          case 2:
            ring(silu_tag, std::integral_constant<int, 2>{});
            break;
          case 4:
            ring(silu_tag, std::integral_constant<int, 4>{});
            break;
          default:
            ring(silu_tag, std::integral_constant<int, 8>{});
            break;
        }
      };
      g.silu_mul ? by_rows(std::true_type{}) : by_rows(std::false_type{});
      return;
    }
    if (gemv) {
      Launch(MoeGemvKernel<T, kF32, kFp8>, grid, block, 0, stream, x, g.gather, g.top_k, g.w,
             g.w_scale, g.out, n, k, sorted, r.offsets, r.tile_expert, r.tile_begin, r.num_tiles);
      return;
    }
    auto kernel = !v3 ? (kernels == MoeKernels::kV2 ? MoeGemmKernel<T, kF32, 4, kFp8>
                                                    : MoeGemmKernel<T, kF32, 2, kFp8>)
                      : (Narrow(g) ? MoeGemmKernel<T, kF32, 4, kFp8, 1, true>
                                   : MoeGemmKernel<T, kF32, 4, kFp8, 2, true>);
    Launch(kernel, grid, block, 0, stream, g.x, g.x_scale, g.gather, g.top_k, g.w, g.w_scale, g.out,
           n, k, sorted, r.offsets, r.tile_expert, r.tile_begin, r.num_tiles);
  };
  auto by_out = [&](auto tag, auto fp8_tag) {
    g.out_f32 ? run(tag, std::true_type{}, fp8_tag) : run(tag, std::false_type{}, fp8_tag);
  };
  auto by_type = [&](auto fp8_tag) {
    g.dtype == DType::kBF16 ? by_out(__nv_bfloat16{}, fp8_tag) : by_out(__half{}, fp8_tag);
  };
  fp8_w ? by_type(std::true_type{}) : by_type(std::false_type{});
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda
