// StructuredSpec::reasoning: a reasoning model's <think> block before the structured output,
// through GrammarCompiler (and the tokens <think> / </think> whole, as Qwen3 has them).
#include <gtest/gtest.h>

#include "engine/grammar/compiler.h"

namespace llm::grammar {
namespace {

using Reasoning = StructuredSpec::Reasoning;

// Every byte, <think> and </think> as tokens, EOS (0).
std::shared_ptr<const TokenVocabulary> Vocab() {
  std::vector<std::optional<std::string>> bytes = {std::nullopt};
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back("<think>");   // 257
  bytes.push_back("</think>");  // 258
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int>{0},
                                                 int64_t(300));
}

bool Accepts(const CompiledGrammar& g, std::string_view text) {
  const int32_t s = g.NextBytes(g.initial_state(), text);
  return s >= 0 && g.IsAccepting(s);
}

std::shared_ptr<const CompiledGrammar> Regex(Reasoning r) {
  GrammarCompiler compiler(Vocab());
  StructuredSpec spec;
  spec.kind = StructuredSpec::Kind::kRegex;
  spec.text = "[0-9]{2}";
  spec.reasoning = r;
  return compiler.Compile(spec);
}

TEST(ReasoningGrammar, OptionalThinkBlock) {
  const auto g = Regex(Reasoning::kOptional);
  EXPECT_TRUE(Accepts(*g, "42"));
  EXPECT_TRUE(Accepts(*g, "<think>let me see: 4 < 5, </thin> a <b></think>\n\n42"));
  EXPECT_TRUE(Accepts(*g, "<think></think>42"));
  EXPECT_TRUE(Accepts(*g, "<think><<</</th</think>  \n 42"));
  EXPECT_FALSE(Accepts(*g, "<think>a</think>b</think>42"));  // the block ends at </think>
  EXPECT_FALSE(Accepts(*g, "<think>unfinished 42"));
  EXPECT_FALSE(Accepts(*g, "x<think></think>42"));
  EXPECT_FALSE(Accepts(*g, "<think>a</think>\n\n\n\n\n42"));  // at most 4 spaces / newlines
  EXPECT_FALSE(Accepts(*g, "<think>a</think>"));
}

TEST(ReasoningGrammar, InsideThinkBlock) {
  const auto g = Regex(Reasoning::kInside);
  EXPECT_TRUE(Accepts(*g, "thinking <think> still</think>42"));
  EXPECT_TRUE(Accepts(*g, "</think>\n42"));
  EXPECT_FALSE(Accepts(*g, "42"));  // the block must end first
  EXPECT_FALSE(Accepts(*g, "a</think>b</think>42"));
}

TEST(ReasoningGrammar, MasksAllowTheTagTokens) {
  const auto g = Regex(Reasoning::kOptional);
  Matcher m(g);
  auto bit = [&](int id) { return (m.AllowedTokens()[id / 32] >> (id % 32)) & 1u; };
  EXPECT_TRUE(bit(257));      // <think> may start the text
  EXPECT_FALSE(bit(258));     // </think> may not
  EXPECT_TRUE(bit(1 + '4'));  // nor must the digits wait
  EXPECT_FALSE(bit(0));       // EOS only at the end
  ASSERT_TRUE(m.Accept(257));
  EXPECT_TRUE(bit(1 + 'x'));  // any text in the block
  EXPECT_TRUE(bit(257));      // <think> is text there
  EXPECT_TRUE(bit(258));
  EXPECT_FALSE(bit(0));
  ASSERT_TRUE(m.Accept(1 + 'x'));
  ASSERT_TRUE(m.Accept(258));
  EXPECT_FALSE(bit(258));
  EXPECT_FALSE(bit(1 + 'x'));
  ASSERT_TRUE(m.Accept(1 + '\n'));
  ASSERT_TRUE(m.Accept(1 + '4'));
  ASSERT_TRUE(m.Accept(1 + '2'));
  EXPECT_TRUE(bit(0));
  // With and without the block, specs are cached apart.
  StructuredSpec a, b;
  b.reasoning = Reasoning::kOptional;
  EXPECT_NE(a.Key(), b.Key());
}

}  // namespace
}  // namespace llm::grammar
