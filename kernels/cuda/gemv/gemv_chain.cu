// The MLP half of a decode layer in one persistent kernel (GemvChain, design in gemv.h; the
// shared device code in gemv_device.cuh): o (+ residual, the folded RMSNorm's producer), a grid
// barrier, gate|up (+ SiLU·mul, its consumer), a grid barrier, down (+ residual, the producer of
// the next layer's folded RMSNorm). Each phase computes what the register kernel (gemv.cu) with
// the same GemvArgs computes, group for group and bit for bit: the same items, FMAs, fixed-order
// reductions and epilogues; only the grid (one for all three phases) and the hand-offs differ.
// Instantiations: (bf16, e4m3 weights) × N ∈ {1, 2, 4, 8} = 8, bf16 activations (the fold's);
// registers as the register kernel's (dtype <= 64 at n = 1, e4m3 <= 80), no spills
// (nvcc -Xptxas -v, the command in gemv.h with this file).
// Test: gemv_fused_gpu_test (GemvChainGpu: the three register-kernel launches, bit for bit, in
// and out of graphs, under PDL, with grids smaller and larger than a phase's groups);
// cuda_executor_gpu_test (ChainedMlpIsBitIdenticalToTheFoldedNorm).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/gemv/gemv_device.cuh"

namespace llm::cuda {
namespace {

using namespace gemv_detail;

// Phase p's epilogue: o and down add to the residual (and produce the folded RMSNorm), gate|up
// applies SiLU·mul (and consumes it).
template <int P>
constexpr GemvEpilogue kChainEpilogue =
    P == 1 ? GemvEpilogue::kSiluMul : GemvEpilogue::kAccumulateF32;

// f(std::integral_constant<int, P>) for the runtime phase p < kGemvChainPhases.
template <typename F>
__device__ __forceinline__ void ForPhase(int p, F&& f) {
  if (p == 0) {
    f(std::integral_constant<int, 0>{});
  } else if (p == 1) {
    f(std::integral_constant<int, 1>{});
  } else {
    f(std::integral_constant<int, 2>{});
  }
}

// A CTA's share of each phase, computed once by thread 0 (shared memory: no per-thread arrays
// indexed at run time, which would live in local memory).
struct ChainPlan {
  int64_t chunks[kGemvChainPhases];       // 16-byte weight chunks per row
  int stages[kGemvChainPhases];           // (group, stage) items per group
  int first_item[kGemvChainPhases + 1];   // the CTA's items, phase after phase
  int first_group[kGemvChainPhases + 1];  // its groups, numbered across phases (scale slots)
};

// All CTAs of the grid (co-resident: the launcher sizes the grid by occupancy) meet here. CTA b
// arrives on the counter of its subgroup b % kGemvChainSubgroups (on its own 128-byte line:
// ~grid / 32 same-address atomics each instead of grid on one); each subgroup's last arrival
// resets its counter and arrives on the top counter, whose last arrival resets it and bumps
// the generation word that every CTA polls. So every counter is zero between barriers and
// between launches, and no launch needs a reset at its end. Writes before the barrier
// (epilogues, fold outputs) are released by the fences before each arrival and acquired by the
// poll (relaxed loads with a short back-off, then a fence: not an acquire per poll); the CTA
// barriers (bar.sync in volatile asm) order the other threads around thread 0.
template <int kThreads>
__device__ __forceinline__ void GridBarrier(unsigned* sync) {
  NamedBarrier(0, kThreads);
  if (threadIdx.x == 0) {
    unsigned* generation = sync;
    unsigned* top = sync + kGemvChainLineWords;
    const unsigned subs = min(gridDim.x, unsigned(kGemvChainSubgroups));
    const unsigned sub = blockIdx.x % subs;
    unsigned* counter = sync + (2 + sub) * kGemvChainLineWords;
    const unsigned members = (gridDim.x - sub + subs - 1) / subs;
    unsigned gen;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(generation) : "memory");
    __threadfence();
    if (atomicAdd(counter, 1u) == members - 1) {
      atomicExch(counter, 0u);
      __threadfence();
      if (atomicAdd(top, 1u) == subs - 1) {
        atomicExch(top, 0u);
        __threadfence();
        atomicAdd(generation, 1u);
      }
    }
    unsigned seen;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(generation) : "memory");
    while (seen == gen) {
      __nanosleep(20);
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(generation) : "memory");
    }
    __threadfence();  // acquire: the other CTAs' writes before their arrivals
  }
  NamedBarrier(0, kThreads);
}

template <typename W, int N>
__global__ void __launch_bounds__(W::kThreads, N == 1 ? W::kCtasPerSm : 1)
    GemvChainKernel(const __grid_constant__ GemvChainArgs c) {
  using T = __nv_bfloat16;
  constexpr int kWarps = W::kThreads / 32;
  constexpr int kPhases = kGemvChainPhases;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t stride = gridDim.x;
  __shared__ ChainPlan plan;
  if (threadIdx.x == 0) {
    int items = 0, groups = 0;
#pragma unroll
    for (int p = 0; p < kPhases; ++p) {
      const GemvArgs& a = c.phase[p];
      const int64_t chunks = a.k / (kChunk * W::kSubChunks);
      const int stages = static_cast<int>((chunks + W::kStageChunks - 1) / W::kStageChunks);
      int64_t total = 0;
      ForPhase(p, [&](auto ph) { total = NumGroups<kChainEpilogue<decltype(ph)::value>>(a); });
      // Groups b, b + grid, ... of this phase (none where the grid outnumbers its groups).
      const int mine =
          blockIdx.x < total ? static_cast<int>((total - 1 - blockIdx.x) / stride + 1) : 0;
      plan.chunks[p] = chunks;
      plan.stages[p] = stages;
      plan.first_item[p] = items;
      plan.first_group[p] = groups;
      items += mine * stages;
      groups += mine;
    }
    plan.first_item[kPhases] = items;
    plan.first_group[kPhases] = groups;
  }
  __syncthreads();
  const int items = plan.first_item[kPhases];
  auto phase_of = [&](int item) {
    return item < plan.first_item[1] ? 0 : item < plan.first_item[2] ? 1 : 2;
  };
  ScaleSlots scales;  // e4m3: by group number across phases (at most three in flight)
  // Item `item` (numbered across phases) into st: a stage of one of the CTA's row groups.
  auto load = [&](Stage& st, int item) {
    const int p = phase_of(item);
    const int local = item - plan.first_item[p], stages = plan.stages[p];
    const int gi = local / stages, stage = local % stages;
    const int64_t g = int64_t(blockIdx.x) + gi * stride;
    ForPhase(p, [&](auto ph) {
      constexpr GemvEpilogue E = kChainEpilogue<decltype(ph)::value>;
      const GemvArgs& a = c.phase[decltype(ph)::value];
      LoadStage<W, E>(st, a, g, stage, plan.chunks[decltype(ph)::value]);
      if constexpr (kIsFp8<W>) {
        if (stage == 0 && threadIdx.x < kRows) {
          scales.Set(plan.first_group[p] + gi, a.w_scale[WeightRow<E>(a, g, threadIdx.x)]);
        }
      }
    });
  };
  // Weights are immutable: the first two items stream in before the previous kernel completes.
  Stage s0, s1;
  if (items > 0) load(s0, 0);
  if (items > 1) load(s1, 1);
  PdlWait();
  PdlTrigger();  // the next kernel's CTAs launch once all of this grid's are resident
  const int n = static_cast<int>(c.phase[0].n);
  __shared__ RopeStage<N> rope_stage;  // (no RoPE phase: unused)
  // Phase 1's folded RMSNorm: each warp's share of the sums of squares per token, read after
  // barrier 0 (phase 0 wrote them), as GemvKernel's consumer prologue.
  __shared__ float rms_part[kWarps][N];
  auto consume_partials = [&] { SumPartials<W::kThreads, N>(c.phase[1], n, rms_part); };
  // The phase whose items run now; entering phase p passes the barriers before it.
  int phase = 0;
  auto enter = [&](int p) {
    for (; phase < p; ++phase) GridBarrier<W::kThreads>(c.sync);
    if (p == 1) consume_partials();
  };
  // Producer phases: warp 0's lane (r, t) holds y[t, j] and the next RMSNorm's weight[j] of
  // the group in progress, loaded when its first stage starts.
  float xold = 0.f, gnext = 0.f;
  auto begin_item = [&](int item) {
    const int p = phase_of(item);
    const int local = item - plan.first_item[p];
    if (local == 0 && p != phase) enter(p);
    if (p == 1 || local % plan.stages[p] != 0 || warp != 0 || lane >= kRows * N) return;
    const int r = lane / N, t = lane % N;
    const int64_t j = (int64_t(blockIdx.x) + (local / plan.stages[p]) * stride) * kRows + r;
    ForPhase(p, [&](auto ph) { LoadFoldRow(c.phase[decltype(ph)::value], t, n, j, xold, gnext); });
  };
  __shared__ float part[2][kWarps][kRows][N];  // by group parity: one barrier per group
  __shared__ float total[kRows][N];            // warp 0's epilogue scratch
  float acc[kRows][N];
  ZeroAcc<N>(acc);
  auto fma = [&](const Stage& st, int item) {
    const int p = phase_of(item);
    const int stage = (item - plan.first_item[p]) % plan.stages[p];
    ForPhase(p, [&](auto ph) {
      constexpr int P = decltype(ph)::value;
      FmaStage<T, W, false, N>(st, c.phase[P], nullptr, n, stage, plan.chunks[P], acc);
    });
  };
  // After item `item`'s FMAs: when it was its group's last stage, reduce and finish the group.
  auto finish = [&](int item) {
    const int p = phase_of(item);
    const int local = item - plan.first_item[p], stages = plan.stages[p];
    if (local % stages != stages - 1) return;
    const int gi = plan.first_group[p] + local / stages;  // across phases
    float v;
    if (!ReduceGroup<kWarps, N>(
            acc, part[gi & 1], [] { __syncthreads(); }, v))
      return;
    const int r = lane / N, t = lane % N;
    const bool mine = lane < kRows * N;
    if constexpr (kIsFp8<W>) v = scales.Apply(gi, r, mine, v);
    const int64_t g = int64_t(blockIdx.x) + (local / stages) * stride;
    ForPhase(p, [&](auto ph) {
      constexpr int P = decltype(ph)::value;
      const GemvArgs& a = c.phase[P];
      if constexpr (P == 1) {  // the RMSNorm's 1 / rms, as cuda::AddRmsNorm computes it
        if (mine) {
          float ss = 0.f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) ss += rms_part[w][t];
          v *= 1.f / sqrtf(ss / static_cast<float>(a.k) + a.eps);
        }
      }
      Epilogue<T, kChainEpilogue<P>, true, N>(a, g, r, t, mine, v, total, rope_stage, xold, gnext);
    });
  };
  for (int it = 0; it < items; it += 2) {
    begin_item(it);
    fma(s0, it);
    if (it + 2 < items) load(s0, it + 2);
    finish(it);
    if (it + 1 < items) {
      begin_item(it + 1);
      fma(s1, it + 1);
      if (it + 3 < items) load(s1, it + 3);
      finish(it + 1);
    }
  }
  // The barriers after this CTA's last items (the others wait on them).
  for (; phase < kPhases - 1; ++phase) GridBarrier<W::kThreads>(c.sync);
}

template <typename W, int N>
void LaunchChain(const GemvChainArgs& c, cudaStream_t stream) {
  static std::atomic<int> ctas_per_sm{0};  // the same on every device of a process (one arch)
  int per_sm = ctas_per_sm.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    LLM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, GemvChainKernel<W, N>,
                                                                 W::kThreads, 0));
    per_sm = std::max(per_sm, 1);
    ctas_per_sm.store(per_sm, std::memory_order_relaxed);
  }
  // One CTA per row group of the largest phase, at most one co-resident wave (the barriers
  // need every CTA resident at once).
  const int64_t groups =
      std::max({NumGroups<kChainEpilogue<0>>(c.phase[0]), NumGroups<kChainEpilogue<1>>(c.phase[1]),
                NumGroups<kChainEpilogue<2>>(c.phase[2])});
  int64_t ctas = std::min<int64_t>(groups, int64_t(NumSms()) * per_sm);
  if (c.max_ctas > 0) ctas = std::min<int64_t>(ctas, c.max_ctas);
  Launch(GemvChainKernel<W, N>, dim3(static_cast<unsigned>(ctas)), dim3(W::kThreads), 0, stream, c);
}

template <typename W>
void LaunchChainN(const GemvChainArgs& c, cudaStream_t stream) {
  const int64_t n = c.phase[0].n;
  if (n <= 1) return LaunchChain<W, 1>(c, stream);
  if (n <= 2) return LaunchChain<W, 2>(c, stream);
  if (n <= 4) return LaunchChain<W, 4>(c, stream);
  return LaunchChain<W, 8>(c, stream);
}

}  // namespace

bool GemvChainSupports(const GemvChainArgs& c) {
  using E = GemvEpilogue;
  const GemvArgs &o = c.phase[0], &gu = c.phase[1], &down = c.phase[2];
  const bool fp8 = o.w_scale != nullptr;
  for (const GemvArgs& a : c.phase) {
    if (!GemvSupports(a) || a.ring || a.dtype != DType::kBF16 || a.n != o.n ||
        a.rms_partials == nullptr || (a.w_scale != nullptr) != fp8) {
      return false;
    }
  }
  // Producers (o, down: GemvSupports checked their outputs) around the consumer, wired as a
  // layer's MLP: gate|up reads o's norm output and partials, down reads gate|up's output and
  // adds into o's residual.
  return c.sync != nullptr && o.epilogue == E::kAccumulateF32 && gu.epilogue == E::kSiluMul &&
         down.epilogue == E::kAccumulateF32 && gu.x == o.rms_x &&
         gu.rms_partials == o.rms_partials && down.rms_partials == o.rms_partials &&
         down.x == gu.y && down.y == o.y && gu.k == o.m && down.m == o.m && down.k == gu.m / 2;
}

void GemvChain(const GemvChainArgs& c, cudaStream_t stream) {
  if (!GemvChainSupports(c)) {
    throw std::invalid_argument(
        "GemvChain: needs o (kAccumulateF32), gate|up (kSiluMul), down (kAccumulateF32), each "
        "supported by Gemv with the folded RMSNorm, bf16, the same n and weight format, no "
        "ring, and the barrier counters (sync); n=" +
        std::to_string(c.phase[0].n));
  }
  if (c.phase[0].w_scale != nullptr) return LaunchChainN<Fp8Weights>(c, stream);
  LaunchChainN<DTypeWeights<__nv_bfloat16>>(c, stream);
}

}  // namespace llm::cuda
