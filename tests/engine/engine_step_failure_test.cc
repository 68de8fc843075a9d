// The engine when a step fails (the executor throws: an out-of-memory step, a CUDA error):
// with isolation (the default) the requests of a step that failed at launch are retried one
// at a time and only the one that fails alone ends with "error"; without it the step's
// requests end with "error"; every other request goes on, no KV block leaks, the prefix cache
// never hands out what the failed step was writing, and a fatal error (or failing steps in a
// row) turns the engine unhealthy. Real stories260K model on the
// CPU, with FaultInjectingExecutor (engine/testing/fault_injection.h) making chosen steps throw.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "engine/cpu/cpu_executor.h"
#include "engine/engine.h"
#include "engine/error.h"
#include "engine/testing/fault_injection.h"
#include "tests/test_util.h"

namespace llm {
namespace {

constexpr int kPoison = 7;  // a byte-fallback piece: in no test prompt, never sampled here

struct Collected {
  std::vector<std::vector<int>> tokens;  // per completion index
  std::vector<float> logprobs;           // index 0's sampled-token logprobs
  std::vector<FinishReason> finish;
  std::string error;  // of the last event
  int num_last = 0;
  int num_events_after_last = 0;
  Usage usage;
};

Collected Drain(OutputChannel& channel, int n = 1) {
  Collected c;
  c.tokens.resize(static_cast<size_t>(n));
  c.finish.assign(static_cast<size_t>(n), FinishReason::kNone);
  RequestOutput out;
  while (channel.Pop(&out, std::chrono::seconds(120))) {
    const size_t i = static_cast<size_t>(out.index);
    c.tokens[i].insert(c.tokens[i].end(), out.token_ids.begin(), out.token_ids.end());
    if (out.index == 0) {
      for (const OutputLogprob& lp : out.logprobs) c.logprobs.push_back(lp.logprob);
    }
    if (out.finish_reason != FinishReason::kNone) c.finish[i] = out.finish_reason;
    if (out.is_last) {
      ++c.num_last;
      c.error = out.error;
      c.usage = out.usage;
      break;
    }
  }
  while (channel.TryPop(&out)) ++c.num_events_after_last;
  return c;
}

// Every test runs with synchronous and with asynchronous scheduling (the parameter).
class EngineStepFailureTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    model_ = &test::StoriesModel();
    tokenizer_ = &test::StoriesTokenizer();
  }
  // An engine over the CPU backend whose steps fail as `plan` says; injector_ watches it.
  std::unique_ptr<Engine> FaultyEngine(FaultPlan plan, EngineConfig config = {}) {
    config.async_scheduling = GetParam();
    auto cpu = std::make_unique<CpuExecutor>(*model_, 128, config.block_size);
    auto faulty = std::make_unique<FaultInjectingExecutor>(std::move(cpu), std::move(plan));
    injector_ = faulty.get();
    return std::make_unique<Engine>(std::move(faulty), *tokenizer_, config);
  }
  // The request alone on a fresh engine with nothing injected: the tokens it must give.
  Collected Fresh(const Request& r) {
    Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
    auto ch = engine.AddRequest(r);
    engine.RunUntilIdle();
    return Drain(*ch, r.sampling.n);
  }
  std::vector<int> Prompt(const std::string& text) { return tokenizer_->EncodePrompt(text); }
  std::vector<int> Poisoned(const std::string& text) {
    std::vector<int> ids = Prompt(text);
    ids.push_back(kPoison);
    return ids;
  }
  static void ExpectIdle(const Engine& engine) {
    const EngineStats s = engine.Stats();
    EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks) << "a KV block leaked";
    EXPECT_EQ(s.num_running + s.num_waiting, 0);
  }

  static const CpuModel* model_;
  static const Tokenizer* tokenizer_;
  FaultInjectingExecutor* injector_ = nullptr;
};
const CpuModel* EngineStepFailureTest::model_ = nullptr;
const Tokenizer* EngineStepFailureTest::tokenizer_ = nullptr;

// Without isolation: a running decode and a new poisoned prompt share the failing step: both
// end with "error". The requests still waiting then run, and give exactly a fresh engine's
// tokens.
TEST_P(EngineStepFailureTest, FailedStepFailsItsRequestsAndTheRestGoOn) {
  for (const auto kind : {FaultPlan::Kind::kRuntimeError, FaultPlan::Kind::kBadAlloc}) {
    auto engine = FaultyEngine({.fail_on_token = kPoison, .kind = kind},
                               {.max_num_seqs = 2, .isolate_failed_requests = false});
    auto decoding = engine->AddRequest(test::GreedyRequest(Prompt("Once upon a time"), 30));
    ASSERT_TRUE(engine->Step());
    ASSERT_TRUE(engine->Step());  // decoding
    auto poisoned = engine->AddRequest(test::GreedyRequest(Poisoned("The little dog"), 10));
    const Request waiting_a = test::GreedyRequest(Prompt("Tom had a"), 20);
    const Request waiting_b = test::GreedyRequest(Prompt("Lily and Ben went to the"), 20);
    auto a = engine->AddRequest(waiting_a);
    auto b = engine->AddRequest(waiting_b);
    ASSERT_TRUE(engine->Step());  // the decode + the poisoned prompt (max_num_seqs 2): fails
    EXPECT_EQ(injector_->num_failures(), 1);
    engine->RunUntilIdle();

    const Collected d = Drain(*decoding), p = Drain(*poisoned);
    for (const Collected* c : {&d, &p}) {
      EXPECT_EQ(c->finish[0], FinishReason::kError);
      EXPECT_EQ(c->num_last, 1);
      EXPECT_EQ(c->num_events_after_last, 0);
      EXPECT_NE(c->error.find("the model step running this request failed"), std::string::npos)
          << c->error;
    }
    EXPECT_NE(p.error.find(kind == FaultPlan::Kind::kBadAlloc ? "bad_alloc" : "injected"),
              std::string::npos)
        << p.error;
    EXPECT_EQ(std::ssize(d.tokens[0]), 2) << "the tokens before the failure were streamed";
    EXPECT_TRUE(p.tokens[0].empty());
    const Collected ra = Drain(*a), rb = Drain(*b);
    EXPECT_EQ(ra.finish[0], FinishReason::kLength);
    EXPECT_EQ(ra.tokens, Fresh(waiting_a).tokens);
    EXPECT_EQ(ra.logprobs, Fresh(waiting_a).logprobs);
    EXPECT_EQ(rb.finish[0], FinishReason::kLength);
    EXPECT_EQ(rb.tokens, Fresh(waiting_b).tokens);
    const EngineStats s = engine->Stats();
    EXPECT_EQ(s.num_failed_steps, 1);
    EXPECT_EQ(s.num_failed_requests, 2);
    EXPECT_EQ(s.num_finished_requests, 4);
    EXPECT_TRUE(s.is_healthy);
    EXPECT_TRUE(engine->IsHealthy());
    ExpectIdle(*engine);
  }
}

// Isolation: the same failing step (a running decode beside a poisoned prompt). Both requests
// are requeued and run alone: the poisoned one fails by itself and is the only request that
// ends with "error"; the decode resumes (its 2 tokens recomputed) and, like the requests that
// were waiting, gives exactly a fresh engine's tokens and logprobs.
TEST_P(EngineStepFailureTest, IsolationFailsOnlyTheRequestThatFailsAlone) {
  auto engine = FaultyEngine({.fail_on_token = kPoison}, {.max_num_seqs = 2});
  const Request decoding_r = test::GreedyRequest(Prompt("Once upon a time"), 30);
  auto decoding = engine->AddRequest(decoding_r);
  ASSERT_TRUE(engine->Step());
  ASSERT_TRUE(engine->Step());  // decoding
  auto poisoned = engine->AddRequest(test::GreedyRequest(Poisoned("The little dog"), 10));
  const Request waiting_a = test::GreedyRequest(Prompt("Tom had a"), 20);
  auto a = engine->AddRequest(waiting_a);
  ASSERT_TRUE(engine->Step());  // the decode + the poisoned prompt: fails, both requeued
  EXPECT_EQ(injector_->num_failures(), 1);
  engine->RunUntilIdle();
  EXPECT_EQ(injector_->num_failures(), 2) << "the poisoned prompt failed once more, alone";

  const Collected p = Drain(*poisoned);
  EXPECT_EQ(p.finish[0], FinishReason::kError);
  EXPECT_EQ(p.num_last, 1);
  EXPECT_NE(p.error.find("the model step running this request failed"), std::string::npos)
      << p.error;
  const Collected d = Drain(*decoding), fresh_d = Fresh(decoding_r);
  EXPECT_EQ(d.finish[0], FinishReason::kLength);
  EXPECT_EQ(d.num_last, 1);
  EXPECT_EQ(d.tokens, fresh_d.tokens) << "no token lost, repeated or changed by the retry";
  EXPECT_EQ(d.logprobs, fresh_d.logprobs);
  const Collected ra = Drain(*a);
  EXPECT_EQ(ra.finish[0], FinishReason::kLength);
  EXPECT_EQ(ra.tokens, Fresh(waiting_a).tokens);
  const EngineStats s = engine->Stats();
  EXPECT_EQ(s.num_failed_steps, 2);
  EXPECT_EQ(s.num_failed_requests, 1);
  EXPECT_EQ(s.num_isolated_retries, 2);
  EXPECT_EQ(s.num_finished_requests, 3);
  EXPECT_TRUE(s.is_healthy);
  ExpectIdle(*engine);
}

// A transient failure (one out-of-memory step holding four requests, then none): every
// request is retried alone once and completes with a fresh engine's tokens; nobody fails.
TEST_P(EngineStepFailureTest, IsolationTurnsATransientFailureIntoNoFailure) {
  auto engine =
      FaultyEngine({.fail_steps = {1}, .max_failures = 1, .kind = FaultPlan::Kind::kBadAlloc},
                   {.max_num_batched_tokens = 64, .max_num_seqs = 4});
  const char* openings[] = {"Once upon a time", "The little dog", "Tom had a", "Lily saw"};
  std::vector<Request> requests;
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (const char* o : openings) {
    requests.push_back(test::GreedyRequest(Prompt(o), 12));
    channels.push_back(engine->AddRequest(requests.back()));
  }
  engine->RunUntilIdle();
  EXPECT_EQ(injector_->num_failures(), 1);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected c = Drain(*channels[i]);
    EXPECT_EQ(c.finish[0], FinishReason::kLength) << i;
    EXPECT_EQ(c.num_last, 1) << i;
    EXPECT_EQ(c.tokens, Fresh(requests[i]).tokens) << i;
  }
  const EngineStats s = engine->Stats();
  EXPECT_EQ(s.num_failed_steps, 1);
  EXPECT_EQ(s.num_failed_requests, 0);
  EXPECT_EQ(s.num_isolated_retries, 4);
  EXPECT_TRUE(s.is_healthy);
  ExpectIdle(*engine);
}

// An executor that breaks its contract: on the chosen results (0-based, counting the calls
// that return samples) the first sample's token id lies outside the vocabulary.
class OutOfVocabExecutor final : public ForwardingExecutor {
 public:
  OutOfVocabExecutor(std::unique_ptr<ModelExecutor> inner, int64_t bad_call)
      : ForwardingExecutor(std::move(inner)), bad_call_(bad_call) {}
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override {
    return Corrupt(inner().ForwardAndSample(batch, tasks));
  }
  std::vector<SampleResult> Wait(StepHandle step) override { return Corrupt(inner().Wait(step)); }

 private:
  std::vector<SampleResult> Corrupt(std::vector<SampleResult> r) {
    if (calls_++ == bad_call_ && !r.empty()) r[0].token = int(config().vocab_size) + 3;
    return r;
  }
  int64_t bad_call_;
  int64_t calls_ = 0;
};

// Results that break the executor's contract (a token id outside the vocabulary) are caught
// before any of them is used: the step fails like any executor error (its requests end with
// "error" naming the id), the engine stays healthy and serves the next request.
TEST_P(EngineStepFailureTest, ExecutorResultsOutsideTheVocabularyFailTheStep) {
  EngineConfig config{.max_num_seqs = 2};
  config.async_scheduling = GetParam();
  auto cpu = std::make_unique<CpuExecutor>(*model_, 128, config.block_size);
  Engine engine(std::make_unique<OutOfVocabExecutor>(std::move(cpu), 2), *tokenizer_, config);
  auto a = engine.AddRequest(test::GreedyRequest(Prompt("Once upon a time"), 10));
  auto b = engine.AddRequest(test::GreedyRequest(Prompt("Tom had a"), 10));
  engine.RunUntilIdle();
  for (auto* ch : {&a, &b}) {
    const Collected c = Drain(**ch);
    EXPECT_EQ(c.finish[0], FinishReason::kError);
    EXPECT_EQ(std::ssize(c.tokens[0]), 2) << "the two good steps' tokens were streamed";
    EXPECT_NE(c.error.find("outside the vocabulary"), std::string::npos) << c.error;
  }
  EXPECT_TRUE(engine.IsHealthy());
  const Request next = test::GreedyRequest(Prompt("Lily saw"), 8);
  auto n = engine.AddRequest(next);
  engine.RunUntilIdle();
  EXPECT_EQ(Drain(*n).tokens, Fresh(next).tokens);
  ExpectIdle(engine);
}

// An exception from the engine's own code (not the executor's), on the engine thread: the
// process must not end (an escaping exception would std::terminate it). The engine turns
// unhealthy ("engine error"), its health listener runs, every request ends once with "error",
// new ones are refused, no block leaks, and Stop() joins the thread. The exception comes from
// Step() itself, after scheduling its 4th step (EngineErrorInjector, a StepObserver).
TEST_P(EngineStepFailureTest, EngineErrorOnTheEngineThreadTurnsItUnhealthyWithoutACrash) {
  EngineConfig config{.max_num_seqs = 2};
  config.async_scheduling = GetParam();
  EngineErrorInjector bug(/*throw_in_step=*/3);
  Engine engine(*model_, *tokenizer_, config, &bug);
  std::mutex mu;
  std::condition_variable cv;
  bool is_notified = false;
  const int handle = engine.AddHealthListener([&] {
    std::lock_guard<std::mutex> lock(mu);
    is_notified = true;
    cv.notify_all();
  });
  auto a = engine.AddRequest(test::GreedyRequest(Prompt("Once upon a time"), 40));
  auto b = engine.AddRequest(test::GreedyRequest(Prompt("Tom had a"), 40));
  engine.Start();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return is_notified; }));
  }
  for (auto* ch : {&a, &b}) {
    const Collected c = Drain(**ch);
    EXPECT_EQ(c.num_last, 1);
    EXPECT_EQ(c.num_events_after_last, 0);
    EXPECT_EQ(c.finish[0], FinishReason::kError);
    EXPECT_NE(c.error.find("unhealthy"), std::string::npos) << c.error;
  }
  EXPECT_FALSE(engine.IsHealthy());
  EXPECT_NE(engine.UnhealthyReason().find("engine error: injected engine error in step 3"),
            std::string::npos)
      << engine.UnhealthyReason();
  EXPECT_THROW(engine.AddRequest(test::GreedyRequest(Prompt("Lily saw"), 4)),
               EngineUnavailableError);
  engine.RemoveHealthListener(handle);
  engine.Stop();
  ExpectIdle(engine);
}

// An executor that samples as a device does: each task's draw counter is taken at launch
// (Sampler::TakeDraw) and the token is a function of (the request's seed, that counter), so a
// sequence's tokens depend only on its own draws, alone or in any batch. The chosen call takes
// its draws and then throws, as a CUDA launch that fails after uploading its parameters, and
// gives them back as the executor contract says (executor.h; the CUDA executor does the same).
class DrawingExecutor final : public ForwardingExecutor {
 public:
  DrawingExecutor(std::unique_ptr<ModelExecutor> inner, int64_t fail_call)
      : ForwardingExecutor(std::move(inner)), fail_call_(fail_call) {}
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override {
    std::vector<SampleResult> results;
    for (const SampleTask& t : tasks) {
      const uint64_t draw = t.sampler->TakeDraw();
      SampleResult r;
      r.token = 300 + int((t.sampler->device_seed() * 31 + draw * 7919) % 200);
      results.push_back(r);
    }
    if (calls_++ == fail_call_) {
      for (const SampleTask& t : tasks) t.sampler->UndoDraws(1);
      throw std::runtime_error("launch failed after taking its draws");
    }
    (void)inner().Forward(batch);
    for (size_t i = 0; i < tasks.size(); ++i) tasks[i].sampler->Observe(results[i].token);
    return results;
  }
  // Launch / Wait: ModelExecutor's (this ForwardAndSample on the fed tokens resolved), not the
  // inner executor's.
  StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) override {
    return ModelExecutor::Launch(batch, tasks);
  }
  std::vector<SampleResult> Wait(StepHandle step) override { return ModelExecutor::Wait(step); }

 private:
  int64_t fail_call_;
  int64_t calls_ = 0;
};

// Seeded requests keep their streams across a retry: the failed launch gave back the draw it
// had taken for each of them, and the engine's requeue and lone steps draw nothing extra, so
// each retried request draws exactly what it draws on an engine where nothing fails (tokens
// equal, not just the count).
TEST_P(EngineStepFailureTest, IsolationRetryKeepsSeededDrawStreams) {
  auto run = [&](int64_t fail_call) {
    EngineConfig config{.max_num_seqs = 4};
    config.async_scheduling = GetParam();
    auto cpu = std::make_unique<CpuExecutor>(*model_, 128, config.block_size);
    Engine engine(std::make_unique<DrawingExecutor>(std::move(cpu), fail_call), *tokenizer_,
                  config);
    std::vector<std::shared_ptr<OutputChannel>> channels;
    int seed = 11;
    for (const char* o : {"Once upon a time", "The little dog", "Tom had a"}) {
      Request r = test::GreedyRequest(Prompt(o), 10);
      r.sampling.temperature = 1.0;
      r.sampling.seed = seed++;
      r.sampling.ignore_eos = true;
      channels.push_back(engine.AddRequest(r));
    }
    engine.RunUntilIdle();
    std::vector<std::vector<int>> tokens;
    for (auto& ch : channels) {
      const Collected c = Drain(*ch);
      EXPECT_EQ(c.finish[0], FinishReason::kLength) << c.error;
      tokens.push_back(c.tokens[0]);
    }
    EXPECT_EQ(engine.Stats().num_isolated_retries, fail_call >= 0 ? 3 : 0);
    ExpectIdle(engine);
    return tokens;
  };
  const auto clean = run(-1);
  EXPECT_EQ(run(2), clean) << "the third step (three decodes) failed after taking its draws";
}

// Isolation lasts until the request has sampled alone: a decode requeued by a failed step
// recomputes its tokens in a step that does not sample the last one, so that step alone does
// not clear it; the sampling step must run alone too. Here every step that samples for the
// poisoned request beside another request fails (the poison is its sampling, not its prompt):
// it must end with "error" on its own, and the other request must not fail with it.
TEST_P(EngineStepFailureTest, IsolationEndsOnlyAfterTheRequestSampledAlone) {
  // Prefix caching off: otherwise the retried prompt's clean first chunk comes from the cache
  // and its lone step is the poisoned one anyway.
  auto engine = FaultyEngine(
      {.fail_on_token = kPoison},
      {.max_num_batched_tokens = 16, .max_num_seqs = 2, .enable_prefix_caching = false});
  // A prompt longer than one chunk ending in the poison: its first chunk is clean, the
  // sampling chunk holds the poison.
  std::vector<int> long_prompt = Prompt("Once upon a time, there was a little girl named Lily.");
  while (std::ssize(long_prompt) < 24) long_prompt.push_back(long_prompt[1]);
  long_prompt.push_back(kPoison);
  const Request other = test::GreedyRequest(Prompt("Tom had a"), 12);
  auto o = engine->AddRequest(other);
  auto p = engine->AddRequest(test::GreedyRequest(long_prompt, 4));
  engine->RunUntilIdle();
  EXPECT_EQ(Drain(*p).finish[0], FinishReason::kError);
  const Collected c = Drain(*o);
  EXPECT_EQ(c.finish[0], FinishReason::kLength) << c.error;
  EXPECT_EQ(c.tokens, Fresh(other).tokens);
  EXPECT_EQ(engine->Stats().num_failed_requests, 1);
  ExpectIdle(*engine);
}

// The failed step wrote garbage into its blocks (the injector runs the forward on other
// token ids, then throws). None of them may be found in the prefix cache: the same prompt
// again must recompute, and give a fresh engine's tokens and bit-identical logprobs.
TEST_P(EngineStepFailureTest, PrefixCacheNeverServesTheFailedStepsBlocks) {
  auto engine = FaultyEngine({.fail_steps = {0}});
  std::vector<int> prompt = Prompt(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends.");
  ASSERT_GE(std::ssize(prompt), 33) << "at least two full blocks before the last token";
  auto failed = engine->AddRequest(test::GreedyRequest(prompt, 16));
  engine->RunUntilIdle();
  EXPECT_EQ(Drain(*failed).finish[0], FinishReason::kError);
  EXPECT_EQ(engine->Stats().num_cached_kv_blocks, 0) << "a failed step's block was hashed";
  ExpectIdle(*engine);

  auto again = engine->AddRequest(test::GreedyRequest(prompt, 16));
  engine->RunUntilIdle();
  const Collected c = Drain(*again);
  const Collected fresh = Fresh(test::GreedyRequest(prompt, 16));
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EXPECT_EQ(c.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(c.tokens, fresh.tokens);
  EXPECT_EQ(c.logprobs, fresh.logprobs);
  // Now that a step computed them, the prompt's blocks are cached and serve a third request.
  auto third = engine->AddRequest(test::GreedyRequest(prompt, 16));
  engine->RunUntilIdle();
  const Collected t = Drain(*third);
  EXPECT_EQ(t.usage.cached_prompt_tokens, (std::ssize(prompt) - 1) / 16 * 16);
  EXPECT_EQ(t.tokens, fresh.tokens);
  ExpectIdle(*engine);
}

// Chunked prefill (16 tokens a step): the first two chunks succeed, the third fails. The
// blocks of the successful chunks hold sound KV and stay cached; the failed chunk's do not.
TEST_P(EngineStepFailureTest, ChunksComputedBeforeTheFailureStayCached) {
  auto engine = FaultyEngine({.fail_steps = {2}}, {.max_num_batched_tokens = 16});
  std::vector<int> prompt = Prompt("One day, a big red ball");
  std::mt19937 rng(3);
  while (std::ssize(prompt) < 60) {
    prompt.push_back(std::uniform_int_distribution<int>(300, 511)(rng));
  }
  auto failed = engine->AddRequest(test::GreedyRequest(prompt, 8));
  engine->RunUntilIdle();
  EXPECT_EQ(Drain(*failed).finish[0], FinishReason::kError);
  EXPECT_EQ(engine->Stats().num_cached_kv_blocks, 2);
  ExpectIdle(*engine);
  auto again = engine->AddRequest(test::GreedyRequest(prompt, 8));
  engine->RunUntilIdle();
  const Collected c = Drain(*again);
  const Collected fresh = Fresh(test::GreedyRequest(prompt, 8));
  EXPECT_EQ(c.usage.cached_prompt_tokens, 32) << "the two chunks that succeeded are reused";
  EXPECT_EQ(c.tokens, fresh.tokens);
  EXPECT_EQ(c.logprobs, fresh.logprobs);
  ExpectIdle(*engine);
}

// n > 1: a failure in the prompt's step (children created for sampling, never started) and
// one in a decode step (after the fork) both end every completion once, with no leak.
TEST_P(EngineStepFailureTest, NCompletionsFailTogetherOnce) {
  for (const int64_t failing_step : {0, 3}) {
    auto engine = FaultyEngine({.fail_steps = {failing_step}});
    Request r = test::GreedyRequest(Prompt("The little dog"), 12);
    r.sampling.n = 3;
    r.sampling.temperature = 1.0;
    r.sampling.seed = 5;
    auto ch = engine->AddRequest(r);
    engine->RunUntilIdle();
    const Collected c = Drain(*ch, 3);
    EXPECT_EQ(c.num_last, 1) << failing_step;
    EXPECT_EQ(c.num_events_after_last, 0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(c.finish[i], FinishReason::kError) << i;
    ExpectIdle(*engine);
    EXPECT_EQ(engine->Stats().num_cached_kv_blocks, 0);
    // The same request afterwards: what a fresh engine gives.
    auto again = engine->AddRequest(r);
    engine->RunUntilIdle();
    EXPECT_EQ(Drain(*again, 3).tokens, Fresh(r).tokens);
    ExpectIdle(*engine);
  }
}

// A fatal error (a sticky CUDA error): unhealthy at once; every request held fails, new ones
// are refused with EngineUnavailableError; health listeners run once.
TEST_P(EngineStepFailureTest, FatalErrorTurnsTheEngineUnhealthy) {
  auto engine = FaultyEngine({.fail_on_token = kPoison, .kind = FaultPlan::Kind::kFatal},
                             {.max_num_seqs = 1});
  std::atomic<int> num_calls{0};
  const int handle = engine->AddHealthListener([&] { ++num_calls; });
  auto poisoned = engine->AddRequest(test::GreedyRequest(Poisoned("Once upon a time"), 10));
  auto waiting = engine->AddRequest(test::GreedyRequest(Prompt("Tom had a"), 10));
  engine->RunUntilIdle();
  EXPECT_EQ(Drain(*poisoned).finish[0], FinishReason::kError);
  const Collected w = Drain(*waiting);
  EXPECT_EQ(w.finish[0], FinishReason::kError);
  EXPECT_NE(w.error.find("unhealthy"), std::string::npos) << w.error;
  EXPECT_FALSE(engine->IsHealthy());
  EXPECT_NE(engine->UnhealthyReason().find("fatal"), std::string::npos);
  EXPECT_FALSE(engine->Stats().is_healthy);
  EXPECT_EQ(engine->Stats().num_failed_requests, 2);
  EXPECT_EQ(num_calls.load(), 1);
  EXPECT_THROW(engine->AddRequest(test::GreedyRequest(Prompt("Tom had a"), 10)),
               EngineUnavailableError);
  ExpectIdle(*engine);
  std::atomic<int> late_calls{0};
  engine->RemoveHealthListener(engine->AddHealthListener([&] { ++late_calls; }));
  EXPECT_EQ(late_calls.load(), 1) << "a listener added after the fact runs at once";
  engine->RemoveHealthListener(handle);
}

// Non-fatal failures turn the engine unhealthy only when max_consecutive_step_failures steps
// fail in a row; a successful step in between resets the count.
TEST_P(EngineStepFailureTest, ConsecutiveFailuresTurnTheEngineUnhealthy) {
  auto engine = FaultyEngine({.fail_on_token = kPoison}, {.max_consecutive_step_failures = 3});
  auto run = [&](const Request& r) {
    auto ch = engine->AddRequest(r);
    engine->RunUntilIdle();
    return Drain(*ch).finish[0];
  };
  const Request bad = test::GreedyRequest(Poisoned("Once upon a time"), 4);
  const Request good = test::GreedyRequest(Prompt("Tom had a"), 4);
  EXPECT_EQ(run(bad), FinishReason::kError);
  EXPECT_EQ(run(bad), FinishReason::kError);
  EXPECT_EQ(run(good), FinishReason::kLength);  // resets the count
  EXPECT_EQ(run(bad), FinishReason::kError);
  EXPECT_EQ(run(bad), FinishReason::kError);
  EXPECT_TRUE(engine->IsHealthy());
  EXPECT_EQ(run(bad), FinishReason::kError);  // the third in a row
  EXPECT_FALSE(engine->IsHealthy());
  EXPECT_NE(engine->UnhealthyReason().find("3 steps in a row"), std::string::npos)
      << engine->UnhealthyReason();
  EXPECT_EQ(engine->Stats().num_failed_steps, 5);
  EXPECT_THROW(engine->AddRequest(good), EngineUnavailableError);
  ExpectIdle(*engine);
}

// The engine thread with two producer threads: poisoned requests mixed into ordinary ones,
// two sequences a step. Every channel ends exactly once; a poisoned request always fails,
// an ordinary one never does (isolation retries it alone after a step it shared with a
// poisoned one) and gives a fresh engine's tokens; then a fatal failure seen through a health
// listener.
TEST_P(EngineStepFailureTest, EngineThreadSurvivesFailuresUnderLoad) {
  auto engine = FaultyEngine({.fail_on_token = kPoison},
                             {.max_num_seqs = 2, .max_consecutive_step_failures = 0});
  const char* openings[] = {"Once upon a time", "The little dog", "Tom had a", "Lily saw"};
  std::vector<Collected> fresh;
  for (const char* o : openings) fresh.push_back(Fresh(test::GreedyRequest(Prompt(o), 12)));
  engine->Start();
  const int num_requests = test::Scaled(120, 40);
  std::vector<std::shared_ptr<OutputChannel>> channels(static_cast<size_t>(num_requests));
  auto producer = [&](int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const char* opening = openings[i % 4];
      channels[static_cast<size_t>(i)] = engine->AddRequest(
          test::GreedyRequest(i % 10 == 0 ? Poisoned(opening) : Prompt(opening), 12));
    }
  };
  std::thread a(producer, 0, num_requests / 2), b(producer, num_requests / 2, num_requests);
  a.join();
  b.join();
  int num_ok = 0;
  for (int i = 0; i < num_requests; ++i) {
    const Collected c = Drain(*channels[static_cast<size_t>(i)]);
    ASSERT_EQ(c.num_last, 1) << i;
    EXPECT_EQ(c.num_events_after_last, 0) << i;
    if (i % 10 == 0) {
      EXPECT_EQ(c.finish[0], FinishReason::kError) << i;
    } else {
      EXPECT_EQ(c.finish[0], FinishReason::kLength) << i << ": " << c.error;
      EXPECT_EQ(c.tokens, fresh[static_cast<size_t>(i % 4)].tokens) << i;
      ++num_ok;
    }
  }
  EXPECT_EQ(num_ok, num_requests - (num_requests + 9) / 10);
  EXPECT_TRUE(engine->IsHealthy());
  engine->Stop();  // the stats are published after the step's events: read them after it
  EXPECT_GE(engine->Stats().num_failed_steps, 1);
  ExpectIdle(*engine);

  // Fatal, seen from another thread through a listener.
  auto fatal = FaultyEngine({.fail_on_token = kPoison, .kind = FaultPlan::Kind::kFatal});
  std::mutex mu;
  std::condition_variable cv;
  bool is_notified = false;
  const int handle = fatal->AddHealthListener([&] {
    std::lock_guard<std::mutex> lock(mu);
    is_notified = true;
    cv.notify_all();
  });
  fatal->Start();
  auto ch = fatal->AddRequest(test::GreedyRequest(Poisoned("Once upon a time"), 8));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return is_notified; }));
  }
  EXPECT_EQ(Drain(*ch).finish[0], FinishReason::kError);
  EXPECT_FALSE(fatal->IsHealthy());
  EXPECT_THROW(fatal->AddRequest(test::GreedyRequest(Prompt("Tom had a"), 4)),
               EngineUnavailableError);
  fatal->RemoveHealthListener(handle);
  fatal->Stop();
  ExpectIdle(*fatal);
}

INSTANTIATE_TEST_SUITE_P(Scheduling, EngineStepFailureTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Async" : "Sync";
                         });

}  // namespace
}  // namespace llm
