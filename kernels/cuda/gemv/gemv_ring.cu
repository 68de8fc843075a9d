// The small-batch GEMV's ring kernel (GemvArgs::ring, design in gemv.h; the shared device code
// in gemv_device.cuh). Instantiations: {bf16, fp16} × N ∈ {1, 2, 4, 8} × (dtype, e4m3 weights)
// × 5 epilogues = 80, at n = 1 <= 64 registers; dtype weights <= 112 so that two CTAs of 288
// threads fit an SM's registers, e4m3 (160 threads) <= 116; no spills (nvcc -Xptxas -v, the
// command in gemv.h with this file).
// Test: gemv_gpu_test, gemv_fused_gpu_test (the ring runs), cuda_executor_gpu_test
//       (RingGemvIsBitIdenticalToTheRegisterKernel).
#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/gemv/gemv_device.cuh"

namespace llm::cuda {
namespace {

using namespace gemv_detail;

// ---- The ring kernel (GemvArgs::ring) ------------------------------------------------------
// Its weights come through a ring of stages in shared memory, filled by bulk copies that one
// producer warp issues as soon as a slot is free, so the registers hold no weights in flight
// and a CTA is one per SM at ~100 KiB: the next kernel's CTAs fit beside it. It lets dependents
// launch first thing (PdlTrigger before PdlWait), and its producer starts streaming before the
// previous kernel has finished (weights are immutable): a GEMV after an RMSNorm or the decode
// attention has its first GemvArgs::ring_kib per SM in shared memory before it may read x. Items,
// chunks per thread, FMAs and the reduction order are those of GemvKernel: the same bits.
template <typename W>
struct Ring {
  static constexpr int kRowBytes = W::kStageChunks * 16;  // a row's share of a stage
  static constexpr int kSlotBytes = kRows * kRowBytes;    // one (group, stage) item
  // Slots of a ring of `kib` KiB (at least 2), and the dynamic shared memory they take with
  // their two mbarriers each.
  __host__ __device__ static int Slots(int kib) {
    const int s = kib * 1024 / kSlotBytes;
    return s < 2 ? 2 : s;
  }
  static size_t SmemBytes(int kib) { return size_t(Slots(kib)) * (kSlotBytes + 16); }
};

template <typename T, typename W, GemvEpilogue E, int N>
__global__ void __launch_bounds__(W::kThreads + 32, 2) GemvRingKernel(GemvArgs a) {
  using R = Ring<W>;
  constexpr int kWarps = W::kThreads / 32;  // computing warps; warp kWarps is the producer
  static_assert(kUnroll == 1, "a slot holds one 16-byte chunk per row per computing thread");
  PdlTrigger();
  extern __shared__ __align__(128) uint8_t ring_smem[];
  const uint32_t ring = SmemAddr(ring_smem);
  const int num_slots = R::Slots(a.ring_kib);
  const uint32_t full = ring + num_slots * R::kSlotBytes;  // slot s: full + 8 s, empty + 8 s
  const uint32_t empty = full + 8 * num_slots;
  const int64_t chunks = a.k / (kChunk * W::kSubChunks);
  const int stages = static_cast<int>((chunks + W::kStageChunks - 1) / W::kStageChunks);
  const int64_t stride = gridDim.x;
  const int my_groups = static_cast<int>((NumGroups<E>(a) - 1 - blockIdx.x) / stride + 1);
  const int items = my_groups * stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto group_of = [&](int item) { return int64_t(blockIdx.x) + (item / stages) * stride; };
  if (threadIdx.x == 0) {
    for (int i = 0; i < num_slots; ++i) {
      MbarInit(full + 8 * i, 1);
      MbarInit(empty + 8 * i, kWarps);  // one arrival per computing warp
    }
    MbarInitFence();
  }
  __syncthreads();
  if (warp == kWarps) {  // the producer: item it into slot it % kSlots once that slot is free
    if (lane != 0) return;
    using Element = typename W::Element;
    const uint64_t policy = L2EvictFirstPolicy();
#pragma unroll 1
    for (int it = 0; it < items; ++it) {
      const int slot = it % num_slots, use = it / num_slots;
      // No slot frees before the computing warps pass PdlWait: wait there too (unbounded), not
      // in MbarWait's bounded spin, however long the kernels before this one run.
      if (it == num_slots) PdlWait();
      if (use > 0) MbarWait(empty + 8 * slot, (use - 1) & 1);
      const int64_t g = group_of(it);
      const int64_t c0 = int64_t(it % stages) * W::kStageChunks;
      const int64_t left = chunks - c0;
      const uint32_t bytes = uint32_t((left < W::kStageChunks ? left : W::kStageChunks) * 16);
      MbarExpectTx(full + 8 * slot, kRows * bytes);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const Element* row = static_cast<const Element*>(a.w) + WeightRow<E>(a, g, r) * a.k;
        BulkLoad(ring + slot * R::kSlotBytes + r * R::kRowBytes,
                 reinterpret_cast<const uint4*>(row) + c0, bytes, full + 8 * slot, policy);
      }
    }
    return;
  }
  // The computing warps. e4m3: the scales of the first two groups before PdlWait, then two
  // groups ahead.
  ScaleSlots scales;
  auto load_scale = [&](int gi) {
    if (kIsFp8<W> && threadIdx.x < kRows && gi < my_groups) {
      const int64_t g = int64_t(blockIdx.x) + gi * stride;
      scales.Set(gi, LoadF32InOrder(a.w_scale + WeightRow<E>(a, g, threadIdx.x)));
    }
  };
  load_scale(0);
  load_scale(1);
  PdlWait();
  const int n = static_cast<int>(a.n);
  __shared__ RopeStage<N> rope_stage;
  if constexpr (E == GemvEpilogue::kRopeAppendKv) StageRope<N>(a, n, W::kThreads, rope_stage);
  __shared__ float part[2][kWarps][kRows][N];  // by group parity: one barrier per group
  __shared__ float total[kRows][N];            // warp 0's epilogue scratch
  float acc[kRows][N];
  ZeroAcc<N>(acc);
  const uint4* slots = reinterpret_cast<const uint4*>(ring_smem);
#pragma unroll 1
  for (int it = 0; it < items; ++it) {
    const int slot = it % num_slots, stage = it % stages, gi = it / stages;
    if (stage == 0) load_scale(gi + 2);
    MbarWait(full + 8 * slot, (it / num_slots) & 1);
    Stage st;
    const int64_t c = int64_t(stage) * W::kStageChunks + threadIdx.x;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      st.w[r][0] = c < chunks ? slots[(slot * kRows + r) * W::kStageChunks + threadIdx.x] : uint4{};
    }
    __syncwarp();
    if (lane == 0) MbarArrive(empty + 8 * slot);  // this warp is done with the slot
    FmaStage<T, W, false, N>(st, a, nullptr, n, stage, chunks, acc);
    if (stage != stages - 1) continue;
    float v;
    if (!ReduceGroup<kWarps, N>(
            acc, part[gi & 1], [] { NamedBarrier(1, W::kThreads); }, v)) {
      continue;
    }
    const int r = lane / N, t = lane % N;
    const bool mine = lane < kRows * N;
    if constexpr (kIsFp8<W>) v = scales.Apply(gi, r, mine, v);
    Epilogue<T, E, false, N>(a, group_of(it), r, t, mine, v, total, rope_stage, 0.f, 0.f);
  }
}

template <typename T, typename W, GemvEpilogue E, int N>
void LaunchRing(const GemvArgs& a, cudaStream_t stream) {
  auto* kernel = GemvRingKernel<T, W, E, N>;
  // Every call (a per-device host attribute; allowed while a stream is captured).
  const size_t smem = Ring<W>::SmemBytes(a.ring_kib);
  LLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int64_t ctas = std::min<int64_t>(NumGroups<E>(a), int64_t(NumSms()) * std::max(a.waves, 1));
  if (a.max_ctas > 0) ctas = std::min<int64_t>(ctas, a.max_ctas);
  Launch(kernel, dim3(static_cast<unsigned>(ctas)), dim3(W::kThreads + 32), smem, stream, a);
}

template <typename T, typename W, GemvEpilogue E>
void LaunchRingN(const GemvArgs& a, cudaStream_t stream) {
  if (a.n <= 1) return LaunchRing<T, W, E, 1>(a, stream);
  if (a.n <= 2) return LaunchRing<T, W, E, 2>(a, stream);
  if (a.n <= 4) return LaunchRing<T, W, E, 4>(a, stream);
  return LaunchRing<T, W, E, 8>(a, stream);
}

template <typename T, typename W>
void LaunchRingE(const GemvArgs& a, cudaStream_t stream) {
  using E = GemvEpilogue;
  switch (a.epilogue) {
    case E::kStore:
      return LaunchRingN<T, W, E::kStore>(a, stream);
    case E::kStoreF32:
      return LaunchRingN<T, W, E::kStoreF32>(a, stream);
    case E::kAccumulateF32:
      return LaunchRingN<T, W, E::kAccumulateF32>(a, stream);
    case E::kSiluMul:
      return LaunchRingN<T, W, E::kSiluMul>(a, stream);
    case E::kRopeAppendKv:
      return LaunchRingN<T, W, E::kRopeAppendKv>(a, stream);
  }
}

template <typename T>
void LaunchRingT(const GemvArgs& a, cudaStream_t stream) {
  if (a.w_scale != nullptr) return LaunchRingE<T, Fp8Weights>(a, stream);
  LaunchRingE<T, DTypeWeights<T>>(a, stream);
}

}  // namespace

void GemvRingLaunch(const GemvArgs& a, cudaStream_t stream) {
  if (a.dtype == DType::kBF16) {
    LaunchRingT<__nv_bfloat16>(a, stream);
  } else {
    LaunchRingT<__half>(a, stream);
  }
}

}  // namespace llm::cuda
