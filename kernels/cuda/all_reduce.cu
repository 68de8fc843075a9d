#include "kernels/cuda/all_reduce.h"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace llm::cuda {
namespace {

constexpr int kPerThread = 4;  // float4 per thread held across the second barrier

__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Barrier `which` of CTA b across the ranks at epoch e: thread r < world tells rank r, then
// waits for rank r's word.
__device__ void Barrier(const P2PAllReduceArgs& a, int which, uint32_t e) {
  __syncthreads();
  const int t = int(threadIdx.x);
  if (t < a.world) {
    const size_t slot = (size_t(which) * kP2PBlocks + blockIdx.x) * kP2PMaxRanks;
    __threadfence_system();
    StoreRelease(a.flags[t] + slot + a.rank, e);
    const uint32_t* mine = a.flags[a.rank] + slot + t;
    while (LoadAcquire(mine) < e) {
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kP2PThreads) P2PAllReduceKernel(P2PAllReduceArgs a,
                                                                 int64_t count4) {
  // Launched with PDL (kernels/cuda/launch.h): the CTAs are resident while the GEMV before
  // finishes; the next kernel may launch as soon as this one runs (it waits for completion).
  PdlWait();
  PdlTrigger();
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = ++a.epochs[blockIdx.x];
  __syncthreads();
  const uint32_t e = epoch;
  Barrier(a, 0, e);  // every rank's buffer is complete
  float4 sum[kPerThread];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = first + k * stride;
    if (i >= count4) continue;
    float4 s = __ldcg(reinterpret_cast<const float4*>(a.bufs[0]) + i);
    for (int r = 1; r < a.world; ++r) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(a.bufs[r]) + i);
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    sum[k] = s;
  }
  Barrier(a, 1, e);  // every rank has read this CTA's slice of every buffer
  float4* out = reinterpret_cast<float4*>(a.bufs[a.rank]);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = first + k * stride;
    if (i < count4) out[i] = sum[k];
  }
}

static_assert(kP2PAllReduceMaxElements == int64_t{kP2PBlocks} * kP2PThreads * kPerThread * 4,
              "each thread holds kPerThread float4 across the second barrier");

}  // namespace

void P2PAllReduce(const P2PAllReduceArgs& a, int64_t count, cudaStream_t stream) {
  if (count % 4 != 0 || count > kP2PAllReduceMaxElements || a.world < 2 ||
      a.world > kP2PMaxRanks) {
    throw std::invalid_argument("P2PAllReduce: " + std::to_string(count) + " elements over " +
                                std::to_string(a.world) + " ranks is outside what it takes");
  }
  Launch(P2PAllReduceKernel, dim3(kP2PBlocks), dim3(kP2PThreads), 0, stream, a, count / 4);
}

}  // namespace llm::cuda
