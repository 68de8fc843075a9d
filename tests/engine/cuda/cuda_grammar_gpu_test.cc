// Structured outputs on the CUDA backend: the engine's grammar requests through CudaExecutor,
// whose device sampler reads each task's Sampler::AllowedTokens (engine/cuda/sampler_io.cc:
// the masks packed into pinned memory, one copy per step, SampleRowParams::mask_row). The
// CPU backend's twin is tests/engine/grammar/grammar_engine_test.cc; the kernel's masking is
// tests/kernels/sampling_mask_gpu_test.cc's. stories260K in bf16, synchronous and async
// scheduling: batched requests with a JSON schema and a regex, n = 3, unconstrained requests
// in the same batches, preemption (a small KV pool) and max_tokens cutting one output short;
// every constrained output is in the grammar's language (finish stop) or a prefix of it
// (finish length). Async scheduling keeps grammar steps in flight and gives the same tokens
// as synchronous scheduling (AsyncMasksGiveTheSameTokensAsSync). Label gpu: skips with a
// message when no GPU is present.
//   ninja -C build cuda_grammar_gpu_test && (cd build && ctest -L gpu -R cuda_grammar)
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "engine/cuda/cuda_executor.h"
#include "engine/engine.h"
#include "engine/grammar/compiler.h"
#include "engine/grammar/matcher.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using grammar::StructuredSpec;

class CudaGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

struct Collected {
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
};

Collected Drain(OutputChannel& channel, int n) {
  Collected c;
  c.text.resize(size_t(n));
  c.finish.resize(size_t(n), FinishReason::kNone);
  RequestOutput out;
  while (channel.Pop(&out, std::chrono::seconds(60))) {
    c.text[size_t(out.index)] += out.text;
    if (out.finish_reason != FinishReason::kNone) c.finish[size_t(out.index)] = out.finish_reason;
    if (out.is_last) break;
  }
  return c;
}

const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":99},
    "pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3}},
    "required":["name","age"],"additionalProperties":false})";
const char* kRegex = "(Tom|Lily) (ran|sat) [a-z]{1,6}\\.";

TEST_F(CudaGrammarTest, OutputsAreInTheLanguageUnderBatchingPreemptionAndAsync) {
  for (bool async : {false, true}) {
    // 34 blocks of 16 tokens for 10 sequences of up to ~155 tokens, admitted whenever a prompt
    // fits (kv_reserve_ratio 0): preemption is certain.
    EngineConfig config{
        .num_kv_blocks = 34, .max_num_seqs = 10, .kv_reserve_ratio = 0, .async_scheduling = async};
    CudaExecutorOptions o;
    o.dtype = DType::kBF16;
    o.block_size = config.block_size;
    o.num_kv_blocks = config.num_kv_blocks;
    o.max_num_batched_tokens = config.max_num_batched_tokens;
    o.max_num_seqs = config.max_num_seqs;
    o.log = false;
    std::unique_ptr<ModelExecutor> ex = CudaExecutor::Create(test::StoriesDir(), o);
    ASSERT_TRUE(ex->applies_token_masks());
    const Tokenizer& tok = test::StoriesTokenizer();
    grammar::GrammarCompiler compiler(
        grammar::TokenVocabulary::FromTokenizer(tok, {tok.eos_id()}, ex->config().vocab_size));
    auto compile = [&](StructuredSpec::Kind kind, const std::string& text) {
      StructuredSpec spec;
      spec.kind = kind;
      spec.text = text;
      return compiler.Compile(spec);
    };
    auto schema = compile(StructuredSpec::Kind::kJsonSchema, kSchema);
    auto regex = compile(StructuredSpec::Kind::kRegex, kRegex);
    Engine engine(std::move(ex), tok, config);

    struct Sent {
      std::shared_ptr<OutputChannel> channel;
      std::shared_ptr<const grammar::CompiledGrammar> grammar;  // null: unconstrained
      int n = 1;
      int max_tokens = 150;
    };
    std::vector<Sent> sent;
    for (int i = 0; i < 10; ++i) {
      Sent s;
      s.grammar = i >= 8 ? nullptr : i % 2 ? regex : schema;
      s.n = i == 0 ? 3 : 1;
      s.max_tokens = i == 3 ? 3 : 150;  // a regex output cut short: a prefix
      // Long prompts (~90 tokens) fill the pool; the forked request has a short one.
      std::string prompt = "Once upon a time";
      for (int k = 0; i > 0 && k < 8; ++k) prompt += " there was a little girl who liked to play.";
      Request r;
      r.prompt_ids = tok.EncodePrompt(prompt);
      r.sampling.temperature = i == 5 ? 0.0 : 1.0;  // one greedy constrained request
      r.sampling.seed = uint64_t(i);
      r.sampling.max_tokens = s.max_tokens;
      r.sampling.n = s.n;
      r.sampling.grammar = s.grammar;
      s.channel = engine.AddRequest(std::move(r));
      sent.push_back(std::move(s));
    }
    engine.RunUntilIdle();
    for (size_t i = 0; i < sent.size(); ++i) {
      const Collected c = Drain(*sent[i].channel, sent[i].n);
      for (int k = 0; k < sent[i].n; ++k) {
        const std::string& text = c.text[size_t(k)];
        const std::string what = "async " + std::to_string(async) + " request " +
                                 std::to_string(i) + "." + std::to_string(k) + ": " + text;
        if (!sent[i].grammar) {
          EXPECT_NE(c.finish[size_t(k)], FinishReason::kNone) << what;
          continue;
        }
        const grammar::CompiledGrammar& g = *sent[i].grammar;
        const int32_t state = g.NextBytes(g.initial_state(), text);
        ASSERT_GE(state, 0) << what << " is not a prefix of the language";
        // The cut request may end in length (a prefix: checked above) or, in as few tokens,
        // complete; every other one completes.
        if (sent[i].max_tokens < 10 && c.finish[size_t(k)] == FinishReason::kLength) continue;
        ASSERT_EQ(c.finish[size_t(k)], FinishReason::kStop) << what;
        EXPECT_TRUE(g.IsAccepting(state)) << what;
        if (sent[i].grammar == schema) {
          const auto j = nlohmann::json::parse(text);
          EXPECT_TRUE(j.contains("name") && j.contains("age")) << what;
        } else {
          EXPECT_TRUE(std::regex_match(text, std::regex(kRegex))) << what;
        }
      }
    }
    EXPECT_GT(engine.Stats().num_preemptions, 0) << "async " << async;
    EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);
  }
}

// Counts, at each Wait, whether the engine had launched the next step already (the engine's
// async scheduling kept a step in flight instead of waiting for its tokens first).
class OverlapCounter final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  StepHandle Launch(const ForwardBatch& batch, std::span<const SampleTask> tasks) override {
    const StepHandle h = inner().Launch(batch, tasks);
    ++num_launched;
    return h;
  }
  std::vector<SampleResult> Wait(StepHandle step) override {
    if (num_launched > num_waits + 1) ++num_waits_after_next_launch;
    ++num_waits;
    return inner().Wait(step);
  }
  int64_t num_launched = 0, num_waits = 0, num_waits_after_next_launch = 0;
};

// The overlap of engine/cuda/step_runner.cc's Launch: a grammar step N+1 is launched with N in
// flight, N's tokens are read into the matchers after N+1's forward is enqueued, and N+1's
// masks are computed and copied then. Seeded and greedy grammar requests, with unconstrained
// and penalized (synchronous fallback) requests in the same batches, give exactly the tokens
// of synchronous scheduling. ignore_eos keeps every request to its max_tokens (past the
// grammar's end only EOS is allowed), so both modes run the same batches and the bf16 logits
// are the same bits.
TEST_F(CudaGrammarTest, AsyncMasksGiveTheSameTokensAsSync) {
  std::vector<std::vector<int>> tokens[2];
  int64_t num_waits = 0, num_after = 0;
  for (bool async : {false, true}) {
    EngineConfig config{.num_kv_blocks = 128, .max_num_seqs = 12, .async_scheduling = async};
    config.batch_invariant = false;  // as the server runs the GPU: decode steps replay graphs
    CudaExecutorOptions o;
    o.dtype = DType::kBF16;
    o.block_size = config.block_size;
    o.num_kv_blocks = config.num_kv_blocks;
    o.max_num_batched_tokens = config.max_num_batched_tokens;
    o.max_num_seqs = config.max_num_seqs;
    o.log = false;
    auto counter = std::make_unique<OverlapCounter>(CudaExecutor::Create(test::StoriesDir(), o));
    OverlapCounter* count = counter.get();
    const Tokenizer& tok = test::StoriesTokenizer();
    grammar::GrammarCompiler compiler(
        grammar::TokenVocabulary::FromTokenizer(tok, {tok.eos_id()}, counter->config().vocab_size));
    auto compile = [&](StructuredSpec::Kind kind, const std::string& text) {
      StructuredSpec spec;
      spec.kind = kind;
      spec.text = text;
      return compiler.Compile(spec);
    };
    auto schema = compile(StructuredSpec::Kind::kJsonSchema, kSchema);
    auto regex = compile(StructuredSpec::Kind::kRegex, kRegex);
    Engine engine(std::move(counter), tok, config);
    std::vector<std::shared_ptr<OutputChannel>> channels;
    for (int i = 0; i < 12; ++i) {
      Request r;
      r.prompt_ids = tok.EncodePrompt(i % 3 ? "Once upon a time" : "Lily and Ben went to the");
      r.sampling.temperature = i == 5 ? 0.0 : 1.0;
      r.sampling.seed = uint64_t(40 + i);
      r.sampling.max_tokens = 20 + 4 * i;
      r.sampling.ignore_eos = true;
      if (i < 9) r.sampling.grammar = i % 2 ? regex : schema;
      if (i == 0) r.sampling.presence_penalty = 0.5;  // (a grammar request too)
      channels.push_back(engine.AddRequest(std::move(r)));
    }
    engine.RunUntilIdle();
    for (int i = 0; i < 12; ++i) {
      std::vector<int> ids;
      RequestOutput out;
      while (channels[size_t(i)]->TryPop(&out)) {
        EXPECT_TRUE(out.error.empty()) << out.error;
        ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
      }
      EXPECT_EQ(std::ssize(ids), 20 + 4 * i) << "async " << async << " request " << i;
      tokens[async].push_back(std::move(ids));
    }
    if (async) {
      num_waits = count->num_waits;
      num_after = count->num_waits_after_next_launch;
    }
  }
  for (size_t i = 0; i < tokens[0].size(); ++i) {
    EXPECT_EQ(tokens[1][i], tokens[0][i]) << "request " << i;
  }
  // While the penalized request (0, 20 tokens) runs, each step waits for the one before it;
  // after it, the grammar requests (to 52 tokens) and the rest keep one step in flight.
  EXPECT_GE(num_waits, 64);
  EXPECT_GE(num_after, 40) << num_waits << " waits";
  std::printf("[cuda grammar] async: %lld of %lld waits found the next step launched\n",
              (long long)num_after, (long long)num_waits);
}

}  // namespace
}  // namespace llm
