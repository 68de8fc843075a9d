// Structured outputs on the CUDA backend: the engine's grammar requests through CudaExecutor,
// whose device sampler reads each task's Sampler::AllowedTokens (engine/cuda/sampler_io.cc:
// the masks packed into pinned memory, one copy per step, SampleRowParams::mask_row). The
// CPU backend's twin is tests/engine/grammar/grammar_engine_test.cc; the kernel's masking is
// tests/kernels/sampling_mask_gpu_test.cc's. stories260K in bf16, synchronous and async
// scheduling: batched requests with a JSON schema and a regex, n = 3, unconstrained requests
// in the same batches, preemption (a small KV pool) and max_tokens cutting one output short;
// every constrained output is in the grammar's language (finish stop) or a prefix of it
// (finish length). Label gpu: skips with a message when no GPU is present.
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
    // 34 blocks of 16 tokens for 10 sequences of up to ~155 tokens: preemption is certain.
    EngineConfig config{.num_kv_blocks = 34, .max_num_seqs = 10, .async_scheduling = async};
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

}  // namespace
}  // namespace llm
