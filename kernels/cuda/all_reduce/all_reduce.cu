// The one-shot peer-access all-reduce (algorithm and contract: all_reduce.h): one kernel,
// P2PAllReduceKernel, and its launcher.
// Test:  ninja -C build all_reduce_gpu_test && (cd build && ctest -L gpu -R all_reduce)
//        (needs 2 GPUs with peer access; skips otherwise)
// Bench: ninja -C build bench_all_reduce_gpu && ./build/bench_all_reduce_gpu   (against NCCL)
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/all_reduce/all_reduce.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/ptx.cuh"

namespace llm::cuda {
namespace {

using ptx::LoadAcquire;  // system scope: the flags are polled by the peer GPUs
using ptx::StoreRelease;

__global__ void __launch_bounds__(kP2PThreads)
    P2PAllReduceKernel(P2PAllReduceArgs a, int64_t count4) {
  // Launched with PDL (kernels/cuda/common/launch.h): the CTAs are resident while the GEMV before
  // finishes; the next kernel may launch as soon as this one runs (it waits for completion).
  PdlWait();
  PdlTrigger();
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = ++a.epochs[blockIdx.x];
  __syncthreads();
  const uint32_t e = epoch;
  const int64_t offset = int64_t(e & 1) * (kP2PAllReduceMaxElements / 4);  // in float4
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float4* buf = reinterpret_cast<float4*>(a.buf);
  float4* mine = reinterpret_cast<float4*>(a.staging[a.rank]) + offset;
  for (int64_t i = first; i < count4; i += stride) mine[i] = buf[i];
  // The barrier: this CTA's slice is staged on every rank.
  __syncthreads();
  const int t = int(threadIdx.x);
  if (t < a.world) {
    const size_t slot = size_t(blockIdx.x) * kP2PMaxRanks;
    __threadfence_system();
    StoreRelease(a.flags[t] + slot + a.rank, e);
    const uint32_t* flag = a.flags[a.rank] + slot + t;
    // The abort word lives in host memory: read it only once the wait has gone on for a
    // while (a barrier normally completes within a few µs), not on every poll.
    // Epochs wrap after 2^32 calls (days at batch-1 decode): compare them as a signed
    // difference (a peer is at most one epoch ahead or behind here).
    for (uint32_t polls = 1; int32_t(LoadAcquire(flag) - e) < 0; ++polls) {
      if ((polls & 4095) == 0 && *a.abort != 0) break;
    }
  }
  __syncthreads();
  for (int64_t i = first; i < count4; i += stride) {
    float4 s = __ldcg(reinterpret_cast<const float4*>(a.staging[0]) + offset + i);
    for (int r = 1; r < a.world; ++r) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(a.staging[r]) + offset + i);
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    buf[i] = s;
  }
}

}  // namespace

std::vector<P2PAllReduceArgs> CreateP2PAllReduce(int world) {
  if (world < 2 || world > kP2PMaxRanks) return {};
  for (int a = 0; a < world; ++a) {
    for (int b = 0; b < world; ++b) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) {
        cudaGetLastError();
        return {};
      }
    }
  }
  int caller = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&caller));
  uint32_t* abort = nullptr;  // mapped into every device (unified addressing: one pointer)
  LLM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&abort), sizeof(uint32_t),
                               cudaHostAllocMapped | cudaHostAllocPortable));
  *abort = 0;
  std::vector<P2PAllReduceArgs> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    LLM_CUDA_CHECK(cudaSetDevice(r));
    for (int o = 0; o < world; ++o) {
      if (o == r) continue;
      const cudaError_t err = cudaDeviceEnablePeerAccess(o, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        LLM_CUDA_CHECK(err);
      }
    }
    P2PAllReduceArgs& a = ranks[size_t(r)];
    a.world = world;
    a.rank = r;
    a.abort = abort;
    LLM_CUDA_CHECK(cudaMalloc(&a.staging[r], P2PStagingBytes()));
    LLM_CUDA_CHECK(cudaMalloc(&a.flags[r], P2PFlagBytes()));
    LLM_CUDA_CHECK(cudaMalloc(&a.epochs, P2PEpochBytes()));
    LLM_CUDA_CHECK(cudaMemset(a.flags[r], 0, P2PFlagBytes()));
    LLM_CUDA_CHECK(cudaMemset(a.epochs, 0, P2PEpochBytes()));
  }
  for (P2PAllReduceArgs& a : ranks) {
    for (int o = 0; o < world; ++o) {
      a.staging[o] = ranks[size_t(o)].staging[o];
      a.flags[o] = ranks[size_t(o)].flags[o];
    }
  }
  LLM_CUDA_CHECK(cudaSetDevice(caller));
  return ranks;
}

void DestroyP2PAllReduce(std::vector<P2PAllReduceArgs>& ranks) {
  int caller = 0;
  cudaGetDevice(&caller);
  for (P2PAllReduceArgs& a : ranks) {
    cudaSetDevice(a.rank);
    cudaFree(a.staging[a.rank]);
    cudaFree(a.flags[a.rank]);
    cudaFree(a.epochs);
  }
  if (!ranks.empty()) cudaFreeHost(const_cast<uint32_t*>(ranks[0].abort));
  ranks.clear();
  cudaSetDevice(caller);
}

void AbortP2PAllReduce(const std::vector<P2PAllReduceArgs>& ranks) {
  if (!ranks.empty()) *const_cast<volatile uint32_t*>(ranks[0].abort) = 1;
}

void P2PAllReduce(const P2PAllReduceArgs& a, int64_t count, cudaStream_t stream) {
  if (count % 4 != 0 || count > kP2PAllReduceMaxElements || a.world < 2 || !a.buf || !a.abort ||
      a.world > kP2PMaxRanks) {
    throw std::invalid_argument("P2PAllReduce: " + std::to_string(count) + " elements over " +
                                std::to_string(a.world) + " ranks is outside what it takes");
  }
  const int64_t count4 = count / 4;
  const int blocks = int(std::min<int64_t>(kP2PBlocks, (count4 + kP2PThreads - 1) / kP2PThreads));
  Launch(P2PAllReduceKernel, dim3(std::max(blocks, 1)), dim3(kP2PThreads), 0, stream, a, count4);
}

}  // namespace llm::cuda
