// Tensor parallelism's all-reduce on the GPUs of one process: our one-shot peer-access kernel
// (kernels/cuda/all_reduce/all_reduce.h) against NCCL's all-reduce, both as CUDA graphs of 64 calls
// (one batch-1 decode step of a 32-layer model holds 64), and a graph of 64 empty kernels (the
// launch floor). Sizes: 1, 8 and 64 tokens of a 4096-wide fp32 residual. Validates the peer
// kernel's sums against the host first. Prints JSON lines {"kind":"all_reduce",...}.
//   build/bench_all_reduce_gpu        (needs 2 GPUs with peer access; NCCL when built with it)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(LLM_HAS_NCCL)
#include <nccl.h>
#endif

#include "kernels/cuda/all_reduce/all_reduce.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"

namespace {

using namespace llm::cuda;

constexpr int kCallsPerGraph = 64;
constexpr int kReps = 50;

__global__ void EmptyKernel() {
  PdlWait();
  PdlTrigger();
}

struct Rank {
  cudaStream_t stream = nullptr;
  float* buf = nullptr;
  P2PAllReduceArgs args;
  cudaGraphExec_t graph = nullptr;
#if defined(LLM_HAS_NCCL)
  ncclComm_t comm = nullptr;
#endif
};

// Captures `enqueue(rank)` kCallsPerGraph times on every rank's stream (each its own graph).
template <typename F>
void Capture(std::vector<Rank>& ranks, F enqueue) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    LLM_CUDA_CHECK(cudaSetDevice(int(r)));
    LLM_CUDA_CHECK(cudaStreamBeginCapture(ranks[r].stream, cudaStreamCaptureModeRelaxed));
  }
  for (int i = 0; i < kCallsPerGraph; ++i) enqueue();
  for (size_t r = 0; r < ranks.size(); ++r) {
    LLM_CUDA_CHECK(cudaSetDevice(int(r)));
    cudaGraph_t g = nullptr;
    LLM_CUDA_CHECK(cudaStreamEndCapture(ranks[r].stream, &g));
    if (ranks[r].graph) cudaGraphExecDestroy(ranks[r].graph);
    LLM_CUDA_CHECK(cudaGraphInstantiate(&ranks[r].graph, g, 0));
    LLM_CUDA_CHECK(cudaGraphDestroy(g));
  }
}

// Median µs per call of the captured graphs, replayed on every rank (timed on rank 0).
double TimeGraphs(std::vector<Rank>& ranks) {
  std::vector<float> ms;
  cudaEvent_t start, stop;
  LLM_CUDA_CHECK(cudaSetDevice(0));
  LLM_CUDA_CHECK(cudaEventCreate(&start));
  LLM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int rep = 0; rep < kReps + 3; ++rep) {
    for (size_t r = ranks.size(); r-- > 0;) {  // the peers first, then rank 0 (timed)
      LLM_CUDA_CHECK(cudaSetDevice(int(r)));
      if (r == 0) LLM_CUDA_CHECK(cudaEventRecord(start, ranks[0].stream));
      LLM_CUDA_CHECK(cudaGraphLaunch(ranks[r].graph, ranks[r].stream));
      if (r == 0) LLM_CUDA_CHECK(cudaEventRecord(stop, ranks[0].stream));
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      LLM_CUDA_CHECK(cudaSetDevice(int(r)));
      LLM_CUDA_CHECK(cudaStreamSynchronize(ranks[r].stream));
    }
    float t = 0;
    LLM_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (rep >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaSetDevice(0);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms[ms.size() / 2]) * 1e3 / kCallsPerGraph;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    std::printf("bench_all_reduce_gpu: needs 2 GPUs (found %d)\n", n);
    return 0;
  }
  const int world = 2;
  std::vector<Rank> ranks(world);
  std::vector<P2PAllReduceArgs> args = CreateP2PAllReduce(world);
  if (args.empty()) {
    std::printf("bench_all_reduce_gpu: no peer access between GPUs 0 and 1\n");
    return 0;
  }
  for (int r = 0; r < world; ++r) {
    LLM_CUDA_CHECK(cudaSetDevice(r));
    Rank& k = ranks[size_t(r)];
    LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
    LLM_CUDA_CHECK(cudaMalloc(&k.buf, kP2PAllReduceMaxElements * 4));
    k.args = args[size_t(r)];
    k.args.buf = k.buf;
  }
#if defined(LLM_HAS_NCCL)
  {
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    if (ncclCommInitAll(comms, 2, devs) != ncclSuccess) {
      std::printf("bench_all_reduce_gpu: ncclCommInitAll failed\n");
      return 1;
    }
    ranks[0].comm = comms[0];
    ranks[1].comm = comms[1];
  }
#endif
  for (const bool pdl : {true, false}) {
    SetProgrammaticLaunch(pdl);
    for (const int64_t tokens : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      const int64_t count = tokens * 4096;
      // Validate once: rank r holds r + 1 + i % 7; the sum is 3 + 2·(i % 7).
      for (int r = 0; r < world; ++r) {
        std::vector<float> h(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) h[size_t(i)] = float(r + 1 + i % 7);
        LLM_CUDA_CHECK(cudaSetDevice(r));
        LLM_CUDA_CHECK(cudaMemcpyAsync(ranks[size_t(r)].buf, h.data(), h.size() * 4,
                                       cudaMemcpyHostToDevice, ranks[size_t(r)].stream));
      }
      for (int r = 0; r < world; ++r) {
        LLM_CUDA_CHECK(cudaSetDevice(r));
        P2PAllReduce(ranks[size_t(r)].args, count, ranks[size_t(r)].stream);
      }
      bool ok = true;
      for (int r = 0; r < world; ++r) {
        LLM_CUDA_CHECK(cudaSetDevice(r));
        LLM_CUDA_CHECK(cudaStreamSynchronize(ranks[size_t(r)].stream));
        std::vector<float> h(static_cast<size_t>(count));
        LLM_CUDA_CHECK(
            cudaMemcpy(h.data(), ranks[size_t(r)].buf, h.size() * 4, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < count; ++i) ok &= h[size_t(i)] == float(3 + 2 * (i % 7));
      }
      Capture(ranks, [&] {
        for (int r = 0; r < world; ++r) {
          LLM_CUDA_CHECK(cudaSetDevice(r));
          P2PAllReduce(ranks[size_t(r)].args, count, ranks[size_t(r)].stream);
        }
      });
      const double p2p_us = TimeGraphs(ranks);
      Capture(ranks, [&] {
        for (int r = 0; r < world; ++r) {
          LLM_CUDA_CHECK(cudaSetDevice(r));
          Launch(EmptyKernel, dim3(kP2PBlocks), dim3(kP2PThreads), 0, ranks[size_t(r)].stream);
        }
      });
      const double empty_us = TimeGraphs(ranks);
      double nccl_us = -1;
#if defined(LLM_HAS_NCCL)
      Capture(ranks, [&] {
        ncclGroupStart();
        for (int r = 0; r < world; ++r) {
          ncclAllReduce(ranks[size_t(r)].buf, ranks[size_t(r)].buf, size_t(count), ncclFloat32,
                        ncclSum, ranks[size_t(r)].comm, ranks[size_t(r)].stream);
        }
        ncclGroupEnd();
      });
      nccl_us = TimeGraphs(ranks);
#endif
      std::printf(
          "JSON {\"kind\":\"all_reduce\",\"ranks\":%d,\"tokens\":%lld,\"bytes\":%lld,\"pdl\":%s,"
          "\"calls_per_graph\":%d,\"p2p_us\":%.2f,\"nccl_us\":%.2f,\"empty_kernel_us\":%.2f,"
          "\"verified\":%s}\n",
          world, (long long)tokens, (long long)(count * 4), pdl ? "true" : "false", kCallsPerGraph,
          p2p_us, nccl_us, empty_us, ok ? "true" : "false");
    }
  }
  return 0;
}
