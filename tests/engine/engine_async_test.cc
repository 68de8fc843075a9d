// Asynchronous scheduling (EngineConfig::async_scheduling, engine/engine_step.cc) on the CPU
// backend with the real stories260K model: every scenario runs twice, synchronous and async,
// and the outputs must be the same bit for bit (tokens, logprobs, text, finish reasons,
// usage): greedy and seeded sampling, penalties (the synchronous fallback), stop strings and
// tokens, max_tokens, n > 1, chunked prefill, preemption, prefix caching, aborts, failed
// steps. OverlapExecutor proves the overlap: it runs each step on its own worker thread (a
// "device") and records, at every Wait, whether the engine had already launched the next one.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "engine/cpu/cpu_executor.h"
#include "engine/engine.h"
#include "engine/error.h"
#include "engine/grammar/compiler.h"
#include "engine/grammar/matcher.h"
#include "engine/testing/fault_injection.h"
#include "tests/test_util.h"

namespace llm {
namespace {

struct Collected {
  std::vector<std::vector<int>> tokens;  // per completion index
  std::vector<std::vector<OutputLogprob>> logprobs;
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
  std::string error;
  int num_last = 0;
  Usage usage;
};

bool Same(const OutputLogprob& a, const OutputLogprob& b) {
  if (a.token != b.token || a.logprob != b.logprob || a.top.size() != b.top.size()) return false;
  for (size_t i = 0; i < a.top.size(); ++i) {
    if (a.top[i].token != b.top[i].token || a.top[i].logprob != b.top[i].logprob) return false;
  }
  return true;
}

bool Same(const std::vector<std::vector<OutputLogprob>>& a,
          const std::vector<std::vector<OutputLogprob>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    for (size_t k = 0; k < a[i].size(); ++k) {
      if (!Same(a[i][k], b[i][k])) return false;
    }
  }
  return true;
}

Collected Drain(OutputChannel& channel, int n) {
  Collected c;
  c.tokens.resize(static_cast<size_t>(n));
  c.logprobs.resize(static_cast<size_t>(n));
  c.text.resize(static_cast<size_t>(n));
  c.finish.assign(static_cast<size_t>(n), FinishReason::kNone);
  RequestOutput out;
  while (channel.Pop(&out, std::chrono::seconds(120))) {
    const size_t i = static_cast<size_t>(out.index);
    c.tokens[i].insert(c.tokens[i].end(), out.token_ids.begin(), out.token_ids.end());
    c.logprobs[i].insert(c.logprobs[i].end(), out.logprobs.begin(), out.logprobs.end());
    c.text[i] += out.text;
    if (out.finish_reason != FinishReason::kNone) c.finish[i] = out.finish_reason;
    if (out.is_last) {
      ++c.num_last;
      c.error = out.error;
      c.usage = out.usage;
      break;
    }
  }
  return c;
}

void ExpectSame(const Collected& a, const Collected& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_TRUE(Same(a.logprobs, b.logprobs)) << what << ": logprobs differ";
  EXPECT_EQ(a.text, b.text) << what;
  EXPECT_EQ(a.finish, b.finish) << what;
  EXPECT_EQ(a.num_last, 1) << what;
  EXPECT_EQ(a.usage.completion_tokens, b.usage.completion_tokens) << what;
  EXPECT_EQ(a.usage.prompt_tokens, b.usage.prompt_tokens) << what;
}

// Prompts of mixed lengths: story openings plus random token ids.
std::vector<std::vector<int>> MixedPrompts(const Tokenizer& tok, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  const char* openings[] = {"Once upon a time", "The little dog", "Lily and Ben went to the",
                            "One day, a big red ball", "Tom had a"};
  std::vector<std::vector<int>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int> ids = tok.EncodePrompt(openings[i % 5]);
    const int extra = std::uniform_int_distribution<int>(0, i % 3 == 0 ? 150 : 20)(rng);
    for (int k = 0; k < extra; ++k) ids.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    out.push_back(std::move(ids));
  }
  return out;
}

// Records, at each Wait, whether the engine had launched the next step already; runs every
// step of the wrapped executor on one worker thread, in launch order (a device stream), so
// that the engine's host work really runs beside it (and under TSan, is checked to).
class OverlapExecutor final : public ModelExecutor {
 public:
  explicit OverlapExecutor(std::unique_ptr<ModelExecutor> inner)
      : inner_(std::move(inner)), worker_([this] { Work(); }) {}
  ~OverlapExecutor() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      is_stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  const ModelConfig& config() const override { return inner_->config(); }
  std::string Describe() const override { return "overlap checker over " + inner_->Describe(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int64_t block_size() const override { return inner_->block_size(); }
  void CopyBlocks(std::span<const BlockCopy> copies) override {
    std::vector<BlockCopy> owned(copies.begin(), copies.end());
    Enqueue([this, owned] { inner_->CopyBlocks(owned); });
  }
  std::vector<float> Forward(const ForwardBatch&) override {
    throw std::logic_error("OverlapExecutor: Forward is not used");
  }
  // Synchronous mode: the same worker, waited for at once.
  std::vector<SampleResult> ForwardAndSample(const ForwardBatch& batch,
                                             std::span<const SampleTask> tasks) override {
    std::promise<std::vector<SampleResult>> promise;
    std::vector<SampleTask> owned(tasks.begin(), tasks.end());
    Enqueue([&] {
      try {
        promise.set_value(inner_->ForwardAndSample(batch, owned));
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    });
    return promise.get_future().get();
  }
  StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) override {
    const int64_t id = num_launched_++;
    auto promise = std::make_shared<std::promise<std::vector<SampleResult>>>();
    futures_.emplace_back(id, promise->get_future());
    std::vector<SampleTask> owned(tasks.begin(), tasks.end());
    Enqueue([this, batch, owned, promise] {
      try {
        promise->set_value(inner_->Wait(inner_->Launch(batch, owned)));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
    return {id};
  }
  std::vector<SampleResult> Wait(StepHandle step) override {
    if (futures_.empty() || futures_.front().first != step.id) {
      throw std::logic_error("OverlapExecutor: Wait out of order");
    }
    ++num_waits_;
    if (num_launched_ > step.id + 1) ++num_waits_after_next_launch_;
    std::future<std::vector<SampleResult>> f = std::move(futures_.front().second);
    futures_.pop_front();
    return f.get();
  }

  int64_t num_launched() const { return num_launched_; }
  int64_t num_waits() const { return num_waits_; }
  int64_t num_waits_after_next_launch() const { return num_waits_after_next_launch_; }

 private:
  void Enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_all();
  }
  void Work() {
    while (true) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return is_stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  std::unique_ptr<ModelExecutor> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool is_stopping_ = false;
  std::deque<std::pair<int64_t, std::future<std::vector<SampleResult>>>> futures_;
  int64_t num_launched_ = 0, num_waits_ = 0, num_waits_after_next_launch_ = 0;
  std::thread worker_;  // last: starts after everything it reads
};

// Wait throws for the chosen steps (as a CUDA error surfaces at the synchronisation).
class WaitFailingExecutor final : public ForwardingExecutor {
 public:
  WaitFailingExecutor(std::unique_ptr<ModelExecutor> inner, std::vector<int64_t> fail_steps)
      : ForwardingExecutor(std::move(inner)), fail_steps_(std::move(fail_steps)) {}
  std::vector<SampleResult> Wait(StepHandle step) override {
    std::vector<SampleResult> results = inner().Wait(step);
    if (std::count(fail_steps_.begin(), fail_steps_.end(), step.id) > 0) {
      throw std::runtime_error("injected failure at the wait for step " + std::to_string(step.id));
    }
    return results;
  }

 private:
  std::vector<int64_t> fail_steps_;
};

// What an OverlapExecutor counted (read before the engine that owns it is destroyed).
struct OverlapCounts {
  int64_t num_launched = 0, num_waits = 0, num_waits_after_next_launch = 0;
};

class EngineAsyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = &test::StoriesModel();
    tokenizer_ = &test::StoriesTokenizer();
  }
  std::unique_ptr<ModelExecutor> Cpu(const EngineConfig& config) {
    return std::make_unique<CpuExecutor>(*model_, config.num_kv_blocks, config.block_size);
  }
  // Every request added at once, run to the end; the outputs in request order.
  std::vector<Collected> RunAll(const std::vector<Request>& requests, EngineConfig config,
                                bool is_async, EngineStats* stats = nullptr,
                                OverlapCounts* counts = nullptr) {
    config.async_scheduling = is_async;
    auto executor = std::make_unique<OverlapExecutor>(Cpu(config));
    const OverlapExecutor* overlap = executor.get();
    Engine engine(std::move(executor), *tokenizer_, config);
    std::vector<std::shared_ptr<OutputChannel>> channels;
    for (const Request& r : requests) channels.push_back(engine.AddRequest(r));
    engine.RunUntilIdle();
    std::vector<Collected> out;
    for (size_t i = 0; i < requests.size(); ++i) {
      out.push_back(Drain(*channels[i], requests[i].sampling.n));
    }
    const EngineStats s = engine.Stats();
    EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks) << "a KV block leaked";
    EXPECT_EQ(s.num_running + s.num_waiting, 0);
    if (stats) *stats = s;
    if (counts) {
      *counts = {overlap->num_launched(), overlap->num_waits(),
                 overlap->num_waits_after_next_launch()};
    }
    return out;
  }
  // Sync and async give the same outputs; returns the async run's stats.
  EngineStats ExpectAsyncMatchesSync(const std::vector<Request>& requests, EngineConfig config) {
    const std::vector<Collected> sync = RunAll(requests, config, false);
    EngineStats stats;
    const std::vector<Collected> async = RunAll(requests, config, true, &stats);
    for (size_t i = 0; i < requests.size(); ++i) {
      ExpectSame(async[i], sync[i], "request " + std::to_string(i));
    }
    return stats;
  }

  static const CpuModel* model_;
  static const Tokenizer* tokenizer_;
};
const CpuModel* EngineAsyncTest::model_ = nullptr;
const Tokenizer* EngineAsyncTest::tokenizer_ = nullptr;

constexpr EngineConfig kTight{.num_kv_blocks = 48,
                              .max_num_batched_tokens = 96,
                              .max_num_seqs = 32,
                              .kv_reserve_ratio = 0};  // admit whenever a prompt fits: preempt

TEST_F(EngineAsyncTest, GreedyUnderChunkingAndPreemptionMatchesSync) {
  std::vector<Request> requests;
  std::mt19937 rng(5);
  for (auto& p : MixedPrompts(*tokenizer_, test::Scaled(48, 12), 11)) {
    requests.push_back(
        test::GreedyRequest(std::move(p), std::uniform_int_distribution<int>(5, 60)(rng)));
  }
  EngineConfig config = kTight;
  if (test::IsSmallScale()) config.num_kv_blocks = 24;  // fewer requests: a smaller pool
  const EngineStats s = ExpectAsyncMatchesSync(requests, config);
  EXPECT_GT(s.num_preemptions, 0) << "the pool was meant to force preemption";
  std::printf("[async] %zu greedy requests: %lld steps, %lld preemptions\n", requests.size(),
              (long long)s.num_steps, (long long)s.num_preemptions);
}

// Seeded sampling of every kind (top-k/p, min-p, logit_bias, top logprobs), stop strings,
// EOS and stop_token_ids, max_tokens of 1: the same tokens, text and finish reasons.
TEST_F(EngineAsyncTest, SeededSamplingStopsAndLengthsMatchSync) {
  std::vector<Request> requests;
  std::mt19937 rng(7);
  auto uni = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  int i = 0;
  for (auto& p : MixedPrompts(*tokenizer_, test::Scaled(40, 10), 12)) {
    Request r;
    r.prompt_ids = std::move(p);
    r.sampling.max_tokens = i % 7 == 0 ? 1 : uni(2, 50);
    r.sampling.temperature = uni(0, 3) * 0.4;
    r.sampling.top_k = uni(0, 20);
    r.sampling.top_p = uni(5, 10) / 10.0;
    r.sampling.min_p = uni(0, 1) * 0.05;
    r.sampling.seed = static_cast<uint64_t>(1000 + i);
    r.sampling.logprobs = uni(0, 3);
    r.sampling.ignore_eos = uni(0, 1) == 1;
    if (i % 4 == 0) r.sampling.stop = {"the", "Lily"};
    if (i % 5 == 0) r.sampling.stop_token_ids = {13};
    if (i % 6 == 0) r.sampling.logit_bias = {{29, 5.f}};
    requests.push_back(std::move(r));
    ++i;
  }
  ExpectAsyncMatchesSync(requests, kTight);
  // The text path checks what it should: a stop string ended some requests.
  const std::vector<Collected> out = RunAll(requests, kTight, true);
  int num_stopped = 0;
  for (const Collected& c : out) num_stopped += c.finish[0] == FinishReason::kStop;
  EXPECT_GT(num_stopped, 0);
}

// Penalties make the step after each sampling step wait (the synchronous fallback); mixed
// with requests without them, everything still matches.
TEST_F(EngineAsyncTest, PenaltiesMatchSync) {
  std::vector<Request> requests;
  int i = 0;
  for (auto& p : MixedPrompts(*tokenizer_, test::Scaled(16, 6), 13)) {
    Request r = test::GreedyRequest(std::move(p), 30);
    r.sampling.temperature = i % 2 == 0 ? 0.8 : 0.0;
    r.sampling.seed = static_cast<uint64_t>(i);
    if (i % 3 == 0) r.sampling.repetition_penalty = 1.3;
    if (i % 3 == 1) r.sampling.presence_penalty = 0.7;
    if (i % 4 == 1) r.sampling.frequency_penalty = 0.5;
    requests.push_back(std::move(r));
    ++i;
  }
  ExpectAsyncMatchesSync(requests, kTight);
}

// Structured outputs keep one step in flight: a grammar's mask for step N+1 needs N's token,
// which the executor records before it reads the mask (ModelExecutor's Launch samples inside
// Launch; CUDA reads N back after enqueueing N+1's forward: engine/cuda/step_runner.cc), so
// the engine does not wait for N before launching N+1 (only penalties and forks do). Seeded
// grammar requests beside unconstrained ones give the same tokens as synchronous scheduling.
TEST_F(EngineAsyncTest, GrammarRequestsStayInFlightAndMatchSync) {
  grammar::GrammarCompiler compiler(grammar::TokenVocabulary::FromTokenizer(
      *tokenizer_, {tokenizer_->eos_id()}, model_->config().vocab_size));
  auto compile = [&](grammar::StructuredSpec::Kind kind, std::string text) {
    grammar::StructuredSpec spec;
    spec.kind = kind;
    spec.text = std::move(text);
    return compiler.Compile(spec);
  };
  const auto schema = compile(grammar::StructuredSpec::Kind::kJsonSchema,
                              R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":99}},
      "required":["name","age"],"additionalProperties":false})");
  const auto regex =
      compile(grammar::StructuredSpec::Kind::kRegex, "(Tom|Lily) (ran|sat) [a-z]{1,6}\\.");
  std::vector<Request> requests;
  int i = 0;
  for (auto& p : MixedPrompts(*tokenizer_, 8, 29)) {
    Request r = test::GreedyRequest(std::move(p), 40);
    r.sampling.temperature = i == 3 ? 0.0 : 1.0;
    r.sampling.seed = static_cast<uint64_t>(i);
    if (i < 6) r.sampling.grammar = i % 2 == 0 ? schema : regex;
    requests.push_back(std::move(r));
    ++i;
  }
  const EngineConfig config{.num_kv_blocks = 64};
  const std::vector<Collected> sync = RunAll(requests, config, false);
  OverlapCounts counts;
  const std::vector<Collected> async = RunAll(requests, config, true, nullptr, &counts);
  for (size_t k = 0; k < requests.size(); ++k) {
    ExpectSame(async[k], sync[k], "request " + std::to_string(k));
    if (requests[k].sampling.grammar) {
      const grammar::CompiledGrammar& g = *requests[k].sampling.grammar;
      EXPECT_GE(g.NextBytes(g.initial_state(), async[k].text[0]), 0)
          << k << ": " << async[k].text[0] << " is not a prefix of the language";
    }
  }
  // Every wait but the last one's finds the next step launched: no step waited for its
  // predecessor's tokens (with needs_sync, none would).
  EXPECT_GT(counts.num_waits, 10);
  EXPECT_EQ(counts.num_waits_after_next_launch, counts.num_waits - 1);
}

TEST_F(EngineAsyncTest, NCompletionsMatchSync) {
  std::vector<Request> requests;
  int i = 0;
  for (auto& p : MixedPrompts(*tokenizer_, 10, 14)) {
    Request r = test::GreedyRequest(std::move(p), 20);
    r.sampling.n = 1 + i % 3;
    r.sampling.temperature = i % 2 == 0 ? 1.0 : 0.0;
    r.sampling.seed = static_cast<uint64_t>(i);
    if (i % 4 == 0) r.sampling.stop = {"the"};
    requests.push_back(std::move(r));
    ++i;
  }
  ExpectAsyncMatchesSync(requests, {.num_kv_blocks = 64, .max_num_batched_tokens = 64});
}

// A prompt computed once serves the next requests from the prefix cache in async mode too.
TEST_F(EngineAsyncTest, PrefixCacheHitsMatchSync) {
  const std::vector<int> prompt = tokenizer_->EncodePrompt(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends and her big red ball.");
  for (const bool is_async : {false, true}) {
    EngineConfig config{.num_kv_blocks = 256, .async_scheduling = is_async};
    Engine engine(*model_, *tokenizer_, config);
    auto first = engine.AddRequest(test::GreedyRequest(prompt, 20));
    engine.RunUntilIdle();
    const Collected a = Drain(*first, 1);
    auto second = engine.AddRequest(test::GreedyRequest(prompt, 20));
    engine.RunUntilIdle();
    const Collected b = Drain(*second, 1);
    ExpectSame(b, a, is_async ? "async" : "sync");
    EXPECT_EQ(b.usage.cached_prompt_tokens, (std::ssize(prompt) - 1) / 16 * 16);
  }
}

// The proof of overlap: every step but the last is launched before the engine waits for the
// one before it (and the "device" runs it on another thread meanwhile). Synchronous: never.
TEST_F(EngineAsyncTest, NextStepIsLaunchedBeforeThePreviousResultsAreConsumed) {
  std::vector<Request> requests;
  for (const char* p : {"Once upon a time", "The little dog", "Tom had a", "Lily saw"}) {
    requests.push_back(test::GreedyRequest(tokenizer_->EncodePrompt(p), 16));
  }
  const EngineConfig config{.num_kv_blocks = 64};
  OverlapCounts counts;
  EngineStats stats;
  const std::vector<Collected> async = RunAll(requests, config, true, &stats, &counts);
  // One prefill step and 15 decode steps; only the last one's wait has no successor.
  EXPECT_EQ(counts.num_launched, 16);
  EXPECT_EQ(counts.num_waits, 16);
  EXPECT_EQ(counts.num_waits_after_next_launch, 15);
  EXPECT_EQ(stats.num_steps, 16);
  const std::vector<Collected> sync = RunAll(requests, config, false, nullptr, &counts);
  EXPECT_EQ(counts.num_launched, 0) << "synchronous mode calls ForwardAndSample";
  for (size_t i = 0; i < requests.size(); ++i) ExpectSame(async[i], sync[i], std::to_string(i));
}

// Abort mid-stream: the tokens streamed before the abort are a prefix of the full output, the
// extra token of the step in flight is never emitted, every block is freed, and a request
// running beside it is untouched.
TEST_F(EngineAsyncTest, AbortMidStreamFreesEverything) {
  const Request other = test::GreedyRequest(tokenizer_->EncodePrompt("Tom had a"), 30);
  Request slow = test::GreedyRequest(tokenizer_->EncodePrompt("Once upon a time"), 60);
  slow.request_id = "cancel-me";
  const std::vector<Collected> full = RunAll({slow, other}, {.num_kv_blocks = 64}, false);
  for (const int steps_before : {1, 2, 3, 7}) {
    Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .async_scheduling = true});
    auto ch = engine.AddRequest(slow);
    auto beside = engine.AddRequest(other);
    for (int s = 0; s < steps_before; ++s) ASSERT_TRUE(engine.Step());
    engine.Cancel("cancel-me");
    engine.RunUntilIdle();
    const Collected c = Drain(*ch, 1);
    EXPECT_EQ(c.finish[0], FinishReason::kAbort);
    ASSERT_LE(c.tokens[0].size(), full[0].tokens[0].size());
    EXPECT_TRUE(std::equal(c.tokens[0].begin(), c.tokens[0].end(), full[0].tokens[0].begin()));
    EXPECT_EQ(c.usage.completion_tokens, std::ssize(c.tokens[0]));
    EXPECT_EQ(std::ssize(c.tokens[0]), std::max(0, steps_before - 1)) << steps_before;
    ExpectSame(Drain(*beside, 1), full[1], "the request beside it");
    EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);
  }
}

// A deadline that passes while a step is in flight ends the request like an abort.
TEST_F(EngineAsyncTest, DeadlineWhileInFlight) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .async_scheduling = true});
  Request r = test::GreedyRequest(tokenizer_->EncodePrompt("Once upon a time"), 400);
  // 2 ms: well inside the 400 tokens (stories260K can produce them in under 30 ms on an idle
  // machine, which made a 30 ms deadline flaky), and past the first step's launch.
  r.deadline = Clock::now() + std::chrono::milliseconds(2);
  auto ch = engine.AddRequest(r);
  engine.RunUntilIdle();
  EXPECT_EQ(Drain(*ch, 1).finish[0], FinishReason::kTimeout);
  EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);
}

// A step that fails at its wait (a CUDA error surfaces there): the next step was already
// launched with tokens fed from it. The failed step's requests end with "error" once, its KV
// never enters the prefix cache, and the requests beside it give synchronous mode's tokens.
TEST_F(EngineAsyncTest, FailureAtWaitFailsOnlyThatStepsRequests) {
  const std::vector<int> prompt = tokenizer_->EncodePrompt(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends.");
  const Request later = test::GreedyRequest(tokenizer_->EncodePrompt("Tom had a"), 12);
  const std::vector<Collected> fresh =
      RunAll({test::GreedyRequest(prompt, 16), later}, {.num_kv_blocks = 64}, false);
  for (const int64_t failing : {0, 1, 4}) {
    EngineConfig config{.num_kv_blocks = 64, .max_num_seqs = 1, .async_scheduling = true};
    auto executor = std::make_unique<WaitFailingExecutor>(Cpu(config), std::vector{failing});
    Engine engine(std::move(executor), *tokenizer_, config);
    auto failed = engine.AddRequest(test::GreedyRequest(prompt, 16));
    auto waiting = engine.AddRequest(later);
    engine.RunUntilIdle();
    const Collected f = Drain(*failed, 1);
    EXPECT_EQ(f.finish[0], FinishReason::kError) << failing;
    EXPECT_EQ(f.num_last, 1);
    EXPECT_NE(f.error.find("injected failure at the wait"), std::string::npos) << f.error;
    EXPECT_EQ(std::ssize(f.tokens[0]), failing) << "the tokens before the failed step";
    ExpectSame(Drain(*waiting, 1), fresh[1], "the waiting request");
    const EngineStats s = engine.Stats();
    EXPECT_EQ(s.num_failed_steps, 1);
    EXPECT_EQ(s.num_failed_requests, 1);
    EXPECT_TRUE(engine.IsHealthy());
    EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
    // The failed prompt again: recomputed (or served from blocks of steps that succeeded),
    // with the fresh tokens.
    auto again = engine.AddRequest(test::GreedyRequest(prompt, 16));
    engine.RunUntilIdle();
    const Collected a = Drain(*again, 1);
    ExpectSame(a, fresh[0], "the prompt again");
    if (failing == 0) {
      EXPECT_EQ(a.usage.cached_prompt_tokens, 0);
    }
  }
}

// The engine thread with producers, in async mode: every channel ends exactly once, and no
// block leaks (the soak of engine_test.cc, smaller, with the overlap executor's thread).
TEST_F(EngineAsyncTest, SoakWithEngineThread) {
  EngineConfig config{.num_kv_blocks = 40,
                      .max_num_batched_tokens = 128,
                      .max_num_seqs = 24,
                      .async_scheduling = true};
  Engine engine(std::make_unique<OverlapExecutor>(Cpu(config)), *tokenizer_, config);
  engine.Start();
  const int num_requests = test::Scaled(300, 60);
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
      r.sampling.n = uni(1, 10) == 1 ? 2 : 1;
      if (uni(0, 1)) r.sampling.seed = static_cast<uint64_t>(i);
      if (uni(1, 5) == 1) r.sampling.stop = {"the"};
      if (uni(1, 6) == 1) r.sampling.presence_penalty = 0.5;
      if (uni(1, 4) == 1) r.sampling.logprobs = uni(0, 3);
      if (uni(1, 10) == 1) r.deadline = Clock::now() + std::chrono::milliseconds(uni(0, 30));
      channels[static_cast<size_t>(i)] = engine.AddRequest(r);
      if (uni(1, 10) == 1) engine.Cancel(r.request_id);
    }
  };
  std::thread a(producer, 0, num_requests / 2, 1), b(producer, num_requests / 2, num_requests, 2);
  a.join();
  b.join();
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
  }
  engine.Stop();
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_free_kv_blocks, s.num_kv_blocks);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
}

}  // namespace
}  // namespace llm
