// A failed step on the CUDA backend: how engine/cuda/cuda_executor.cc classifies it, seen
// through the engine. Label gpu: skips with a message when no GPU is present.
//  - An ordinary failure inside a step (here a token id outside the vocabulary, refused
//    before anything is launched) stays an ordinary exception, never FatalExecutorError,
//    and the same executor runs the next step.
//  - A sticky CUDA error (an illegal address: a kernel writing to address 16 just before
//    the step) comes out of the step as FatalExecutorError: the engine fails the request and
//    turns unhealthy. In a child process (a gtest death test re-executes the binary), since
//    the poisoned CUDA context cannot be used again.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "engine/cuda/cuda_executor.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cuda/common/fill.h"
#include "tests/test_util.h"

namespace llm {
namespace {

constexpr int64_t kBlockSize = 16;

class CudaStepFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

CudaExecutorOptions SmallOptions() {
  CudaExecutorOptions o;
  o.block_size = kBlockSize;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 16;
  o.num_kv_blocks = 128;
  o.log = false;
  return o;
}

// One sequence of `ids` over blocks 0, 1, ..., its last token's logits wanted.
ForwardBatch Prefill(const std::vector<int>& ids) {
  std::vector<int32_t> table;
  for (int64_t b = 0; b * kBlockSize < std::ssize(ids); ++b) table.push_back(int32_t(b));
  std::vector<int64_t> slots;
  for (int64_t i = 0; i < std::ssize(ids); ++i) slots.push_back(i);
  ForwardBatch batch;
  batch.AddSequence(ids, 0, table, slots, /*wants_logits=*/true, /*is_decode=*/false);
  return batch;
}

TEST_F(CudaStepFailureTest, OrdinaryFailureIsNotFatal) {
  auto ex = CudaExecutor::Create(test::StoriesDir(), SmallOptions());
  try {
    ex->Forward(Prefill({1, 403, 99999}));
    ADD_FAILURE() << "a token outside the vocabulary must throw";
  } catch (const FatalExecutorError& e) {
    ADD_FAILURE() << "classified as fatal: " << e.what();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("99999"), std::string::npos) << e.what();
  }
  const std::vector<float> logits = ex->Forward(Prefill({1, 403, 407, 261, 378}));
  EXPECT_EQ(std::ssize(logits), ex->config().vocab_size);
}

// The child's verdict: exit code 0 when every check held (each failed check says why).
int StickyErrorChild() {
  EngineConfig cfg;
  cfg.block_size = kBlockSize;
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 256;
  cfg.batch_invariant = false;
  Engine engine(CudaExecutor::Create(test::StoriesDir(), SmallOptions()), test::StoriesTokenizer(),
                cfg);
  Request r;
  r.prompt_ids = {1, 403, 407, 261, 378};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 4;
  auto run = [&] {
    auto channel = engine.AddRequest(r);
    engine.RunUntilIdle();
    RequestOutput out;
    while (channel->TryPop(&out) && !out.is_last) {
    }
    return out;
  };
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "CHECK FAILED: %s\n", what), ++failures;
  };
  check(run().finish_reason == FinishReason::kLength, "the first request completes");
  cuda::FillConstant(reinterpret_cast<void*>(uintptr_t{16}), DType::kF32, 1 << 20, 0.f, nullptr);
  std::fprintf(stderr, "poisoned: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  const RequestOutput failed = run();
  check(failed.finish_reason == FinishReason::kError, "the step after the fault fails");
  check(failed.error.find("CUDA context is unusable") != std::string::npos,
        "the request's error names the unusable context");
  check(!engine.IsHealthy(), "the engine is unhealthy");
  std::fprintf(stderr, "reason: %s\n", engine.UnhealthyReason().c_str());
  return failures;
}

TEST_F(CudaStepFailureTest, StickyCudaErrorTurnsTheEngineUnhealthy) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // std::_Exit: no destructors run over the broken context.
  EXPECT_EXIT(std::_Exit(StickyErrorChild()), ::testing::ExitedWithCode(0),
              "UNHEALTHY.*fatal executor error.*CUDA context is unusable");
}

}  // namespace
}  // namespace llm
