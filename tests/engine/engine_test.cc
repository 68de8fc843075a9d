// The continuous-batching engine end to end on the CPU backend with the real stories260K
// model. The invariance scenarios (alone vs together under chunked prefill and preemption,
// prefix-cache hits, seeded sampling, n > 1, stop conditions) are shared with the GPU backend
// (tests/engine/engine_invariance.{h,cc}) and instantiated here on the CPU, where they are
// exact and demanded bit for bit. Also here: streamed text, stop strings and the split-KV
// decode path against the reference text, request/sequence gauges, cancellation, deadlines,
// validation, and a soak of 1,000 requests.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "engine/cpu/cpu_executor.h"
#include "engine/error.h"
#include "tests/engine/engine_invariance.h"
#include "tests/test_util.h"

namespace llm {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = &test::StoriesModel();
    tokenizer_ = &test::StoriesTokenizer();
  }
  static const CpuModel* model_;
  static const Tokenizer* tokenizer_;
};
const CpuModel* EngineTest::model_ = nullptr;
const Tokenizer* EngineTest::tokenizer_ = nullptr;

using test::Collected;
using test::Drain;
using test::EngineInvariance;
using test::Greedy;
using test::MixedRequests;

// The shared invariance scenarios on the CPU backend: exact (tokens, texts, finish reasons,
// logprobs bit for bit), in the engine's default batch-invariant mode.
test::EngineBackend CpuBackend() {
  test::EngineBackend b;
  b.name = "cpu";
  b.make_executor = [](const EngineConfig& c) -> std::unique_ptr<ModelExecutor> {
    return std::make_unique<CpuExecutor>(test::StoriesModel(), c.num_kv_blocks, c.block_size);
  };
  b.tokenizer = []() -> const Tokenizer& { return test::StoriesTokenizer(); };
  b.batch_invariant = true;
  b.is_exact = true;
  return b;
}

// The CPU executor plus up to +-kNoise on every logit, a function of the step's shape (token
// and sequence counts): a stand-in for the GPU's bf16 rounding, which depends on the batch
// shape. It runs the measured comparisons the GPU backend gets here in CI too, where they
// must pass.
class NoisyLogitsExecutor final : public ModelExecutor {
 public:
  static constexpr float kNoise = 0.12f;
  NoisyLogitsExecutor(int64_t num_blocks, int64_t block_size)
      : cpu_(test::StoriesModel(), num_blocks, block_size) {}
  const ModelConfig& config() const override { return cpu_.config(); }
  std::string Describe() const override { return cpu_.Describe() + ", noisy logits"; }
  int64_t num_kv_blocks() const override { return cpu_.num_kv_blocks(); }
  int64_t block_size() const override { return cpu_.block_size(); }
  void CopyBlocks(std::span<const BlockCopy> copies) override { cpu_.CopyBlocks(copies); }
  std::vector<float> Forward(const ForwardBatch& batch) override {
    std::vector<float> logits = cpu_.Forward(batch);
    std::mt19937 rng(static_cast<uint32_t>(batch.num_tokens() * 7919 + batch.num_seqs()));
    std::uniform_real_distribution<float> noise(-kNoise, kNoise);
    for (float& x : logits) x += noise(rng);
    return logits;
  }

 private:
  CpuExecutor cpu_;
};

test::EngineBackend NoisyCpuBackend() {
  test::EngineBackend b = CpuBackend();
  b.name = "cpu_noisy_logits";
  b.make_executor = [](const EngineConfig& c) -> std::unique_ptr<ModelExecutor> {
    return std::make_unique<NoisyLogitsExecutor>(c.num_kv_blocks, c.block_size);
  };
  b.is_exact = false;
  // Two logits of one token differ by up to 2 kNoise between shapes, a logprob (logit minus
  // logsumexp) by up to 4 kNoise, and two tokens can swap as argmax within 4 kNoise.
  b.tolerance = [] { return 4.0 * NoisyLogitsExecutor::kNoise + 1e-3; };
  return b;
}

INSTANTIATE_TEST_SUITE_P(Cpu, EngineInvariance, ::testing::Values(CpuBackend(), NoisyCpuBackend()),
                         EngineInvariance::Name);

// Throughput mode (batch_invariant off): decodes take the split-KV decode kernel; greedy
// output still equals Hugging Face transformers' (tests/data reference, first 24 tokens).
TEST_F(EngineTest, SplitKvDecodePathGivesTheReferenceContinuation) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128, .batch_invariant = false});
  auto ch = engine.AddRequest(Greedy(tokenizer_->EncodePrompt("Once upon a time"), 24));
  engine.RunUntilIdle();
  EXPECT_EQ(Drain(*ch).text[0].rfind(", there was a little girl named Lily. She loved to play", 0),
            0u);
}

TEST_F(EngineTest, StreamedTextMatchesDecodedTokens) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
  Request r = Greedy(tokenizer_->EncodePrompt("Once upon a time"), 40);
  r.sampling.ignore_eos = false;
  auto ch = engine.AddRequest(r);
  engine.RunUntilIdle();
  const Collected c = Drain(*ch);
  const std::vector<int> all = [&] {
    std::vector<int> v = r.prompt_ids;
    v.insert(v.end(), c.tokens[0].begin(), c.tokens[0].end());
    return v;
  }();
  EXPECT_EQ(c.text[0], tokenizer_->Decode(all).substr(tokenizer_->Decode(r.prompt_ids).size()));
  EXPECT_EQ(c.text[0].rfind(", there was a little girl named Lily.", 0), 0u) << c.text[0];
  EXPECT_EQ(c.usage.prompt_tokens, 5);
  EXPECT_EQ(c.usage.completion_tokens, std::ssize(c.tokens[0]));
}

TEST_F(EngineTest, StopStringEndsTextAndIsExcluded) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
  Request r = Greedy(tokenizer_->EncodePrompt("Once upon a time"), 60);
  r.sampling.stop = {"Lily"};
  auto ch = engine.AddRequest(r);
  engine.RunUntilIdle();
  const Collected c = Drain(*ch);
  EXPECT_EQ(c.text[0], ", there was a little girl named ");
  EXPECT_EQ(c.finish[0], FinishReason::kStop);
}

// The gauges count requests, as vLLM's do; the sequence counts are kept apart.
TEST_F(EngineTest, RunningAndWaitingCountRequestsNotSequences) {
  {
    Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
    Request r = Greedy(tokenizer_->EncodePrompt("The little dog"), 12);
    r.sampling.n = 4;
    r.sampling.temperature = 1.0;
    r.sampling.seed = 5;
    auto ch = engine.AddRequest(r);
    ASSERT_TRUE(engine.Step());  // the prompt runs, then forks into 4 sequences
    ASSERT_TRUE(engine.Step());
    const EngineStats s = engine.Stats();
    EXPECT_EQ(s.num_running, 1);
    EXPECT_EQ(s.num_running_seqs, 4);
    EXPECT_EQ(s.num_waiting, 0);
    engine.RunUntilIdle();
    EXPECT_EQ(Drain(*ch, 4).num_last, 1);
    const EngineStats done = engine.Stats();
    EXPECT_EQ(done.num_running + done.num_waiting + done.num_running_seqs, 0);
  }
  {
    Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128, .max_num_seqs = 1});
    auto a = engine.AddRequest(Greedy(tokenizer_->EncodePrompt("Once upon"), 8));
    auto b = engine.AddRequest(Greedy(tokenizer_->EncodePrompt("The cat"), 8));
    ASSERT_TRUE(engine.Step());
    const EngineStats s = engine.Stats();
    EXPECT_EQ(s.num_running, 1);
    EXPECT_EQ(s.num_waiting, 1);
    EXPECT_EQ(s.num_waiting_seqs, 1);
    engine.RunUntilIdle();
    EXPECT_EQ(Drain(*a).num_last + Drain(*b).num_last, 2);
  }
}

TEST_F(EngineTest, CancelAndDeadlineFreeBlocksAtOnce) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
  Request slow = Greedy(tokenizer_->EncodePrompt("Once upon a time"), 400);
  slow.request_id = "cancel-me";
  auto cancelled = engine.AddRequest(slow);
  engine.Step();
  engine.Step();
  engine.Cancel("cancel-me");
  engine.Step();
  Collected c = Drain(*cancelled);
  EXPECT_EQ(c.finish[0], FinishReason::kAbort);
  EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);

  Request timed = Greedy(tokenizer_->EncodePrompt("Once upon a time"), 400);
  timed.deadline = Clock::now() + std::chrono::milliseconds(1);
  auto ch = engine.AddRequest(timed);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  engine.RunUntilIdle();
  EXPECT_EQ(Drain(*ch).finish[0], FinishReason::kTimeout);
  EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);
}

// A request with n > 1 that ends before its prompt ran (its children never existed) still
// ends every completion index exactly once (found by the server soak).
TEST_F(EngineTest, EarlyTimeoutEndsEveryCompletionOfN) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
  Request r = Greedy(tokenizer_->EncodePrompt("Once upon a time"), 50);
  r.sampling.n = 3;
  r.deadline = Clock::now() - std::chrono::milliseconds(1);
  auto ch = engine.AddRequest(r);
  engine.RunUntilIdle();
  const Collected c = Drain(*ch, 3);
  EXPECT_EQ(c.num_last, 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.finish[i], FinishReason::kTimeout) << i;
  EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);
}

TEST_F(EngineTest, InvalidRequestsAreRejectedWithClearErrors) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 8});
  test::ExpectError([&] { engine.AddRequest(Greedy({}, 5)); }, {"empty"});
  test::ExpectError([&] { engine.AddRequest(Greedy({1, 9999}, 5)); }, {"9999", "vocabulary"});
  test::ExpectError([&] { engine.AddRequest(Greedy({1, 2, 3}, 600)); }, {"context", "512"});
  test::ExpectError([&] { engine.AddRequest(Greedy(std::vector<int>(100, 5), 100)); },
                    {"KV cache"});
  Request bad = Greedy({1, 5}, 5);
  bad.sampling.top_p = 1.5;
  test::ExpectError([&] { engine.AddRequest(bad); }, {"top_p"});
  bad = Greedy({1, 5}, 5);
  bad.sampling.n = 100;
  test::ExpectError([&] { engine.AddRequest(bad); }, {"n must be"});
}

// 1,000 requests (200 with LLM_TEST_SCALE=small) with random parameters, cancellations and
// deadlines, fed from two threads into a running engine thread: every channel gets exactly
// one final event, and afterwards every KV block is free.
TEST_F(EngineTest, SoakThousandRandomRequests) {
  Engine engine(*model_, *tokenizer_,
                {.num_kv_blocks = 40, .max_num_batched_tokens = 128, .max_num_seqs = 24});
  engine.Start();
  const int num_requests = test::Scaled(1000, 200);
  std::vector<std::shared_ptr<OutputChannel>> channels(static_cast<size_t>(num_requests));
  auto producer = [&](int begin, int end, uint32_t seed) {
    std::mt19937 rng(seed);
    auto uni = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
    for (int i = begin; i < end; ++i) {
      Request r;
      r.request_id = "soak-" + std::to_string(i);
      for (int k = uni(1, 40); k > 0; --k) r.prompt_ids.push_back(uni(1, 511));
      r.sampling.max_tokens = uni(1, 40);
      r.sampling.temperature = uni(0, 3) * 0.4;
      r.sampling.top_p = uni(5, 10) / 10.0;
      r.sampling.top_k = uni(0, 20);
      r.sampling.n = uni(1, 10) == 1 ? 2 : 1;
      if (uni(0, 1)) r.sampling.seed = static_cast<uint64_t>(i);
      if (uni(1, 5) == 1) r.sampling.stop = {"the"};
      if (uni(1, 4) == 1) r.sampling.logprobs = uni(0, 3);
      if (uni(1, 10) == 1) r.deadline = Clock::now() + std::chrono::milliseconds(uni(0, 30));
      channels[static_cast<size_t>(i)] = engine.AddRequest(r);
      if (uni(1, 10) == 1) engine.Cancel(r.request_id);
    }
  };
  std::thread a(producer, 0, num_requests / 2, 1), b(producer, num_requests / 2, num_requests, 2);
  a.join();
  b.join();
  int num_last = 0;
  for (auto& ch : channels) {
    RequestOutput out;
    int lasts = 0;
    while (ch->Pop(&out, std::chrono::seconds(120))) {
      if (out.is_last) {
        ++lasts;
        break;
      }
    }
    EXPECT_EQ(lasts, 1);
    RequestOutput extra;
    EXPECT_FALSE(ch->TryPop(&extra)) << "an event after the last one";
    num_last += lasts;
  }
  engine.Stop();
  EXPECT_EQ(num_last, num_requests);
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
  std::printf("[soak] %d requests: %lld steps, %lld preemptions, %lld generated tokens\n",
              num_requests, (long long)s.num_steps, (long long)s.num_preemptions,
              (long long)s.num_generated_tokens);
}

}  // namespace
}  // namespace llm
