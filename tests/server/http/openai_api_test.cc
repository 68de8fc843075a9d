// Request parsing of the OpenAI API (server/http/openai_api.h) without a server: the inputs that
// the fuzzer (tests/fuzz/openai_request_fuzz.cc) found, each embedded as it was found.
#include "server/http/openai_api.h"

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <memory>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "server/http/http_server.h"
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

  // The ApiError that ParseChatBody throws for `body_text` (its renderer answers "hi").
  static ApiError ChatError(const std::string& body_text) {
    try {
      ParseChatBody(
          body_text, json::parse(body_text), [](const ChatInputs&) { return std::string("hi"); },
          *tokenizer_, model_);
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
  const ChatRenderer chat = [](const ChatInputs&) { return "hi"; };
  try {
    ParseChatBody(body_text, json::parse(body_text), chat, *tokenizer_, model_);
    ADD_FAILURE() << "no ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "add_generation_prompt");
  }
}

// chat_template_kwargs (an object, as vLLM accepts it) and tools reach the template as
// variables, keys in the client's order; the kwargs override the special tokens.
TEST_F(OpenAiApiTest, ChatTemplateKwargsAndToolsAreTemplateVariables) {
  const std::string body_text = R"({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
      "chat_template_kwargs": {"enable_thinking": false, "bos_token": "<B>"}})";
  ChatInputs seen;
  const ChatRenderer capture = [&seen](const ChatInputs& inputs) {
    seen = inputs;
    return std::string("hi");
  };
  ParseChatBody(body_text, json::parse(body_text), capture, *tokenizer_, model_);
  EXPECT_EQ(seen.messages.dump(), R"([{"role":"user","content":"hi"}])");
  EXPECT_TRUE(seen.add_generation_prompt);
  EXPECT_EQ(seen.variables.dump(),
            R"({"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],)"
            R"("enable_thinking":false,"bos_token":"<B>"})");

  // Through a model folder's template, as the server renders it.
  test::TempDir dir;
  const json config = {
      {"chat_template",
       "{{ bos_token }}{% if enable_thinking is defined and enable_thinking is false %}<no-think>"
       "{% endif %}{% for t in tools or [] %}{{ t.function.name }}"
       "{{ t.function.parameters|tojson }}{% endfor %}{{ messages[0].content }}"
       "{{ '|gen' if add_generation_prompt }}"}};
  test::WriteFile(dir.path() / "tokenizer_config.json", config.dump());
  const ChatRenderer chat = MakeChatRenderer(dir.path().string(), *tokenizer_);
  EXPECT_EQ(chat(seen), "<B><no-think>f{\"b\": 1, \"a\": 2}hi|gen");
  // Without them: tools is none, bos_token the tokenizer's.
  EXPECT_EQ(chat(ChatInputs{seen.messages, false, nlohmann::ordered_json::object()}), "<s>hi");
}

// A chat_template_kwargs that is not an object, one that sets messages, and tools that are not
// a list of objects are a 400 naming the parameter, in OpenAI's error shape.
TEST_F(OpenAiApiTest, BadChatTemplateKwargsOrToolsAreA400) {
  const std::string messages = R"({"messages": [{"role": "user", "content": "hi"}], )";
  for (const char* kwargs : {"[]", "\"x\"", "1", "true", "[{\"a\": 1}]", R"({"messages": []})"}) {
    SCOPED_TRACE(kwargs);
    const ApiError e = ChatError(messages + R"("chat_template_kwargs": )" + kwargs + "}");
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "chat_template_kwargs");
    const json body = ErrorBody(e);
    EXPECT_EQ(body["error"]["param"], "chat_template_kwargs");
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["code"], "invalid_parameter");
    EXPECT_NE(body["error"]["message"].get<std::string>().find("chat_template_kwargs"),
              std::string::npos);
  }
  for (const char* tools : {"{}", "\"f\"", "[1]", "[[]]"}) {
    SCOPED_TRACE(tools);
    EXPECT_EQ(ChatError(messages + R"("tools": )" + tools + "}").param, "tools");
  }
  // null is the field left out.
  const std::string ok = messages + R"("chat_template_kwargs": null, "tools": null})";
  EXPECT_NO_THROW(ParseChatBody(
      ok, json::parse(ok),
      [](const ChatInputs& in) {
        EXPECT_TRUE(in.variables.empty());
        return std::string("hi");
      },
      *tokenizer_, model_));
}

// Tools: each malformed field is a 400 naming it; what is asked of the output reaches
// ParsedRequest::chat_output, past calls' arguments reach the template as objects.
TEST_F(OpenAiApiTest, ToolsAndToolChoice) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::string tool = R"({"type": "function", "function": {"name": "f"}})";
  EXPECT_EQ(ChatError("{" + msgs + R"(, "tools": {}})").param, "tools");
  EXPECT_EQ(ChatError("{" + msgs + R"(, "tools": [{"type": "code"}]})").param, "tools[0].type");
  EXPECT_EQ(ChatError("{" + msgs + R"(, "tools": [{"type": 3}]})").param, "tools[0].type");
  EXPECT_EQ(ChatError("{" + msgs +
                      R"(, "tools": [{"type": "function", "function": {"name": "f", )"
                      R"("strict": "yes"}}]})")
                .param,
            "tools[0].function.strict");
  EXPECT_EQ(ChatError("{" + msgs + R"(, "tools": [{"function": {"name": ""}}]})").param,
            "tools[0].function.name");
  EXPECT_EQ(ChatError("{" + msgs + ", \"tools\": [" + tool + R"(], "tool_choice": "maybe"})").param,
            "tool_choice");
  EXPECT_EQ(ChatError("{" + msgs + ", \"tools\": [" + tool +
                      R"(], "tool_choice": {"type": "function", "function": {"name": "g"}}})")
                .param,
            "tool_choice");
  EXPECT_EQ(ChatError("{" + msgs + R"(, "tool_choice": "required"})").param, "tool_choice");
  EXPECT_EQ(
      ChatError("{" + msgs + ", \"tools\": [" + tool + R"(], "parallel_tool_calls": 1})").param,
      "parallel_tool_calls");
  // No grammar compiler here: a forced call cannot be made.
  EXPECT_EQ(
      ChatError("{" + msgs + ", \"tools\": [" + tool + R"(], "tool_choice": "required"})").param,
      "tool_choice");

  ModelInfo model = model_;
  model.tool_format = chat::ToolFormat::kHermes;
  model.reasoning = true;
  nlohmann::ordered_json seen;
  auto parse = [&](const std::string& text) {
    return ParseChatBody(
        text, json::parse(text),
        [&](const ChatInputs& in) {
          seen = in.messages;
          return std::string("<|im_start|>assistant\n<think>\n");
        },
        *tokenizer_, model);
  };
  ParsedRequest auto_tools = parse("{" + msgs + ", \"tools\": [" + tool + "]}");
  EXPECT_EQ(auto_tools.chat_output.tools, chat::ToolFormat::kHermes);
  EXPECT_FALSE(auto_tools.chat_output.forced_tools);
  EXPECT_TRUE(auto_tools.chat_output.starts_in_reasoning);  // the prompt left <think> open
  EXPECT_FALSE(auto_tools.request.sampling.grammar);
  ParsedRequest none = parse("{" + msgs + ", \"tools\": [" + tool + R"(], "tool_choice": "none"})");
  EXPECT_EQ(none.chat_output.tools, chat::ToolFormat::kNone);
  ParsedRequest no_tools = parse("{" + msgs + "}");
  EXPECT_EQ(no_tools.chat_output.tools, chat::ToolFormat::kNone);
  EXPECT_TRUE(no_tools.chat_output.reasoning);
  parse(R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", )"
        R"("type": "function", "function": {"name": "f", "arguments": "{\"a\": [1]}"}}]}]})");
  EXPECT_EQ(seen[0]["content"], "");
  EXPECT_EQ(seen[0]["tool_calls"][0]["function"]["arguments"]["a"][0], 1);
}

// Forced calls with a grammar compiler: strict null is false, parameters that are not an
// object are a 400, and the compiled grammar is the request's.
TEST_F(OpenAiApiTest, ForcedToolCallsCompile) {
  ModelInfo model = model_;
  model.grammars =
      std::make_shared<grammar::GrammarCompiler>(grammar::TokenVocabulary::FromTokenizer(
          *tokenizer_, {tokenizer_->eos_id()}, tokenizer_->vocab_size()));
  model.tool_format = chat::ToolFormat::kHermes;
  auto parse = [&](const std::string& text) {
    return ParseChatBody(
        text, json::parse(text), [](const ChatInputs&) { return std::string("hi"); }, *tokenizer_,
        model);
  };
  const std::string head = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [)";
  const ParsedRequest p = parse(head + R"({"type": "function", "function": {"name": "f", )"
                                       R"("strict": null}}], "tool_choice": "required"})");
  EXPECT_TRUE(p.request.sampling.grammar);
  EXPECT_TRUE(p.chat_output.forced_tools);
  EXPECT_EQ(p.chat_output.tool_names, std::vector<std::string>{"f"});
  try {
    parse(head + R"({"type": "function", "function": {"name": "f", "parameters": )"
                 R"({"type": "string"}}}], "tool_choice": "required"})");
    ADD_FAILURE() << "string parameters were accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools");
    EXPECT_NE(e.message.find("must describe an object"), std::string::npos) << e.message;
  }
}

// Bodies nested beyond kMaxJsonDepth are refused before they are parsed (copying or printing
// 200,000 levels overflowed the stack: the server died).
TEST(JsonBodyTest, DeepNestingIsRefused) {
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": "[[[{{{"}], "c": "\\\"["})"), 3u);
  const std::string deep = "{\"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_TRUE(ParseJsonBody(deep).is_discarded());
  const std::string ok = "{\"x\": " + std::string(500, '[') + std::string(500, ']') + "}";
  EXPECT_TRUE(ParseJsonBody(ok).is_object());
}

}  // namespace
}  // namespace llm::server
