// Prefill attention, rung 2 (v2_smem): shared-memory tiles, fp32 FMA (no tensor cores).
//
// Algorithm: one CTA per (64-row query tile, head, sequence), 256 threads = 4 per query row.
// Q (64 × d), and 32-key K/V tiles gathered through the block table, are converted to fp32 in
// shared memory (rows padded by one word so that the 8 rows a warp touches hit 8 banks).
// Per key tile: thread (row, sub) forms the scores of keys sub, sub+4, …; the row's max and
// the online softmax run over the 4 threads of a row (shuffles), P goes through shared memory,
// and each thread accumulates head_dim/4 output dimensions in registers.
// Test:  ninja -C build prefill_attention_gpu_test &&
//        (cd build && ctest -L gpu -R prefill_attention)
// Bench: ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
// Change from v1: K/V rows are read once per 64 query rows instead of once per row (64× less
// traffic), tiles are masked only on the causal diagonal, the loads are cooperative.
#include <cmath>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda::detail {
namespace {

struct SmemTraits {
  static constexpr int kBr = 64;  // query rows per CTA
  static constexpr int kBc = 32;  // keys per tile
  static_assert(kMaxKeyTile % kBc == 0,
                "FirstKeyRead (kernels/paged_kv.h): every key tile divides the widest");
  static constexpr int kThreadsPerRow = 4;
  static constexpr int kThreads = kBr * kThreadsPerRow;
  static constexpr int kMaxHd = 128;
  static constexpr int kPad = kMaxHd + 1;  // padded fp32 row stride of Q and K
  static constexpr int kKeysPerThread = kBc / kThreadsPerRow;
  static constexpr int kMaxDimsPerThread = kMaxHd / kThreadsPerRow;
  static constexpr size_t kSmemBytes =
      sizeof(float) * (kBr * kPad + kBc * kPad + kBc * kMaxHd + kBr * (kBc + 1));
  static_assert(kBc % kThreadsPerRow == 0 && kThreadsPerRow == 4, "row reductions use xor 1, 2");
  static_assert(kThreads <= 1024, "one CTA");
};

template <typename T>
__global__ void __launch_bounds__(SmemTraits::kThreads) PrefillSmemKernel(PrefillArgs a) {
  using Tr = SmemTraits;
  const TileCoords c = GetTileCoords(a, Tr::kBr);
  if (c.q0 >= c.q_len) return;
  extern __shared__ float smem[];
  float* sQ = smem;                       // [kBr][kPad]
  float* sK = sQ + Tr::kBr * Tr::kPad;    // [kBc][kPad]
  float* sV = sK + Tr::kBc * Tr::kPad;    // [kBc][kMaxHd]
  float* sP = sV + Tr::kBc * Tr::kMaxHd;  // [kBr][kBc + 1]
  const int hd = a.head_dim;
  const int tid = threadIdx.x, row = tid / Tr::kThreadsPerRow, sub = tid % Tr::kThreadsPerRow;
  const int r = c.q0 + row;
  const T* q = static_cast<const T*>(a.q);
  const T* kp = static_cast<const T*>(a.k);
  const T* vp = static_cast<const T*>(a.v);
  const int32_t* table = a.block_tables + c.seq * a.max_blocks_per_seq;

  for (int i = tid; i < Tr::kBr * hd; i += Tr::kThreads) {
    const int qr = i / hd, d = i % hd;
    sQ[qr * Tr::kPad + d] =
        c.q0 + qr < c.q_len
            ? ToF32(q[(int64_t(c.q_start + c.q0 + qr) * a.num_heads + c.head) * hd + d])
            : 0.f;
  }
  float acc[Tr::kMaxDimsPerThread];
#pragma unroll
  for (int i = 0; i < Tr::kMaxDimsPerThread; ++i) acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;  // l: this thread's partial row sum
  const int kv_end = min(c.num_keys, c.ctx + c.q0 + Tr::kBr);
  // Sliding window: this row's first visible key; the loop starts at the tile holding the
  // first row's (tiles left of it are skipped).
  const int row_begin = int(VisibleKeyBegin(c.ctx + r, a.sliding_window));
  const int tile_begin = int(VisibleKeyBegin(c.ctx + c.q0, a.sliding_window)) / Tr::kBc * Tr::kBc;
  for (int k0 = tile_begin; k0 < kv_end; k0 += Tr::kBc) {
    __syncthreads();  // previous tile consumed
    for (int i = tid; i < Tr::kBc * hd; i += Tr::kThreads) {
      const int kr = i / hd, d = i % hd, key = k0 + kr;
      float kv = 0.f, vv = 0.f;  // keys past the sequence: zeros (stale slots may hold NaN)
      if (key < c.num_keys) {
        const int64_t off = KvRowOffset(a, table, key, c.kv_head) + d;
        kv = ToF32(kp[off]);
        vv = ToF32(vp[off]);
      }
      sK[kr * Tr::kPad + d] = kv;
      sV[kr * Tr::kMaxHd + d] = vv;
    }
    __syncthreads();
    float s[Tr::kKeysPerThread];
    float tile_max = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < Tr::kKeysPerThread; ++jj) {
      const int j = sub + Tr::kThreadsPerRow * jj;
      float dot = 0.f;
      for (int d = 0; d < hd; ++d) dot = fmaf(sQ[row * Tr::kPad + d], sK[j * Tr::kPad + d], dot);
      const int key = k0 + j;  // causal mask, and the window's left edge
      s[jj] = key <= c.ctx + r && key >= row_begin ? dot * a.scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, s[jj]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    const float offset = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2f(m - offset);
    float sum = 0.f;
#pragma unroll
    for (int jj = 0; jj < Tr::kKeysPerThread; ++jj) {
      const float p = exp2f(s[jj] - offset);
      sum += p;
      sP[row * (Tr::kBc + 1) + sub + Tr::kThreadsPerRow * jj] = p;
    }
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();  // a row's 4 threads share one warp: P is visible to them
#pragma unroll
    for (int i = 0; i < Tr::kMaxDimsPerThread; ++i) acc[i] *= alpha;
    for (int j = 0; j < Tr::kBc; ++j) {
      const float p = sP[row * (Tr::kBc + 1) + j];
#pragma unroll
      for (int i = 0; i < Tr::kMaxDimsPerThread; ++i)
        if (sub + Tr::kThreadsPerRow * i < hd)
          acc[i] = fmaf(p, sV[j * Tr::kMaxHd + sub + Tr::kThreadsPerRow * i], acc[i]);
    }
    __syncwarp();
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (r >= c.q_len) return;
  T* out = static_cast<T*>(a.out) + (int64_t(c.q_start + r) * a.num_heads + c.head) * hd;
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int i = 0; i < Tr::kMaxDimsPerThread; ++i)
    if (sub + Tr::kThreadsPerRow * i < hd)
      out[sub + Tr::kThreadsPerRow * i] = FromF32<T>(acc[i] * inv_l);
}

template <typename T>
void Launch(const PrefillArgs& a, cudaStream_t stream) {
  using Tr = SmemTraits;
  LLM_CUDA_CHECK(cudaFuncSetAttribute(PrefillSmemKernel<T>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const dim3 grid(a.num_seqs * a.num_heads, (a.max_q_len + Tr::kBr - 1) / Tr::kBr);
  PrefillSmemKernel<T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void LaunchPrefillSmem(const PrefillArgs& a, cudaStream_t stream) {
  if (a.is_bf16) {
    Launch<__nv_bfloat16>(a, stream);
  } else {
    Launch<__half>(a, stream);
  }
}

}  // namespace llm::cuda::detail
