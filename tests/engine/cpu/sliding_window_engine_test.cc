// Sliding-window KV in the engine (BlockManager's sliding-window mode): on mistral_sw16
// (../shared/models/hf-arch, every layer attends over a window of 16 keys) a sequence holds only
// the blocks its next queries can read, so requests far longer than the KV pool run, and give
// the tokens of the single-sequence runner whose pool keeps every block (the plain path, checked
// against transformers by hf_arch_test). Several at once, under preemption, too; afterwards
// every block is free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sequence_runner.h"
#include "engine/engine.h"
#include "engine/model/model_config.h"
#include "tests/test_util.h"

namespace llm {
namespace {

const CpuModel& SlidingModel() {
  static const auto* model =
      CpuModel::Load((test::SharedDir() / "models" / "hf-arch" / "mistral_sw16").string())
          .release();
  return *model;
}

// Greedy tokens from the single-sequence runner (a pool for all of them, no window mode).
std::vector<int> RunnerGreedy(const std::vector<int>& prompt, int n) {
  EXPECT_EQ(SequenceRunner(SlidingModel(), 1).blocks().sliding_window(), 0);
  return test::RunnerGreedy(SlidingModel(), prompt, n);
}

// Block size 16, steps of at most 64 tokens: a sequence holds at most
// ceil((16 + 128 + 3 * 64) / 16) + 2 = 23 blocks (BlockManager::MaxBlocksPerSequence).
EngineConfig SmallPool(int64_t num_blocks) {
  return {.block_size = 16,
          .num_kv_blocks = num_blocks,
          .max_num_batched_tokens = 64,
          .max_num_seqs = 8,
          .kv_reserve_ratio = 0};  // admit whenever a prompt fits: they preempt one another
}

TEST(SlidingWindowEngine, RequestLongerThanThePoolMatchesTheRunner) {
  const CpuModel& model = SlidingModel();
  ASSERT_EQ(model.config().UniformSlidingWindow(), 16);
  const std::vector<int> prompt = test::RandomPrompt(300, 1);
  const int n = 600;  // 900 tokens of KV: 57 blocks; the pool has 24
  Engine engine(model, test::StoriesTokenizer(), SmallPool(24));
  engine.Start();
  const std::vector<int> got = test::AwaitTokens(engine.AddRequest(test::GreedyRequest(prompt, n)));
  engine.Stop();
  EXPECT_EQ(got, RunnerGreedy(prompt, n));
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
  // Every block left of the window's first read tile went back: FirstKeyRead(899, 16) = 768.
  EXPECT_GE(s.window_released_kv_blocks, 768 / 16);
  std::printf("900 tokens in a pool of 24 x 16: %lld blocks given back, %lld steps\n",
              static_cast<long long>(s.window_released_kv_blocks),
              static_cast<long long>(s.num_steps));
}

TEST(SlidingWindowEngine, ConcurrentLongRequestsUnderPreemptionMatchTheRunner) {
  const CpuModel& model = SlidingModel();
  // Four requests (three prompts longer than a lookahead, one short) in a pool that holds
  // one sequence's window span and a little: they preempt one another and are recomputed in
  // window mode.
  std::vector<std::vector<int>> prompts = {test::RandomPrompt(420, 2), test::RandomPrompt(40, 3),
                                           test::RandomPrompt(700, 4), test::RandomPrompt(260, 5)};
  const std::vector<int> lengths = {300, 500, 120, 400};
  Engine engine(model, test::StoriesTokenizer(), SmallPool(24));
  engine.Start();
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (size_t i = 0; i < prompts.size(); ++i)
    channels.push_back(engine.AddRequest(test::GreedyRequest(prompts[i], lengths[i])));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(test::AwaitTokens(channels[i]), RunnerGreedy(prompts[i], lengths[i]))
        << "request " << i;
  }
  engine.Stop();
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
  EXPECT_GT(s.window_released_kv_blocks, 0);
  EXPECT_GT(s.num_preemptions, 0);
  std::printf("4 requests in 24 blocks: %lld preemptions, %lld blocks given back\n",
              static_cast<long long>(s.num_preemptions),
              static_cast<long long>(s.window_released_kv_blocks));
}

TEST(SlidingWindowEngine, RequestBeyondOneWindowOfBlocksIsRefused) {
  // 22 blocks hold less than one sequence's window span (23): refused up front, as any
  // request that could never fit, with the pool's size in the message.
  Engine engine(SlidingModel(), test::StoriesTokenizer(), SmallPool(22));
  test::ExpectError(
      [&] { engine.AddRequest(test::GreedyRequest(test::RandomPrompt(500, 6), 300)); },
      {"KV cache", "352"});
  // A short one fits.
  engine.Start();
  EXPECT_EQ(test::AwaitTokens(engine.AddRequest(test::GreedyRequest(test::RandomPrompt(20, 7), 10)))
                .size(),
            10u);
  engine.Stop();
}

}  // namespace
}  // namespace llm
