// Small-batch GEMV (design in gemv.h): the register kernel and the dispatch; the ring kernel is
// in gemv_ring.cu, the device code both share in gemv_device.cuh.
// Instantiations: {bf16, fp16} × N ∈ {1, 2, 4, 8} × (dtype and e4m3 weights: 5 epilogues + 3
// with the RMSNorm prologue) = 128, and bf16 × N × weights × 4 with the folded RMSNorm = 32.
// Registers: nvcc -Xptxas -v (the command in gemv.h); at n = 1 without spills: the dtype
// kernels at <= 64 (4 CTAs of 256 per SM; with the RMSNorm prologue <= 80, 3 CTAs: at 64 its
// RoPE variant spilled), the e4m3 ones at <= 80 (6 CTAs of 128; bench/RESULTS.md).
// Test:  the gemv*_gpu_test targets (ninja -C build <them>), then
//        (cd build && ctest -L gpu -R gemv); the fp8 kRopeAppendKv epilogue: the
//        kv_fp8*_gpu_test targets, ctest -L gpu -R kv_fp8 (GemvRopeFp8Gpu)
// Bench: ninja -C build bench_gemm_peak_gpu && ./build/bench_gemm_peak_gpu   (the "gemv" and
//        "decode_chain" lines)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"
#include "kernels/cuda/common/vec.cuh"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/gemv/gemv_device.cuh"
#include "kernels/fp8.h"

namespace llm::cuda {
namespace {

using namespace gemv_detail;

// The RMSNorm prologue (after PdlWait): every token's 1 / rms over its fp32 residual row (each
// thread sums the squares of chunks tid, tid + kThreads, ..., then the CTA reduces in a fixed
// order), then the normalized rows dtype(g * (x * inv_rms)), as cuda::AddRmsNorm computes
// them, into shared memory (xs: n * k dtype values), where the FMAs read them: one pass over
// the residual per CTA (L2), and no activation traffic past it.
template <typename T, int kThreads, int N>
__device__ __forceinline__ void NormalizeToShared(const GemvArgs& a, int n, uint4* xs) {
  const int64_t chunks = a.k / kChunk;
  __shared__ float part[kThreads / 32][N];
  __shared__ float inv_rms[N];
  float ss[N];
#pragma unroll
  for (int t = 0; t < N; ++t) ss[t] = 0.f;
    // Not unrolled: the two weight stages loaded before PdlWait are live here (registers).
#pragma unroll 1
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) break;
      float r[kChunk];
      vec::LoadF32<kChunk>(static_cast<const float*>(a.x) + t * a.k + c * kChunk, r);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) ss[t] += r[i] * r[i];
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < N; ++t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[t] += __shfl_xor_sync(0xffffffffu, ss[t], o);
    if (lane == 0) part[warp][t] = ss[t];
  }
  __syncthreads();
  if (threadIdx.x < N) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += part[w][threadIdx.x];
    // 1 / sqrt (IEEE), as cuda::AddRmsNorm.
    inv_rms[threadIdx.x] = 1.f / sqrtf(total / static_cast<float>(a.k) + a.eps);
  }
  __syncthreads();
#pragma unroll 1
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    float g[kChunk];
    vec::LoadF32<kChunk>(a.norm_weight + c * kChunk, g);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) break;
      float r[kChunk];
      vec::LoadF32<kChunk>(static_cast<const float*>(a.x) + t * a.k + c * kChunk, r);
      const float inv = inv_rms[t];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) r[i] = g[i] * (r[i] * inv);
      vec::Store<T, kChunk>(reinterpret_cast<T*>(xs + t * chunks + c), r);
    }
  }
  __syncthreads();
}

// Persistent over row groups: CTA b computes groups b, b + gridDim.x, b + 2 gridDim.x, ... (the
// grid is at most one wave, Gemv() sizes it). Its work is a sequence of items (group, stage),
// double buffered across group boundaries: the next item's weights are in flight while this
// one's FMAs, and a finished group's reduction and epilogue, run. Each group's sums reduce in
// the same fixed order as with one CTA per group.
// Fold: the folded RMSNorm (GemvArgs::rms_partials): kAccumulateF32 produces, the others
// consume.
template <typename T, typename W, GemvEpilogue E, bool Norm, bool Fold, int N>
__global__ void __launch_bounds__(W::kThreads, N == 1 ? (Norm && !kIsFp8<W> ? 3 : W::kCtasPerSm)
                                                      : 1) GemvKernel(GemvArgs a) {
  constexpr int kWarps = W::kThreads / 32;
  constexpr bool kFoldOut = Fold && E == GemvEpilogue::kAccumulateF32;
  constexpr bool kFoldIn = Fold && !kFoldOut;
  using Element = typename W::Element;
  static_assert(sizeof(Element) * kChunk * W::kSubChunks == 16, "16-byte weight chunks");
  const int64_t chunks = a.k / (kChunk * W::kSubChunks);  // 16-byte chunks per weight row
  const int stages = static_cast<int>((chunks + W::kStageChunks - 1) / W::kStageChunks);
  const int64_t stride = gridDim.x;
  const int my_groups = static_cast<int>((NumGroups<E>(a) - 1 - blockIdx.x) / stride + 1);
  const int items = my_groups * stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  ScaleSlots scales;  // e4m3
  auto group_of = [&](int item) { return int64_t(blockIdx.x) + (item / stages) * stride; };
  auto load = [&](Stage& st, int item) {
    const int64_t g = group_of(item);
    const int stage = item % stages;
    LoadStage<W, E>(st, a, g, stage, chunks);
    if constexpr (kIsFp8<W>) {
      if (stage == 0 && threadIdx.x < kRows) {
        scales.Set(item / stages, a.w_scale[WeightRow<E>(a, g, threadIdx.x)]);
      }
    }
  };
  // Weights are immutable: the first two items stream in before the previous kernel completes.
  Stage s0, s1;
  load(s0, 0);
  if (items > 1) load(s1, 1);
  PdlWait();
  PdlTrigger();
  const int n = static_cast<int>(a.n);
  // The prologue's normalized rows (dynamic shared memory, kGemvNormSharedBytes).
  extern __shared__ uint4 xs[];
  if constexpr (Norm) NormalizeToShared<T, W::kThreads, N>(a, n, xs);
  __shared__ RopeStage<N> rope_stage;
  if constexpr (E == GemvEpilogue::kRopeAppendKv) StageRope<N>(a, n, W::kThreads, rope_stage);
  // Consumer: each warp's share of the sums of squares per token (read by warp 0 after the
  // first group's barrier); the loads stall only this prologue, with two items of weights in
  // flight.
  __shared__ float rms_part[kFoldIn ? kWarps : 1][N];
  if constexpr (kFoldIn) SumPartials<W::kThreads, N>(a, n, rms_part);
  // Producer: warp 0's lane (r, t) holds y[t, j] of row r of the group in progress and the
  // next RMSNorm's weight[j], loaded when the group's first stage starts (after PdlWait: y is
  // the previous kernels' residual), used by its epilogue.
  float xold = 0.f, gnext = 0.f;
  auto begin_group = [&](int item) {
    if constexpr (kFoldOut) {
      if (item % stages != 0 || warp != 0 || lane >= kRows * N) return;
      const int r = lane / N, t = lane % N;
      LoadFoldRow(a, t, n, group_of(item) * kRows + r, xold, gnext);
    }
  };
  __shared__ float part[2][kWarps][kRows][N];  // by group parity: one barrier per group
  __shared__ float total[kRows][N];            // warp 0's epilogue scratch
  float acc[kRows][N];
  auto zero = [&] { ZeroAcc<N>(acc); };
  // After item `item`'s FMAs: when it was its group's last stage, reduce and finish the group.
  auto finish = [&](int item) {
    if (item % stages != stages - 1) return;
    const int gi = item / stages;
    float v;
    if (!ReduceGroup<kWarps, N>(
            acc, part[gi & 1], [] { __syncthreads(); }, v))
      return;
    const int r = lane / N, t = lane % N;
    const bool mine = lane < kRows * N;
    if constexpr (kIsFp8<W>) v = scales.Apply(gi, r, mine, v);
    if constexpr (kFoldIn) {  // the RMSNorm's 1 / rms, as cuda::AddRmsNorm computes it
      if (mine) {
        float ss = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) ss += rms_part[w][t];
        v *= 1.f / sqrtf(ss / static_cast<float>(a.k) + a.eps);
      }
    }
    Epilogue<T, E, Fold, N>(a, group_of(item), r, t, mine, v, total, rope_stage, xold, gnext);
  };
  // Each buffer is refilled with the item after next as soon as its FMAs have consumed it,
  // before the group's reduction.
  zero();
  for (int it = 0; it < items; it += 2) {
    begin_group(it);
    FmaStage<T, W, Norm, N>(s0, a, xs, n, it % stages, chunks, acc);
    if (it + 2 < items) load(s0, it + 2);
    finish(it);
    if (it + 1 < items) {
      begin_group(it + 1);
      FmaStage<T, W, Norm, N>(s1, a, xs, n, (it + 1) % stages, chunks, acc);
      if (it + 3 < items) load(s1, it + 3);
      finish(it + 1);
    }
  }
}

// One persistent wave: min(row groups, SMs × resident CTAs of this instantiation).
template <typename T, typename W, GemvEpilogue E, bool Norm, bool Fold, int N>
void LaunchPersistent(const GemvArgs& a, cudaStream_t stream) {
  static std::atomic<int> ctas_per_sm{0};  // the same on every device of a process (one arch)
  int per_sm = ctas_per_sm.load(std::memory_order_relaxed);
  // With the prologue, occupancy at the largest row it may hold (an upper bound on its shared
  // memory: registers bound the CTAs per SM first).
  const size_t smem = Norm ? size_t(a.n * a.k) * sizeof(T) : 0;
  if (per_sm == 0) {
    LLM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, GemvKernel<T, W, E, Norm, Fold, N>, W::kThreads, Norm ? kGemvNormSharedBytes : 0));
    per_sm = std::max(per_sm, 1);
    ctas_per_sm.store(per_sm, std::memory_order_relaxed);
  }
  const int64_t groups = NumGroups<E>(a);
  const int64_t slots = int64_t(NumSms()) * per_sm * a.waves;
  int64_t ctas = a.waves <= 0 ? groups : std::min(groups, slots);
  // GemvArgs::balanced: as few CTAs as give the same number of groups per CTA.
  if (a.balanced && a.waves > 0 && ctas > 0) {
    const int64_t per_cta = (groups + ctas - 1) / ctas;
    ctas = (groups + per_cta - 1) / per_cta;
  }
  if (a.max_ctas > 0) ctas = std::min<int64_t>(ctas, a.max_ctas);
  const dim3 grid(static_cast<unsigned>(ctas));
  Launch(GemvKernel<T, W, E, Norm, Fold, N>, grid, dim3(W::kThreads), smem, stream, a);
}

template <typename T, typename W, GemvEpilogue E, bool Norm, bool Fold = false>
void LaunchN(const GemvArgs& a, cudaStream_t stream) {
  if (a.n <= 1) {
    LaunchPersistent<T, W, E, Norm, Fold, 1>(a, stream);
  } else if (a.n <= 2) {
    LaunchPersistent<T, W, E, Norm, Fold, 2>(a, stream);
  } else if (a.n <= 4) {
    LaunchPersistent<T, W, E, Norm, Fold, 4>(a, stream);
  } else {
    LaunchPersistent<T, W, E, Norm, Fold, 8>(a, stream);
  }
}

// The folded RMSNorm (bf16 only: GemvSupports).
template <typename W>
void LaunchFolded(const GemvArgs& a, cudaStream_t stream) {
  using E = GemvEpilogue;
  using B = __nv_bfloat16;
  switch (a.epilogue) {
    case E::kAccumulateF32:
      return LaunchN<B, W, E::kAccumulateF32, false, true>(a, stream);
    case E::kStore:
      return LaunchN<B, W, E::kStore, false, true>(a, stream);
    case E::kSiluMul:
      return LaunchN<B, W, E::kSiluMul, false, true>(a, stream);
    case E::kRopeAppendKv:
      return LaunchN<B, W, E::kRopeAppendKv, false, true>(a, stream);
    case E::kStoreF32:
      break;
  }
  throw std::invalid_argument("Gemv: no folded RMSNorm with kStoreF32");
}

template <typename T>
void LaunchT(const GemvArgs& a, cudaStream_t stream) {
  using E = GemvEpilogue;
  using D = DTypeWeights<T>;
  const bool norm = a.norm_weight != nullptr;
  if (a.rms_partials != nullptr) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return a.w_scale != nullptr ? LaunchFolded<Fp8Weights>(a, stream)
                                  : LaunchFolded<D>(a, stream);
    }
    throw std::invalid_argument("Gemv: the folded RMSNorm needs bf16");
  }
  if (a.w_scale != nullptr) {  // e4m3 weights
    using F = Fp8Weights;
    switch (a.epilogue) {
      case E::kStore:
        return norm ? LaunchN<T, F, E::kStore, true>(a, stream)
                    : LaunchN<T, F, E::kStore, false>(a, stream);
      case E::kStoreF32:
        return LaunchN<T, F, E::kStoreF32, false>(a, stream);
      case E::kAccumulateF32:
        return LaunchN<T, F, E::kAccumulateF32, false>(a, stream);
      case E::kSiluMul:
        return norm ? LaunchN<T, F, E::kSiluMul, true>(a, stream)
                    : LaunchN<T, F, E::kSiluMul, false>(a, stream);
      case E::kRopeAppendKv:
        return norm ? LaunchN<T, F, E::kRopeAppendKv, true>(a, stream)
                    : LaunchN<T, F, E::kRopeAppendKv, false>(a, stream);
    }
    return;
  }
  switch (a.epilogue) {
    case E::kStore:
      return norm ? LaunchN<T, D, E::kStore, true>(a, stream)
                  : LaunchN<T, D, E::kStore, false>(a, stream);
    case E::kStoreF32:
      return LaunchN<T, D, E::kStoreF32, false>(a, stream);
    case E::kAccumulateF32:
      return LaunchN<T, D, E::kAccumulateF32, false>(a, stream);
    case E::kSiluMul:
      return norm ? LaunchN<T, D, E::kSiluMul, true>(a, stream)
                  : LaunchN<T, D, E::kSiluMul, false>(a, stream);
    case E::kRopeAppendKv:
      return norm ? LaunchN<T, D, E::kRopeAppendKv, true>(a, stream)
                  : LaunchN<T, D, E::kRopeAppendKv, false>(a, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool RopeOk(const GemvArgs& a) {
  const GemvRope& r = a.rope;
  return r.head_dim > 0 && r.head_dim % 4 == 0 && r.head_dim <= 2 * kRopeMaxHalf &&
         r.num_heads > 0 && r.num_kv_heads > 0 &&
         a.m == int64_t(r.num_heads + 2 * r.num_kv_heads) * r.head_dim && r.positions &&
         r.slot_mapping && r.inv_freq && r.k_cache && r.v_cache &&
         r.layout.head_dim == r.head_dim && r.layout.num_kv_heads == r.num_kv_heads;
}

}  // namespace

bool GemvSupports(const GemvArgs& a) {
  using E = GemvEpilogue;
  const bool norm_ok =
      a.norm_weight == nullptr ||
      ((a.epilogue == E::kStore || a.epilogue == E::kSiluMul || a.epilogue == E::kRopeAppendKv) &&
       Aligned16(a.norm_weight) && GemvNormFits(a.n, a.k));
  // The folded RMSNorm: bf16, not with the prologue; the producer needs its outputs, the
  // consumer its count.
  const bool fold_ok =
      a.rms_partials == nullptr ||
      (a.dtype == DType::kBF16 && a.norm_weight == nullptr &&
       (a.epilogue == E::kAccumulateF32
            ? a.rms_weight != nullptr && a.rms_x != nullptr
            : a.epilogue != E::kStoreF32 && a.rms_num_partials == (a.k + kRows - 1) / kRows));
  // The ring kernel: no RMSNorm prologue or fold; a ring that fits beside the static scratch.
  const bool ring_ok = !a.ring || (a.norm_weight == nullptr && a.rms_partials == nullptr &&
                                   a.ring_kib >= 1 && a.ring_kib <= kGemvMaxRingKib);
  const bool fp8 = a.w_scale != nullptr;  // 16 codes per 16-byte chunk
  const int64_t chunk_elements = fp8 ? 2 * kChunk : kChunk;
  return a.n >= 1 && a.n <= kGemvMaxTokens && a.k > 0 && a.k % chunk_elements == 0 && a.m > 0 &&
         (a.epilogue != E::kSiluMul || a.m % 2 == 0) &&
         (a.dtype == DType::kBF16 || a.dtype == DType::kF16) && Aligned16(a.x) && Aligned16(a.w) &&
         a.y != nullptr && norm_ok && fold_ok && ring_ok &&
         (a.epilogue != E::kRopeAppendKv || RopeOk(a));
}

void Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (!GemvSupports(a)) {
    throw std::invalid_argument(
        "Gemv: unsupported shape n=" + std::to_string(a.n) + " m=" + std::to_string(a.m) +
        " k=" + std::to_string(a.k) +
        " (n in [1, 8], k % 8 == 0 (fp8 weights: k % 16 == 0), even m "
        "for SiLU·mul, 16-byte aligned, bf16/f16, RMSNorm prologue only "
        "with store, SiLU·mul or RoPE and n·k·2 <= " +
        std::to_string(kGemvNormSharedBytes) +
        " bytes, the folded RMSNorm only bf16 and without the prologue, the ring kernel "
        "without either, "
        "RoPE shapes matching the KV layout)");
  }
  if (a.ring) return GemvRingLaunch(a, stream);  // gemv_ring.cu
  if (a.dtype == DType::kBF16) {
    LaunchT<__nv_bfloat16>(a, stream);
  } else {
    LaunchT<__half>(a, stream);
  }
}

}  // namespace llm::cuda
