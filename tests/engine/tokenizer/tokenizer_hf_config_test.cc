// tokenizer_config.json beside a tokenizer.json: which special tokens a prompt gets
// (the post-processor, or add_bos_token / add_eos_token for Llama and Gemma classes, as
// transformers rebuilds their post-processor), the special tokens' ids, and
// clean_up_tokenization_spaces (transformers' clean_up_tokenization).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

// A folder with `name`'s tokenizer.json and the given tokenizer_config.json.
std::unique_ptr<Tokenizer> WithConfig(const test::TempDir& dir, const std::string& name,
                                      const nlohmann::json& config) {
  fs::copy_file(test::LenmlModelDir(name) / "tokenizer.json", dir.path() / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir.path() / "tokenizer_config.json") << config.dump();
  return Tokenizer::Load(dir.path().string());
}

class HfConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (test::HfNpmDir(&why).empty()) GTEST_SKIP() << why;
  }
};

TEST_F(HfConfig, RealConfigsGiveTheirSpecialTokens) {
  auto llama = Tokenizer::Load(test::LenmlModelDir("llama3_2").string());
  EXPECT_TRUE(llama->is_hugging_face());
  EXPECT_EQ(llama->bos_id(), 128000);
  EXPECT_EQ(llama->eos_id(), 128009);                    // <|eot_id|>
  EXPECT_EQ(llama->EncodePrompt("hi").front(), 128000);  // its TemplateProcessing
  auto qwen = Tokenizer::Load(test::LenmlModelDir("qwen3").string());
  EXPECT_EQ(qwen->bos_id(), -1);
  EXPECT_EQ(qwen->eos_id(), qwen->PieceToId("<|im_end|>"));
  EXPECT_EQ(qwen->EncodePrompt("hi"), qwen->Encode("hi"));  // no BOS
  // DeepSeek-V3: LlamaTokenizerFast with add_bos_token: BOS although its post-processor adds none.
  auto deepseek = Tokenizer::Load(test::LenmlModelDir("deepseek_v3").string());
  std::vector<int> expected = {deepseek->bos_id()};
  for (int id : deepseek->Encode("hi")) expected.push_back(id);
  EXPECT_EQ(deepseek->EncodePrompt("hi"), expected);
  EXPECT_EQ(deepseek->Encode("hi"),
            Tokenizer::FromFile((test::LenmlModelDir("deepseek_v3") / "tokenizer.json").string())
                ->EncodePrompt("hi"));
}

TEST_F(HfConfig, LlamaClassFlagsDecideBosAndEos) {
  test::TempDir dir;
  auto t = WithConfig(dir, "qwen3",
                      {{"tokenizer_class", "LlamaTokenizerFast"},
                       {"add_bos_token", true},
                       {"add_eos_token", true},
                       {"bos_token", "<|endoftext|>"},
                       {"eos_token", "<|im_end|>"}});
  const std::vector<int> body = t->Encode("hi there");
  std::vector<int> expected = {t->PieceToId("<|endoftext|>")};
  expected.insert(expected.end(), body.begin(), body.end());
  expected.push_back(t->PieceToId("<|im_end|>"));
  EXPECT_EQ(t->EncodePrompt("hi there"), expected);
  // Another class: the post-processor decides (Qwen3's adds nothing), whatever the flags say.
  test::TempDir other;
  auto q = WithConfig(other, "qwen3",
                      {{"tokenizer_class", "Qwen2Tokenizer"},
                       {"add_bos_token", true},
                       {"bos_token", "<|endoftext|>"}});
  EXPECT_EQ(q->EncodePrompt("hi there"), body);
}

TEST_F(HfConfig, AConfigTokenMissingFromTheVocabularyIsAnErrorNamingIt) {
  test::TempDir dir;
  try {
    WithConfig(dir, "qwen3", {{"eos_token", {{"content", "<no such token>"}}}});
    FAIL() << "loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tokenizer_config.json"), std::string::npos) << message;
    EXPECT_NE(message.find("eos_token"), std::string::npos) << message;
    EXPECT_NE(message.find("<no such token>"), std::string::npos) << message;
  }
}

TEST_F(HfConfig, CleanUpTokenizationSpacesAsTransformersDoes) {
  test::TempDir on, off;
  auto cleaned = WithConfig(on, "llama3", {{"clean_up_tokenization_spaces", true}});
  auto kept = WithConfig(off, "llama3", {{"clean_up_tokenization_spaces", false}});
  const std::string text =
      "Hello , world . Is it ? Yes ! I do n't , they 're , we 've , I 'm , 's ' x";
  EXPECT_EQ(cleaned->CleanUpSpaces(text),
            "Hello, world. Is it? Yes! I don't, they're, we've, I'm,'s'x");
  EXPECT_EQ(kept->CleanUpSpaces(text), text);
}

}  // namespace
}  // namespace llm
