// The one-shot peer-access all-reduce (kernels/cuda/all_reduce/all_reduce.h) against its CPU
// reference: the sum over ranks 0..N-1 in that order, in fp32, so every rank's result must equal it
// bit for bit. Repeated launches (the device-side epochs advance), sizes from one float4 to the
// largest it takes, and a CUDA graph replayed several times. Label gpu: skips with a message
// without 2 GPUs with peer access.
//   ninja -C build all_reduce_gpu_test && (cd build && ctest -L gpu -R all_reduce)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/all_reduce/all_reduce.h"
#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {
namespace {

class P2PAllReduceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    cudaGetLastError();
    if (n < 2) GTEST_SKIP() << "the peer all-reduce needs 2 GPUs; this machine has " << n;
    world_ = std::min(n, kP2PMaxRanks);
    args_ = CreateP2PAllReduce(world_);
    if (args_.empty()) GTEST_SKIP() << "no peer access between every pair of " << world_ << " GPUs";
    for (int r = 0; r < world_; ++r) {
      LLM_CUDA_CHECK(cudaSetDevice(r));
      cudaStream_t s = nullptr;
      LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
      float* buf = nullptr;
      LLM_CUDA_CHECK(cudaMalloc(&buf, kP2PAllReduceMaxElements * 4));
      bufs_.push_back(buf);
      args_[size_t(r)].buf = buf;
    }
    LLM_CUDA_CHECK(cudaSetDevice(0));
  }

  void TearDown() override {
    for (int r = 0; r < int(bufs_.size()); ++r) {
      cudaSetDevice(r);
      cudaDeviceSynchronize();
      cudaFree(bufs_[size_t(r)]);
      cudaStreamDestroy(streams_[size_t(r)]);
    }
    DestroyP2PAllReduce(args_);
    cudaSetDevice(0);
  }

  // Random data on every rank; the expected sums in rank order.
  std::vector<float> Fill(int64_t count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    std::vector<float> sum(size_t(count), 0.f);
    for (int r = 0; r < world_; ++r) {
      std::vector<float> h(static_cast<size_t>(count));
      for (float& v : h) v = u(rng);
      for (size_t i = 0; i < h.size(); ++i) sum[i] = r == 0 ? h[i] : sum[i] + h[i];
      LLM_CUDA_CHECK(cudaSetDevice(r));
      // On the rank's stream: a pageable cudaMemcpy may return before its DMA lands, and the
      // legacy stream does not order the non-blocking stream's kernel after it.
      LLM_CUDA_CHECK(cudaMemcpyAsync(bufs_[size_t(r)], h.data(), h.size() * 4,
                                     cudaMemcpyHostToDevice, streams_[size_t(r)]));
    }
    return sum;
  }

  void ExpectAllEqual(const std::vector<float>& want) {
    for (int r = 0; r < world_; ++r) {
      LLM_CUDA_CHECK(cudaSetDevice(r));
      LLM_CUDA_CHECK(cudaStreamSynchronize(streams_[size_t(r)]));
      std::vector<float> got(want.size());
      LLM_CUDA_CHECK(
          cudaMemcpy(got.data(), bufs_[size_t(r)], got.size() * 4, cudaMemcpyDeviceToHost));
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << "rank " << r;
    }
  }

  int world_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<float*> bufs_;
  std::vector<P2PAllReduceArgs> args_;
};

TEST_F(P2PAllReduceTest, SumsEqualTheReferenceOnEveryRank) {
  uint32_t seed = 1;
  for (int64_t count : {int64_t{4}, int64_t{4096}, int64_t{4096 * 3}, int64_t{65536 + 20},
                        kP2PAllReduceMaxElements}) {
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE(testing::Message() << count << " elements, launch " << rep);
      const std::vector<float> want = Fill(count, seed++);
      for (int r = 0; r < world_; ++r) {
        LLM_CUDA_CHECK(cudaSetDevice(r));
        P2PAllReduce(args_[size_t(r)], count, streams_[size_t(r)]);
      }
      ExpectAllEqual(want);
    }
  }
  cudaSetDevice(0);
  EXPECT_THROW(P2PAllReduce(args_[0], 6, streams_[0]), std::invalid_argument);
  EXPECT_THROW(P2PAllReduce(args_[0], kP2PAllReduceMaxElements + 4, streams_[0]),
               std::invalid_argument);
}

TEST_F(P2PAllReduceTest, ReplaysInsideCudaGraphs) {
  constexpr int64_t kCount = 4096 * 2;
  std::vector<cudaGraphExec_t> execs;
  for (int r = 0; r < world_; ++r) {
    LLM_CUDA_CHECK(cudaSetDevice(r));
    cudaGraph_t g = nullptr;
    LLM_CUDA_CHECK(cudaStreamBeginCapture(streams_[size_t(r)], cudaStreamCaptureModeRelaxed));
    P2PAllReduce(args_[size_t(r)], kCount, streams_[size_t(r)]);
    LLM_CUDA_CHECK(cudaStreamEndCapture(streams_[size_t(r)], &g));
    cudaGraphExec_t e = nullptr;
    LLM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    LLM_CUDA_CHECK(cudaGraphDestroy(g));
    execs.push_back(e);
  }
  for (int rep = 0; rep < 4; ++rep) {
    const std::vector<float> want = Fill(kCount, 100u + uint32_t(rep));
    for (int r = 0; r < world_; ++r) {
      LLM_CUDA_CHECK(cudaSetDevice(r));
      LLM_CUDA_CHECK(cudaGraphLaunch(execs[size_t(r)], streams_[size_t(r)]));
    }
    ExpectAllEqual(want);
  }
  for (int r = 0; r < world_; ++r) {
    cudaSetDevice(r);
    cudaGraphExecDestroy(execs[size_t(r)]);
  }
  cudaSetDevice(0);
}

}  // namespace
}  // namespace llm::cuda
