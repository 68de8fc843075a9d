// Prefill attention, rung 1 (v1_naive): the correctness baseline.
//
// Algorithm: one warp per (query row, head); lane j holds dimensions j, j + 32, … (any
// head_dim ≤ 256: also the tiny ones of test models). For every visible key (0 … ctx + r, or
// with a sliding window VisibleKeyBegin(ctx + r, W) … ctx + r,
// read through the block table) the warp forms the dot product by a shuffle reduction and
// applies the scalar online softmax (kernels/online_softmax.h: log2-domain scores, exp2,
// running max m and sum l) to its fp32 accumulator. No tiling, no reuse: every K/V row is
// read from L2/HBM once per query row.
// Test:  ninja -C build prefill_attention_gpu_test &&
//        (cd build && ctest -L gpu -R prefill_attention)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8
// Bench: ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
// Previous rung: none (the CPU reference cpu::PagedPrefillAttention is the specification).
#include <cmath>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda::detail {
namespace {

struct NaiveTraits {
  static constexpr int kWarps = 4;  // query rows per CTA
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMaxDimsPerLane = 8;  // head_dim ≤ 256
};

// KV: T, or uint8_t for e4m3 caches (k_scale is in scale_log2, v_scale in out_scale).
template <typename T, typename KV>
__global__ void __launch_bounds__(NaiveTraits::kThreads) PrefillNaiveKernel(PrefillArgs a) {
  using Tr = NaiveTraits;
  const TileCoords c = GetTileCoords(a, Tr::kWarps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = c.q0 + warp;  // query row within the chunk
  if (r >= c.q_len) return;
  const int hd = a.head_dim;
  auto has = [&](int i) { return lane + 32 * i < hd; };
  const T* q = static_cast<const T*>(a.q) + (int64_t(c.q_start + r) * a.num_heads + c.head) * hd;
  const KV* kp = static_cast<const KV*>(a.k);
  const KV* vp = static_cast<const KV*>(a.v);
  const int32_t* table = a.block_tables + c.seq * a.max_blocks_per_seq;
  float qv[Tr::kMaxDimsPerLane], acc[Tr::kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < Tr::kMaxDimsPerLane; ++i) {
    qv[i] = has(i) ? ToF32(q[lane + 32 * i]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int last_key = c.ctx + r;  // causal: keys 0 … ctx + r (a window: from its first key)
  for (int key = int(VisibleKeyBegin(last_key, a.sliding_window)); key <= last_key; ++key) {
    const int64_t off = KvRowOffset(a, table, key, c.kv_head);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < Tr::kMaxDimsPerLane; ++i)
      if (has(i)) dot = fmaf(qv[i], KvToF32(kp[off + lane + 32 * i]), dot);
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    const float s2 = dot * a.scale_log2;  // log2-domain score
    const float m_new = fmaxf(m, s2);
    const float alpha = exp2f(m - m_new);  // m = -inf on the first key: alpha = 0
    const float p = exp2f(s2 - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < Tr::kMaxDimsPerLane; ++i)
      if (has(i)) acc[i] = fmaf(p, KvToF32(vp[off + lane + 32 * i]), acc[i] * alpha);
    m = m_new;
  }
  T* out = static_cast<T*>(a.out) + (int64_t(c.q_start + r) * a.num_heads + c.head) * hd;
  const float inv_l = (l > 0.f ? 1.f / l : 0.f) * a.out_scale;
#pragma unroll
  for (int i = 0; i < Tr::kMaxDimsPerLane; ++i)
    if (has(i)) out[lane + 32 * i] = FromF32<T>(acc[i] * inv_l);
}

}  // namespace

void LaunchPrefillNaive(const PrefillArgs& a, cudaStream_t stream) {
  const dim3 grid(a.num_seqs * a.num_heads,
                  (a.max_q_len + NaiveTraits::kWarps - 1) / NaiveTraits::kWarps);
  constexpr int kThreads = NaiveTraits::kThreads;
  if (a.is_bf16) {
    if (a.kv_fp8) {
      PrefillNaiveKernel<__nv_bfloat16, uint8_t><<<grid, kThreads, 0, stream>>>(a);
    } else {
      PrefillNaiveKernel<__nv_bfloat16, __nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
    }
  } else {
    if (a.kv_fp8) {
      PrefillNaiveKernel<__half, uint8_t><<<grid, kThreads, 0, stream>>>(a);
    } else {
      PrefillNaiveKernel<__half, __half><<<grid, kThreads, 0, stream>>>(a);
    }
  }
  LLM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llm::cuda::detail
