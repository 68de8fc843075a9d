// Prefill attention, rung 3 (v3_mma): tensor cores through mma.sync m16n8k16 — the
// FlashAttention-2 recipe.
//
// Algorithm: one CTA per (64-row query tile, head, sequence): 4 warps × 16 query rows.
//  - Q tile (64 × d) arrives by cp.async into XOR-swizzled shared memory and moves to
//    registers once (ldmatrix.x4: d/16 A fragments per warp).
//  - 64-key K/V tiles are gathered through the block table with 16-byte cp.async (a tile spans
//    64 / block_size pages; rows past the sequence are zero-filled), double-buffered: tile j+1
//    loads while tile j computes.
//  - Sliding window (PrefillArgs::sliding_window): the key loop starts at the tile holding the
//    first row's first visible key; a left mask applies only in tiles left of the last row's.
//  - S = Q·K^T (16 × 64 per warp, fp32 in registers, B fragments by ldmatrix from the swizzled
//    K tile), causal mask only on diagonal tiles, online softmax on the accumulator fragments
//    (row max/sum over the 4 threads of a row by shuffles, exp2 with scale·log2e folded into one
//    FMA), P converted to bf16/fp16 in registers as the A operand of O += P·V (V fragments by
//    ldmatrix.trans). O (16 × d per warp) stays in fp32 registers; 1/l at the end.
//  - Swizzle: 16-byte chunk c of row r lives at chunk c ^ (r % 8), so the 8 rows an ldmatrix
//    phase reads land in 8 distinct bank groups (no conflicts).
//  - head_dim 256 (Gemma 3; FA2's hdim-256 recipe): 32-key K/V tiles and Q re-read from its
//    shared tile at every k16 step instead of held in registers (O alone takes 128 registers);
//    96 KiB of shared memory, 2 CTAs per SM, 255 registers and no spills (ptxas -v).
// Test:  ninja -C build prefill_attention_gpu_test &&
//        (cd build && ctest -L gpu -R prefill_attention)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8
// Bench: ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
//        (--kv fp8: the e4m3 caches, which v3 dequantizes per tile)
// Change from v2: tensor cores (bf16 in, fp32 accumulate) instead of fp32 FMA; S and P never
// touch shared memory; asynchronous, double-buffered, swizzled tile loads.
#include <cuda_fp8.h>

#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"

namespace llm::cuda::detail {
namespace {

// kFp8: e4m3 caches. K/V tiles arrive as codes (half the bytes) in row-major staging; each
// thread dequantizes the 16-byte chunks it copied into fp16 swizzled tiles (exact), a barrier
// publishes them, and the tensor cores run in fp16 (Q fragments converted once, saturating).
template <int HD, bool kFp8 = false>
struct MmaTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBr = kWarps * 16;  // 16 query rows per warp (one m16 row block)
  // Keys per tile: 64; 32 at head_dim 256 (FA2's hdim-256 tile: 32 KiB of Q + 2 stages × 32 KiB
  // of K+V = 96 KiB, two CTAs per SM, and 16 fp32 S registers beside the 128 of O).
  static constexpr int kBc = HD == 256 ? 32 : 64;
  static_assert(kMaxKeyTile % kBc == 0,
                "FirstKeyRead (kernels/paged_kv.h): every key tile divides the widest");
  // Q's A fragments stay in registers (HD / 4 of them) up to head_dim 128; at 256 they would
  // take 64 registers on top of O's 128, so each k16 step re-reads them from the Q tile (an
  // ldmatrix.x4 per 16 dims per K tile, which shared memory has to spare).
  static constexpr bool kQInRegs = HD <= 128;
  static constexpr int kChunks = HD / 8;  // 16-byte chunks per row of a 2-byte tile
  static constexpr int kKvElemBytes = kFp8 ? 1 : 2;
  static constexpr int kKvChunks = HD * kKvElemBytes / 16;  // 16-byte copies per cached row
  static constexpr int kStages = 2;
  static constexpr size_t kQBytes = size_t(2) * kBr * HD;
  static constexpr size_t kStageTileBytes = size_t(kBc) * HD * kKvElemBytes;  // one K or V tile
  static constexpr size_t kCvtBytes = kFp8 ? size_t(2) * 2 * kBc * HD : 0;    // fp16 K and V
  static constexpr size_t kSmemBytes = kQBytes + kStages * 2 * kStageTileBytes + kCvtBytes;
  static_assert(HD == 64 || HD == 128 || HD == 256, "head_dim 64, 128 or 256");
  static_assert(kBc % 16 == 0 && kChunks >= 8, "swizzle spans 8 chunks");
  static_assert((kBc * kKvChunks) % kThreads == 0 && (kBr * kChunks) % kThreads == 0,
                "whole cp.async rounds");
};

using ptx::CpAsync16;  // 16-byte cp.async; 0 source bytes zero-fill the destination
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::FastExp2;
using ptx::LdMatrixX4;
using ptx::LdMatrixX4Trans;
using ptx::Mma16816;  // D (16×8 fp32) += A (16×16) · B (16×8)
using ptx::SmemAddr;
using vec::E4m3x2ToHalf2;  // two e4m3 codes -> their exact fp16 values, packed
using vec::ToMmaPair;      // a packed pair of T as one of the mma type (fp8: fp16, saturated)

// Element offset of 16-byte chunk `ch` of row `row` in a swizzled [rows][HD] tile.
template <int HD>
__device__ __forceinline__ int Swz(int row, int ch) {
  return row * HD + ((ch ^ (row & 7)) << 3);
}

template <typename T, int HD, bool kFp8>
__global__ void __launch_bounds__(MmaTraits<HD, kFp8>::kThreads) PrefillMmaKernel(PrefillArgs a) {
  using Tr = MmaTraits<HD, kFp8>;
  using M = std::conditional_t<kFp8, __half, T>;    // the tensor-core operand type
  using KV = std::conditional_t<kFp8, uint8_t, T>;  // the cached element type
  constexpr int kBr = Tr::kBr, kBc = Tr::kBc, kChunks = Tr::kChunks, kKvChunks = Tr::kKvChunks;
  constexpr int kKvChunkElems = 16 / Tr::kKvElemBytes;
  const TileCoords c = GetTileCoords(a, kBr);
  if (c.q0 >= c.q_len) return;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [kBr][HD] swizzled
  // [kStages][kBc][HD] each: swizzled (2-byte caches) or row-major codes (fp8).
  KV* sK = reinterpret_cast<KV*>(smem_raw + Tr::kQBytes);
  KV* sV = sK + Tr::kStages * kBc * HD;
  // fp8: the current tile dequantized to fp16, swizzled.
  M* cK = reinterpret_cast<M*>(smem_raw + Tr::kQBytes + Tr::kStages * 2 * Tr::kStageTileBytes);
  M* cV = cK + kBc * HD;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const KV* kp = static_cast<const KV*>(a.k);
  const KV* vp = static_cast<const KV*>(a.v);
  const int32_t* table = a.block_tables + c.seq * a.max_blocks_per_seq;

  // Q tile: rows past the chunk zero-filled.
  {
    const T* q = static_cast<const T*>(a.q);
#pragma unroll
    for (int i = 0; i < kBr * kChunks / Tr::kThreads; ++i) {
      const int idx = tid + i * Tr::kThreads, row = idx / kChunks, ch = idx % kChunks;
      const bool ok = c.q0 + row < c.q_len;
      const T* src =
          q + (int64_t(c.q_start + (ok ? c.q0 + row : 0)) * a.num_heads + c.head) * HD + ch * 8;
      CpAsync16(SmemAddr(sQ + Swz<HD>(row, ch)), src, ok ? 16 : 0);
    }
  }
  // One K/V tile (keys k0 … k0+kBc-1) into stage `st`, through the block table.
  auto load_kv = [&](int k0, int st) {
    KV* dk = sK + st * kBc * HD;
    KV* dv = sV + st * kBc * HD;
#pragma unroll
    for (int i = 0; i < kBc * kKvChunks / Tr::kThreads; ++i) {
      const int idx = tid + i * Tr::kThreads, row = idx / kKvChunks, ch = idx % kKvChunks;
      const int key = k0 + row;
      const bool ok = key < c.num_keys;  // past the sequence: zeros (stale slots may be NaN)
      const int64_t off = ok ? KvRowOffset(a, table, key, c.kv_head) + ch * kKvChunkElems : 0;
      const int dst = kFp8 ? (row * kKvChunks + ch) * kKvChunkElems : Swz<HD>(row, ch);
      CpAsync16(SmemAddr(dk + dst), kp + off, ok ? 16 : 0);
      CpAsync16(SmemAddr(dv + dst), vp + off, ok ? 16 : 0);
    }
  };
  // fp8: this thread's copies of stage `st` -> the fp16 tiles (copy (row, ch) = elements
  // [16·ch, 16·ch + 16): fp16 chunks 2·ch, 2·ch + 1).
  auto dequantize_kv = [&](int st) {
#pragma unroll
    for (int i = 0; i < kBc * kKvChunks / Tr::kThreads; ++i) {
      const int idx = tid + i * Tr::kThreads, row = idx / kKvChunks, ch = idx % kKvChunks;
      const int src = (row * kKvChunks + ch) * kKvChunkElems;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        const uint4 codes =
            *reinterpret_cast<const uint4*>((kv == 0 ? sK : sV) + st * kBc * HD + src);
        M* dst = kv == 0 ? cK : cV;
        *reinterpret_cast<uint4*>(dst + Swz<HD>(row, 2 * ch)) =
            make_uint4(E4m3x2ToHalf2(codes.x), E4m3x2ToHalf2(codes.x >> 16), E4m3x2ToHalf2(codes.y),
                       E4m3x2ToHalf2(codes.y >> 16));
        *reinterpret_cast<uint4*>(dst + Swz<HD>(row, 2 * ch + 1)) =
            make_uint4(E4m3x2ToHalf2(codes.z), E4m3x2ToHalf2(codes.z >> 16), E4m3x2ToHalf2(codes.w),
                       E4m3x2ToHalf2(codes.w >> 16));
      }
    }
  };

  const int kv_end = min(c.num_keys, c.ctx + c.q0 + kBr);  // keys any row of the tile sees
  const int n_tiles = (kv_end + kBc - 1) / kBc;
  // Sliding window: tiles start at the one holding the first row's first visible key (those
  // left of it are skipped); rows whose window starts inside a tile get a left mask there, in
  // the tiles left of the last row's first key (none without a window: left_end = 0).
  const int W = a.sliding_window;
  const int j_begin = int(VisibleKeyBegin(c.ctx + c.q0, W)) / kBc;
  const int left_end = int(VisibleKeyBegin(c.ctx + c.q0 + kBr - 1, W));
  load_kv(j_begin * kBc, j_begin & 1);
  CpAsyncCommit();

  const int g = lane / 4, t = lane % 4;   // mma fragment coordinates
  const int row0 = c.q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  const int row_begin[2] = {int(VisibleKeyBegin(c.ctx + row0, W)),
                            int(VisibleKeyBegin(c.ctx + row0 + 8, W))};
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // l: this thread's partial sums
  uint32_t qf[Tr::kQInRegs ? HD / 16 : 1][4];  // Q's A fragments (kQInRegs; else re-read)
  // Q's A fragment of k16 step kk, converted to the mma type.
  auto q_fragment = [&](int kk, uint32_t(&f)[4]) {
    LdMatrixX4(f, SmemAddr(sQ + Swz<HD>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))));
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = ToMmaPair<T, M>(f[e]);
  };

  for (int j = j_begin; j < n_tiles; ++j) {
    CpAsyncWait<0>();
    __syncthreads();  // tile j resident for all; everyone is done with tile j-1's stage
    if constexpr (Tr::kQInRegs) {
      if (j == j_begin) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) q_fragment(kk, qf[kk]);
      }
    }
    if (j + 1 < n_tiles) load_kv((j + 1) * kBc, (j + 1) & 1);
    CpAsyncCommit();
    const M* tk;
    const M* tv;
    if constexpr (kFp8) {
      // Own copies of tile j landed (the wait above) and everyone finished tile j - 1 (the
      // barrier above), so the fp16 tiles are free; a second barrier publishes them.
      dequantize_kv(j & 1);
      __syncthreads();
      tk = cK;
      tv = cV;
    } else {
      tk = sK + (j & 1) * kBc * HD;
      tv = sV + (j & 1) * kBc * HD;
    }

    // S = Q K^T: 16 × kBc per warp.
    float s[kBc / 8][4];
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      // (head_dim 256: unrolled by 2 only, so that ptxas does not keep the 16 steps' Q and K
      // addresses live beside O's 128 accumulators: fully unrolled, it spilled 64 bytes.)
#pragma unroll(Tr::kQInRegs ? HD / 16 : 2)
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t qs[4];
      if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qs[e] = qf[kk][e];
      } else {
        q_fragment(kk, qs);
      }
#pragma unroll
      for (int n2 = 0; n2 < kBc / 16; ++n2) {
        uint32_t b[4];
        LdMatrixX4(b, SmemAddr(tk + Swz<HD>(n2 * 16 + (lane & 7) + ((lane >> 4) << 3),
                                            kk * 2 + ((lane >> 3) & 1))));
        Mma16816<M>(s[2 * n2], qs, b[0], b[1]);
        Mma16816<M>(s[2 * n2 + 1], qs, b[2], b[3]);
      }
    }
    // Causal mask, only where some key of the tile is past some row's diagonal.
    const int k0 = j * kBc;
    if (k0 + kBc - 1 > c.ctx + c.q0) {
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + 2 * t + (e & 1);
          const int row = row0 + (e >> 1) * 8;
          if (key > c.ctx + row) s[n][e] = -INFINITY;
        }
    }
    // The window's left edge, only where some row's window starts past the tile's first key.
    // A row left with no visible key in this tile keeps m = -inf (offset 0, alpha 0 later).
    if (k0 < left_end) {
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + n * 8 + 2 * t + (e & 1) < row_begin[e >> 1]) s[n][e] = -INFINITY;
    }
    // Online softmax per row (h = 0: row0, h = 1: row0 + 8).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx * a.scale_log2);
      const float offset = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = FastExp2(m[h] - offset);
      m[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[n][e] = FastExp2(fmaf(s[n][e], a.scale_log2, -offset));
          sum += s[n][e];
        }
      }
      l[h] = l[h] * alpha + sum;
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        o[i][2 * h] *= alpha;
        o[i][2 * h + 1] *= alpha;
      }
    }
    // O += P V: P (16 × kBc) from the S fragments, V fragments by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = PackPair<M>(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = PackPair<M>(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = PackPair<M>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = PackPair<M>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int d2 = 0; d2 < HD / 16; ++d2) {
        uint32_t b[4];
        LdMatrixX4Trans(b, SmemAddr(tv + Swz<HD>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                 d2 * 2 + (lane >> 4))));
        Mma16816<M>(o[2 * d2], pa, b[0], b[1]);
        Mma16816<M>(o[2 * d2 + 1], pa, b[2], b[3]);
      }
    }
  }

  // Normalise and store (rows past the chunk are dropped).
  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lt = l[h];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float inv = (lt > 0.f ? 1.f / lt : 0.f) * (kFp8 ? a.out_scale : 1.f);
    const int row = row0 + h * 8;
    if (row < c.q_len) {
      T* dst = out + (int64_t(c.q_start + row) * a.num_heads + c.head) * HD + 2 * t;
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        *reinterpret_cast<uint32_t*>(dst + i * 8) =
            PackPair<T>(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
      }
    }
  }
}

template <typename T, int HD, bool kFp8>
void Launch(const PrefillArgs& a, cudaStream_t stream) {
  using Tr = MmaTraits<HD, kFp8>;
  auto kernel = PrefillMmaKernel<T, HD, kFp8>;
  LLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const dim3 grid(a.num_seqs * a.num_heads, (a.max_q_len + Tr::kBr - 1) / Tr::kBr);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T, bool kFp8>
void LaunchDim(const PrefillArgs& a, cudaStream_t stream) {
  if (a.head_dim == 256) {
    Launch<T, 256, kFp8>(a, stream);
  } else {
    a.head_dim == 64 ? Launch<T, 64, kFp8>(a, stream) : Launch<T, 128, kFp8>(a, stream);
  }
}

void LaunchPrefillMma(const PrefillArgs& a, cudaStream_t stream) {
  if (a.is_bf16) {
    a.kv_fp8 ? LaunchDim<__nv_bfloat16, true>(a, stream)
             : LaunchDim<__nv_bfloat16, false>(a, stream);
  } else {
    a.kv_fp8 ? LaunchDim<__half, true>(a, stream) : LaunchDim<__half, false>(a, stream);
  }
}

}  // namespace llm::cuda::detail
