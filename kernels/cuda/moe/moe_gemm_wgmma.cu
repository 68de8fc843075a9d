// kV4's grouped GEMM tiles (kernels/cuda/moe/moe.h: MoeKernels::kV4): Hopper warpgroup MMAs
// (wgmma, sm_90a) over the routing's tiles, for steps whose experts average more than 32 rows
// (prefill-size steps; on kV4 smaller ones keep kV3's mma.sync tiles that skip empty
// fragments, on kV5 they come here too; the smallest take the GEMV). The routing cuts 64-row tiles,
// or 128-row ones where the experts average at least 128 rows (MoeTileRows).
//
// A CTA covers one routing tile (kWgM = tile rows / 64 warpgroups along m) and kCols outputs
// (kWgN warpgroups along n of kWn outputs each): each warpgroup computes 64 rows x kWn outputs
// with wgmma m64n{kWn}k16 (bf16 / fp16) or m64n{kWn}k32 (W8A8 e4m3), both operands from shared
// memory. The shapes: 64 x 128 and 64 x 256 (one or two warpgroups along n) on 64-row tiles,
// 128 x 128 and 128 x 256 (two warpgroups along m, n 128 or 256) on 128-row tiles; a larger
// tile reads fewer bytes per multiply-add from L2 (64 x 256: 51 FLOP/byte, 128 x 256: 85).
// A stage is one 128-byte panel of k (64 bf16 / fp16 elements or 128 e4m3 codes) of the tile's
// input rows (gathered: row r is x[sorted_pairs / top_k] when MoeGemm::gather) and of the CTA's
// kCols weight rows, 128B-swizzled (16-byte chunk c of row r at r · 128 + (c ^ r % 8) · 16, the
// layout the descriptors name), copied by every thread with cp.async (the gathered rows rule
// out TMA boxes on Hopper). kStages stages: the copies run kStages - 2 panels ahead of the one
// the wgmmas read; the stage refilled at step kt is the one step kt - 2's wgmmas read, which
// every warpgroup has waited for (wgmma.wait_group 1 at step kt - 1) before the barrier of step
// kt. The epilogue writes the accumulators as kV3's tiles do (fp32 or dtype, the W8A8 scales
// applied). The rows past an expert's last in its last tile are copied as zeros (no bytes
// read); a warpgroup whose 64 rows are all past it skips its MMAs, the others multiply them
// (a warpgroup MMA is 64 rows) and do not write their outputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/moe/fragment_store.cuh"
#include "kernels/cuda/moe/moe_gemm_wgmma.h"

namespace llm::cuda::moe_detail {
namespace {

constexpr int kPanelBytes = 128;  // a row's bytes of k per stage (one 128B swizzle span)
constexpr int kChunks = kPanelBytes / 16;
constexpr int kStages = 4;
// The CTAs' order: groups of kGroupRows rows of consecutive tiles (a Mixtral expert's at 4,096
// tokens) walk the n blocks together, tile fastest, so that the CTAs in flight share a few
// weight blocks and input tiles in L2. With n blocks fastest, each tile swept its expert's whole
// matrix (Mixtral-8x7B's gate|up: 235 MB, past L2) before the expert's next tile came to read it
// again: 186 TFLOP/s at 4,096 tokens on the H100, 427 with the groups (64 x 256 tiles).
constexpr int kGroupRows = 1024;

template <int kWgM, int kWgN, int kWn>
struct WgmmaTile {
  static constexpr int kRows = 64 * kWgM;  // the routing tile's
  static constexpr int kThreads = 128 * kWgM * kWgN;
  static constexpr int kCols = kWn * kWgN;  // the CTA's outputs
  static constexpr int kAcc = kWn / 2;      // accumulators per thread
  static constexpr int kABytes = kRows * kPanelBytes;
  static constexpr int kBBytes = kCols * kPanelBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes;  // + the 1024-byte alignment
  static constexpr int kGroupTiles = kGroupRows / kRows;
  // Each thread's 16-byte copies per stage: kAPer of A, kBPer of B, all of one chunk column.
  static constexpr int kAPer = kRows * kChunks / kThreads, kBPer = kCols * kChunks / kThreads;
  static_assert(kWn == 128 || kWn == 256, "wgmma m64n128 or m64n256");
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "1024-byte swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "fits one SM");
  static_assert(kThreads / kChunks % 8 == 0, "a thread's rows share their swizzle phase");
  static_assert(kAPer >= 1 && kBPer >= 1, "every thread copies A and B");
};

// One k panel's MMAs of a warpgroup: 4 steps of 32 bytes (k16 of bf16 / fp16, k32 of e4m3).
template <typename T, bool kFp8, int kN>
__device__ __forceinline__ void PanelMmas(float (&acc)[kN / 2], ptx::DescBase da, ptx::DescBase db,
                                          uint32_t off) {
#pragma unroll
  for (int kk = 0; kk < kPanelBytes / 32; ++kk) {
    const uint64_t a = ptx::DescAt(da, off + kk * 32), b = ptx::DescAt(db, off + kk * 32);
    if constexpr (kN == 128 && kFp8) {
      ptx::WgmmaSS128E4m3(acc, a, b, 1);
    } else if constexpr (kN == 128) {
      ptx::WgmmaSS128(acc, a, b, 1, T{});
    } else if constexpr (kFp8) {
      ptx::WgmmaSS256E4m3(acc, a, b, 1);
    } else {
      ptx::WgmmaSS256(acc, a, b, 1, T{});
    }
  }
}

template <typename T, bool kOutF32, bool kFp8, int kWgM, int kWgN, int kWn>
__global__ void __launch_bounds__(WgmmaTile<kWgM, kWgN, kWn>::kThreads)
    MoeGemmWgmmaKernel(const void* x_in, const float* x_scale, bool gather, int top_k,
                       const void* w_in, const float* w_scale, void* out, int n, int k,
                       const int32_t* sorted_pairs, const int32_t* offsets,
                       const int32_t* tile_expert, const int32_t* tile_begin,
                       const int32_t* num_tiles) {
  using Tile = WgmmaTile<kWgM, kWgN, kWn>;
  using E = std::conditional_t<kFp8, uint8_t, T>;
  constexpr int kRows = Tile::kRows;
  constexpr int kElems = 16 / int(sizeof(E));  // elements per 16-byte chunk
  constexpr int kTileK = kPanelBytes / int(sizeof(E));
  extern __shared__ uint8_t smem_raw[];
  __shared__ int a_rows[kRows];
  PdlWait();
  PdlTrigger();
  // CTA -> (tile, n block): gridDim.x = n blocks x tiles (the host's upper bound).
  const int n_blocks = (n + Tile::kCols - 1) / Tile::kCols;
  const int max_tiles = int(gridDim.x) / n_blocks;
  const int group = int(blockIdx.x) / (Tile::kGroupTiles * n_blocks);
  const int in_group = int(blockIdx.x) % (Tile::kGroupTiles * n_blocks);
  const int group_tiles = min(Tile::kGroupTiles, max_tiles - group * Tile::kGroupTiles);
  const int tile = group * Tile::kGroupTiles + in_group % group_tiles;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile], row0 = tile_begin[tile];
  const int rows = min(kRows, offsets[e + 1] - row0);
  const int n0 = in_group / group_tiles * Tile::kCols;
  for (int i = threadIdx.x; i < kRows; i += Tile::kThreads) {
    a_rows[i] = i < rows ? (gather ? sorted_pairs[row0 + i] / top_k : row0 + i) : -1;
  }
  __syncthreads();
  const uint32_t base = (ptx::SmemAddr(smem_raw) + 1023) & ~1023u;
  // This thread's copies: chunk column ch of rows r0 + i · kRowStep; every such row has the
  // same r % 8 (kRowStep is a multiple of 8), so one swizzled column offset.
  const int ch = int(threadIdx.x) % kChunks, r0 = int(threadIdx.x) / kChunks;
  constexpr int kRowStep = Tile::kThreads / kChunks;
  const uint32_t swz = uint32_t(r0 * kPanelBytes + ((ch ^ (r0 & 7)) << 4));
  const E* x = static_cast<const E*>(x_in);
  const E* we = static_cast<const E*>(w_in) + int64_t(e) * n * k;
  const E* a_src[Tile::kAPer];  // null: a row past the tile's last (copied as zeros)
#pragma unroll
  for (int i = 0; i < Tile::kAPer; ++i) {
    const int src = a_rows[r0 + i * kRowStep];
    a_src[i] = src >= 0 ? x + int64_t(src) * k + ch * kElems : nullptr;
  }
  const E* b_src = we + int64_t(n0 + r0) * k + ch * kElems;
  auto load = [&](int stage, int k0) {
    const uint32_t sa = base + uint32_t(stage) * Tile::kStageBytes + swz;
    const uint32_t sb = sa + Tile::kABytes;
    const bool col_ok = k0 + ch * kElems < k;
#pragma unroll
    for (int i = 0; i < Tile::kAPer; ++i) {
      const bool ok = col_ok && a_src[i] != nullptr;
      ptx::CpAsync16(sa + uint32_t(i * kRowStep * kPanelBytes), ok ? a_src[i] + k0 : x,
                     ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < Tile::kBPer; ++i) {
      const bool ok = col_ok && n0 + r0 + i * kRowStep < n;
      ptx::CpAsync16(sb + uint32_t(i * kRowStep * kPanelBytes),
                     ok ? b_src + int64_t(i * kRowStep) * k + k0 : we, ok ? 16 : 0);
    }
    ptx::CpAsyncCommit();
  };
  // Warpgroup (wm, wn): rows wm · 64 .., outputs wn · kWn .. of the CTA's.
  const int wg = int(threadIdx.x) / 128, wm = wg / kWgN, wn = wg % kWgN;
  const bool live = wm * 64 < rows;  // warpgroup-uniform: some of its rows exist
  const ptx::DescBase da = ptx::MakeDescBase(base + uint32_t(wm) * 64 * kPanelBytes, 16, 1024);
  const ptx::DescBase db =
      ptx::MakeDescBase(base + Tile::kABytes + uint32_t(wn) * kWn * kPanelBytes, 16, 1024);
  float acc[Tile::kAcc];
#pragma unroll
  for (int i = 0; i < Tile::kAcc; ++i) acc[i] = 0.f;
  const int k_tiles = (k + kTileK - 1) / kTileK;
  constexpr int kAhead = kStages - 2;
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < k_tiles) {
      load(st, st * kTileK);
    } else {
      ptx::CpAsyncCommit();
    }
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Panel kt landed (this thread's copies), made visible to the async proxy, then every
    // thread's: the barrier. Past it, every warpgroup has also finished step kt - 2's wgmmas.
    ptx::CpAsyncWait<kAhead - 1>();
    ptx::FenceProxyAsync();
    __syncthreads();
    const int next = kt + kAhead;
    if (next < k_tiles) {
      load(next % kStages, next * kTileK);
    } else {
      ptx::CpAsyncCommit();
    }
    if (!live) continue;
    ptx::WgmmaFence();
    ptx::FenceRegs(acc);
    PanelMmas<T, kFp8, kWn>(acc, da, db, uint32_t(kt % kStages) * Tile::kStageBytes);
    ptx::WgmmaCommit();
    ptx::FenceRegs(acc);
    ptx::WgmmaWait<1>();
  }
  ptx::WgmmaWait<0>();
  ptx::FenceRegs(acc);
  ptx::CpAsyncWaitAll();  // the empty tail groups: no copy lands after the CTA exits
  if (!live) return;
  // acc[4j + 2h + c]: row wm · 64 + (warp % 4) · 16 + lane / 4 + 8h, output
  // n0 + wn · kWn + 8j + 2 (lane % 4) + c.
  const int lane = int(threadIdx.x) % 32;
  const int wr = wm * 64 + (int(threadIdx.x) / 32) % 4 * 16 + lane / 4;
  const FragmentStore<T, kOutF32, kFp8> store{out, n, row0, rows, e, w_scale, x_scale, a_rows};
#pragma unroll
  for (int j = 0; j < kWn / 8; ++j) {
    const int col = n0 + wn * kWn + j * 8 + (lane % 4) * 2;
    if (col < n) store(wr, col, &acc[4 * j]);
  }
}

template <typename T, bool kOutF32, bool kFp8, int kWgM, int kWgN, int kWn>
void LaunchTyped(const MoeGemm& g, const MoeRouting& r, cudaStream_t stream) {
  using Tile = WgmmaTile<kWgM, kWgN, kWn>;
  auto kernel = MoeGemmWgmmaKernel<T, kOutF32, kFp8, kWgM, kWgN, kWn>;
  // Every call, as the prefill kernels do (a host-side attribute, per device; allowed while a
  // stream is captured).
  LLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const int64_t n_blocks = (g.n + Tile::kCols - 1) / Tile::kCols;
  const dim3 grid(unsigned(n_blocks * MoeMaxTiles(g.num_pairs, g.num_experts, Tile::kRows)));
  Launch(kernel, grid, dim3(Tile::kThreads), Tile::kSmemBytes, stream, g.x, g.x_scale, g.gather,
         g.top_k, g.w, g.w_scale, g.out, int(g.n), int(g.k),
         static_cast<const int32_t*>(r.sorted_pairs), static_cast<const int32_t*>(r.offsets),
         static_cast<const int32_t*>(r.tile_expert), static_cast<const int32_t*>(r.tile_begin),
         static_cast<const int32_t*>(r.num_tiles));
}

}  // namespace

void LaunchMoeGemmWgmma(const MoeGemm& g, const MoeRouting& r, int tile_rows, int cols,
                        cudaStream_t stream) {
  auto by_shape = [&](auto tag, auto f32_tag, auto fp8_tag) {
    using T = decltype(tag);
    constexpr bool kF32 = decltype(f32_tag)::value, kFp8 = decltype(fp8_tag)::value;
    if (tile_rows == 128) {
      cols == 128 ? LaunchTyped<T, kF32, kFp8, 2, 1, 128>(g, r, stream)
                  : LaunchTyped<T, kF32, kFp8, 2, 1, 256>(g, r, stream);
    } else {
      cols == 128 ? LaunchTyped<T, kF32, kFp8, 1, 1, 128>(g, r, stream)
                  : LaunchTyped<T, kF32, kFp8, 1, 2, 128>(g, r, stream);
    }
  };
  auto by_out = [&](auto tag, auto fp8_tag) {
    g.out_f32 ? by_shape(tag, std::true_type{}, fp8_tag)
              : by_shape(tag, std::false_type{}, fp8_tag);
  };
  auto by_type = [&](auto fp8_tag) {
    g.dtype == DType::kBF16 ? by_out(__nv_bfloat16{}, fp8_tag) : by_out(__half{}, fp8_tag);
  };
  g.x_scale != nullptr ? by_type(std::true_type{}) : by_type(std::false_type{});
}

}  // namespace llm::cuda::moe_detail
