// Mixture-of-experts models in the engine: on ../shared/models/hf-arch's mixtral and qwen3_moe
// (2 of 8 experts per token; hf_arch_test checks the single-sequence runner against
// transformers), concurrent requests whose tokens share the experts' GEMMs in one step, with
// prefill chunks and decode tokens mixed, give each request the tokens it gets alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sequence_runner.h"
#include "engine/engine.h"
#include "tests/test_util.h"

namespace llm {
namespace {

std::string Folder(const std::string& name) {
  return (test::SharedDir() / "models" / "hf-arch" / name).string();
}

class MoeEngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeEngineTest, ConcurrentRequestsMatchEachAlone) {
  const std::unique_ptr<CpuModel> model = CpuModel::Load(Folder(GetParam()));
  ASSERT_GT(model->config().num_experts, 0);
  const std::vector<int> prompt_lengths = {37, 5, 90, 12, 64, 23};
  const std::vector<int> lengths = {40, 60, 25, 50, 30, 45};
  // 32 tokens a step: the long prompts are chunked and share steps with decode tokens.
  Engine engine(*model, test::StoriesTokenizer(),
                {.block_size = 16, .max_num_batched_tokens = 32, .max_num_seqs = 6});
  engine.Start();
  std::vector<std::vector<int>> prompts;
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    prompts.push_back(test::RandomPrompt(prompt_lengths[i], 100 + uint32_t(i)));
    channels.push_back(engine.AddRequest(test::GreedyRequest(prompts.back(), lengths[i])));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(test::AwaitTokens(channels[i]), test::RunnerGreedy(*model, prompts[i], lengths[i]))
        << "request " << i;
  }
  engine.Stop();
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
}

INSTANTIATE_TEST_SUITE_P(Folders, MoeEngineTest, ::testing::Values("mixtral", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// Bytes a decoded token streams: attention, the router and 2 of the 8 experts per layer, the
// lm_head (qwen3_moe, fp32: q 128x64, k and v 64x64, o 64x128, router 8x64, experts 3 x 64x64).
TEST(MoeModel, DecodeReadsTheChosenExpertsOnly) {
  const std::unique_ptr<CpuModel> model = CpuModel::Load(Folder("qwen3_moe"));
  const int64_t attention = (128 * 64 + 2 * 64 * 64 + 64 * 128) * 4, router = 8 * 64 * 4;
  const int64_t experts = 2 * 3 * 64 * 64 * 4, head = 512 * 64 * 4;
  EXPECT_EQ(model->weight_bytes_per_token(), 3 * (attention + router + experts) + head);
  // --quantization fp8 quantizes the experts (a byte a weight and a scale a row), not the
  // router.
  const std::unique_ptr<CpuModel> fp8 =
      CpuModel::Load(Folder("qwen3_moe"), {.weight_dtype = std::nullopt, .fp8_weights = true});
  const int64_t attention8 = 128 * 64 + 2 * 64 * 64 + 64 * 128 + (128 + 2 * 64 + 64) * 4;
  const int64_t experts8 = 2 * 3 * (64 * 64 + 64 * 4);
  EXPECT_EQ(fp8->weight_bytes_per_token(), 3 * (attention8 + router + experts8) + head);
  SequenceRunner run(*fp8, 16);
  const std::vector<float> logits = run.Feed(test::RandomPrompt(10, 9));
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace llm
