// Request parsing of the OpenAI API (server/http/openai_api.h) without a server: the inputs that
// the fuzzer (tests/fuzz/openai_request_fuzz.cc) found, each embedded as it was found.
#include "server/http/openai_api.h"

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <memory>

#include "engine/error.h"
#include "tests/test_util.h"

namespace llm::server {
namespace {

using nlohmann::json;

class OpenAiApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ =
        Tokenizer::FromFile((test::SharedDir() / "models/stories260K/tokenizer.model").string())
            .release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  // The ApiError that parsing `body_text` throws (a test failure when it succeeds or throws
  // anything else).
  static ApiError CompletionError(const std::string& body_text) {
    try {
      ParseCompletion(json::parse(body_text), *tokenizer_, model_);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "no ApiError for " << body_text;
    return {};
  }

  static Tokenizer* tokenizer_;
  static inline const ModelInfo model_{"stories260K", 512, 512};
};

Tokenizer* OpenAiApiTest::tokenizer_ = nullptr;

// Fuzzer: crash-d79e54fe (UBSan: 1e+40 is outside the range of representable values of type
// 'long' in Fields::Int).
TEST_F(OpenAiApiTest, HugeFloatIntegerIsAnError) {
  const ApiError e = CompletionError(
      R"({"prompt": "Hel{o", "max_tokens": 9999999999999999999999999999999999999924})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(CompletionError(R"({"prompt": "a", "top_k": -1e300})").param, "top_k");
  EXPECT_EQ(CompletionError(R"({"prompt": "a", "n": 1.5})").param, "n");
}

// Integers beyond int were wrapped: max_tokens 2^32 + 1 became 1, a logit_bias or stop
// token id 2^32 + 13 became token 13. Now they are out of range.
TEST_F(OpenAiApiTest, IntegersBeyondIntAreNotWrapped) {
  EXPECT_EQ(CompletionError(R"({"prompt": "a", "max_tokens": 4294967297})").param, "max_tokens");
  EXPECT_EQ(CompletionError(R"({"prompt": "a", "n": 4294967297})").param, "n");
  EXPECT_EQ(CompletionError(R"({"prompt": "a", "logit_bias": {"4294967309": 5}})").param,
            "logit_bias");
  EXPECT_EQ(CompletionError(R"({"prompt": "a", "stop_token_ids": [4294967309]})").param,
            "stop_token_ids");
  const ParsedRequest ok =
      ParseCompletion(json::parse(R"({"prompt": "a", "max_tokens": 4.0, "logit_bias": {"13": 5}})"),
                      *tokenizer_, model_);
  EXPECT_EQ(ok.request.sampling.max_tokens, 4);
  EXPECT_EQ(ok.request.sampling.logit_bias.at(13), 5.0f);
}

// UBSan in the deadline: a timeout of 1e300 seconds overflowed the conversion to ticks.
TEST_F(OpenAiApiTest, HugeTimeoutIsCapped) {
  const ParsedRequest parsed =
      ParseCompletion(json::parse(R"({"prompt": "a", "timeout": 1e300})"), *tokenizer_, model_);
  ASSERT_TRUE(parsed.request.deadline.has_value());
  EXPECT_GT(*parsed.request.deadline, Clock::now() + std::chrono::hours(24 * 365));
}

// Found by running the fuzz target on a seed: a non-boolean add_generation_prompt threw
// nlohmann's type_error (json::value), which the server answered with a 500.
TEST_F(OpenAiApiTest, NonBooleanAddGenerationPromptIsAnApiError) {
  const std::string body_text =
      R"({"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":1})";
  const ChatRenderer chat = [](const nlohmann::ordered_json&, bool) { return "hi"; };
  try {
    ParseChatBody(body_text, json::parse(body_text), chat, *tokenizer_, model_);
    ADD_FAILURE() << "no ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "add_generation_prompt");
  }
}

}  // namespace
}  // namespace llm::server
