// Structured outputs through the engine on the CPU backend (stories260K, its SentencePiece
// vocabulary): batched requests, n > 1, preemption and async scheduling all give outputs in
// the grammar's language, with finish reason stop where the grammar completed and length
// where max_tokens cut it short; seeded requests give the same text alone and together.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "engine/engine.h"
#include "engine/grammar/compiler.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using grammar::StructuredSpec;

class GrammarEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const CpuModel& model = test::StoriesModel();
    const Tokenizer& tok = test::StoriesTokenizer();
    compiler_ = new grammar::GrammarCompiler(
        grammar::TokenVocabulary::FromTokenizer(tok, {tok.eos_id()}, model.config().vocab_size));
  }
  static void TearDownTestSuite() { delete compiler_; }

  static std::shared_ptr<const grammar::CompiledGrammar> Compile(StructuredSpec::Kind kind,
                                                                 std::string text) {
    StructuredSpec spec;
    spec.kind = kind;
    spec.text = std::move(text);
    return compiler_->Compile(spec);
  }

  static Request Make(const std::string& prompt, std::shared_ptr<const grammar::CompiledGrammar> g,
                      uint64_t seed, int max_tokens = 200, int n = 1) {
    Request r;
    r.prompt_ids = test::StoriesTokenizer().EncodePrompt(prompt);
    r.sampling.temperature = 1.0;
    r.sampling.seed = seed;
    r.sampling.max_tokens = max_tokens;
    r.sampling.n = n;
    r.sampling.grammar = std::move(g);
    return r;
  }

  static grammar::GrammarCompiler* compiler_;
};
grammar::GrammarCompiler* GrammarEngineTest::compiler_ = nullptr;

struct Collected {
  std::vector<std::string> text;
  std::vector<size_t> num_tokens;
  std::vector<FinishReason> finish;
};

// Reads a channel to its last event (n completions).
Collected Drain(OutputChannel& channel, int n = 1) {
  Collected c;
  c.text.resize(size_t(n));
  c.num_tokens.resize(size_t(n));
  c.finish.resize(size_t(n), FinishReason::kNone);
  RequestOutput out;
  while (channel.Pop(&out, std::chrono::seconds(60))) {
    c.text[size_t(out.index)] += out.text;
    c.num_tokens[size_t(out.index)] += out.token_ids.size();
    if (out.finish_reason != FinishReason::kNone) c.finish[size_t(out.index)] = out.finish_reason;
    if (out.is_last) break;
  }
  return c;
}

bool Accepts(const grammar::CompiledGrammar& g, const std::string& text) {
  const int32_t s = g.NextBytes(g.initial_state(), text);
  return s >= 0 && g.IsAccepting(s);
}

const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":99},
    "pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3}},
    "required":["name","age"],"additionalProperties":false})";

TEST_F(GrammarEngineTest, BatchedPreemptedAndForkedOutputsAreValid) {
  auto schema = Compile(StructuredSpec::Kind::kJsonSchema, kSchema);
  auto regex = Compile(StructuredSpec::Kind::kRegex, "(Tom|Lily) (ran|sat) [a-z]{1,6}\\.");
  for (bool async : {false, true}) {
    // 34 blocks of 16 tokens for 10 sequences of up to ~155 tokens: preemption is certain.
    Engine engine(test::StoriesModel(), test::StoriesTokenizer(),
                  {.num_kv_blocks = 34,
                   .max_num_seqs = 10,
                   .kv_reserve_ratio = 0,  // admit whenever a prompt fits: preemptions
                   .async_scheduling = async});
    std::vector<std::shared_ptr<OutputChannel>> channels;
    std::vector<std::shared_ptr<const grammar::CompiledGrammar>> grammars;
    for (int i = 0; i < 8; ++i) {
      auto g = i % 2 ? regex : schema;
      // Long prompts (~90 tokens) fill the pool; the forked request has a short one.
      std::string prompt = "Once upon a time";
      for (int k = 0; i > 0 && k < 8; ++k) prompt += " there was a little girl who liked to play.";
      channels.push_back(engine.AddRequest(Make(prompt, g, uint64_t(i), 150, i == 0 ? 3 : 1)));
      grammars.push_back(g);
    }
    engine.RunUntilIdle();
    for (size_t i = 0; i < channels.size(); ++i) {
      const int n = i == 0 ? 3 : 1;
      const Collected c = Drain(*channels[i], n);
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(c.finish[size_t(k)], FinishReason::kStop) << c.text[size_t(k)];
        EXPECT_TRUE(Accepts(*grammars[i], c.text[size_t(k)])) << c.text[size_t(k)];
        if (grammars[i] == schema) {
          const auto j = nlohmann::json::parse(c.text[size_t(k)]);
          EXPECT_TRUE(j.contains("name") && j.contains("age")) << c.text[size_t(k)];
        } else {
          EXPECT_TRUE(
              std::regex_match(c.text[size_t(k)], std::regex("(Tom|Lily) (ran|sat) [a-z]{1,6}\\.")))
              << c.text[size_t(k)];
        }
      }
    }
    EXPECT_GT(engine.Stats().num_preemptions, 0) << "async " << async;
    EXPECT_EQ(engine.Stats().num_free_kv_blocks, engine.Stats().num_kv_blocks);
  }
}

TEST_F(GrammarEngineTest, SeededOutputIsTheSameAloneAndInABatch) {
  auto schema = Compile(StructuredSpec::Kind::kJsonSchema, kSchema);
  std::string alone;
  {
    Engine engine(test::StoriesModel(), test::StoriesTokenizer(), {.num_kv_blocks = 64});
    auto ch = engine.AddRequest(Make("The cat", schema, 42));
    engine.RunUntilIdle();
    alone = Drain(*ch).text[0];
  }
  Engine engine(test::StoriesModel(), test::StoriesTokenizer(), {.num_kv_blocks = 64});
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (int i = 0; i < 5; ++i)
    channels.push_back(engine.AddRequest(Make("The cat", schema, i == 2 ? 42 : 100 + i)));
  engine.RunUntilIdle();
  EXPECT_EQ(Drain(*channels[2]).text[0], alone);
}

TEST_F(GrammarEngineTest, MaxTokensCutsAnObjectShortWithLength) {
  auto schema = Compile(StructuredSpec::Kind::kJsonSchema, kSchema);
  Engine engine(test::StoriesModel(), test::StoriesTokenizer(), {.num_kv_blocks = 64});
  auto ch = engine.AddRequest(Make("Once", schema, 1, 3));
  engine.RunUntilIdle();
  const Collected c = Drain(*ch);
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EXPECT_EQ(c.num_tokens[0], 3u);
  EXPECT_EQ(c.text[0].rfind("{", 0), 0u) << c.text[0];
}

}  // namespace
}  // namespace llm
