// ChatOutputParser: reasoning, content and tool calls out of a chat model's text, in each
// family's format, the same however the text is cut into pieces.
#include "engine/chat/chat_output.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

namespace llm::chat {
namespace {

struct Call {
  std::string id, name, arguments;
  bool operator==(const Call&) const = default;
};

struct Result {
  std::string reasoning, content;
  std::vector<Call> calls;
  int first_delta_with_name = 0;  // calls whose first delta carried id and name
};

// Feeds `text` in pieces of `piece` bytes (0: whole) and adds up the deltas as a client does.
Result Parse(const ChatOutputOptions& options, std::string_view text, size_t piece = 0) {
  ChatOutputParser parser(options);
  ChatDelta sum;
  std::map<int, Call> calls;
  Result r;
  auto take = [&](ChatDelta d) {
    for (const ToolCallDelta& t : d.tool_calls) {
      if (!calls.count(t.index)) {
        EXPECT_FALSE(t.id.empty()) << "a call's first delta carries its id";
        EXPECT_FALSE(t.name.empty()) << "a call's first delta carries its name";
        ++r.first_delta_with_name;
        calls[t.index] = {t.id, t.name, ""};
      } else {
        EXPECT_TRUE(t.name.empty());
      }
      calls[t.index].arguments += t.arguments;
    }
    r.reasoning += d.reasoning;
    r.content += d.content;
  };
  if (piece == 0) piece = text.size() + 1;
  for (size_t at = 0; at < text.size(); at += piece) take(parser.Feed(text.substr(at, piece)));
  take(parser.Finish());
  for (auto& [index, call] : calls) r.calls.push_back(call);
  EXPECT_EQ(parser.num_tool_calls(), std::ssize(r.calls));
  return r;
}

// The whole text and every piece size up to 9 bytes give the same result.
Result ParseEveryWay(const ChatOutputOptions& options, std::string_view text) {
  const Result whole = Parse(options, text);
  for (size_t piece = 1; piece <= 9; ++piece) {
    const Result r = Parse(options, text, piece);
    EXPECT_EQ(r.reasoning, whole.reasoning) << "piece " << piece;
    EXPECT_EQ(r.content, whole.content) << "piece " << piece;
    EXPECT_EQ(r.calls, whole.calls) << "piece " << piece;
  }
  return whole;
}

ChatOutputOptions Tools(ToolFormat format) {
  ChatOutputOptions o;
  o.tools = format;
  o.id_prefix = "call_x";
  return o;
}

TEST(ChatOutputTest, HermesCallsAfterContent) {
  const Result r = ParseEveryWay(
      Tools(ToolFormat::kHermes),
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0],
            (Call{"call_x0", "get_weather", "{\"city\": \"Paris\", \"days\": [1, 2]}"}));
  EXPECT_EQ(r.calls[1], (Call{"call_x1", "get_time", "{}"}));
}

TEST(ChatOutputTest, ArgumentsStreamInFragments) {
  ChatOutputParser parser(Tools(ToolFormat::kHermes));
  ChatDelta d = parser.Feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\": ");
  d = parser.Feed("12");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "12");
  EXPECT_TRUE(d.tool_calls[0].name.empty());
  d = parser.Feed("}}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "}");
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(ChatOutputTest, HermesArgumentsBeforeNameAndAsString) {
  Result r = ParseEveryWay(Tools(ToolFormat::kHermes),
                           "<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"f\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{"call_x0", "f", "{\"x\": 1}"}));
  r = ParseEveryWay(Tools(ToolFormat::kHermes),
                    "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 2}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"x\": 2}");
}

TEST(ChatOutputTest, OtherKeysAndStringArguments) {
  // Keys a call does not know are skipped once it has a name; nothing else is lost.
  Result r = ParseEveryWay(Tools(ToolFormat::kHermes),
                           "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"x\": [1, {}]}"
                           "</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.content, "");
  // Arguments as a string: its text when that is JSON, else the JSON string itself.
  r = ParseEveryWay(Tools(ToolFormat::kHermes),
                    "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "\"not json\"");
  // A list item that is not a call is text again, with its separator.
  r = ParseEveryWay(Tools(ToolFormat::kMistral), "[TOOL_CALLS][{\"name\": \"a\"}, 5]");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, ", 5]");
}

TEST(ChatOutputTest, NotACallStaysText) {
  for (const char* text :
       {"a <tool_call> b", "<tool_call>{\"city\": \"Paris\"}</tool_call> done",
        "use <tool_call > tags", "<tool_call>{\"name\": 3}</tool_call>", "x <tool_cal"}) {
    const Result r = ParseEveryWay(Tools(ToolFormat::kHermes), text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ChatOutputTest, CutShortCallKeepsItsArguments) {
  const Result r = ParseEveryWay(Tools(ToolFormat::kHermes),
                                 "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": [1, 2");
  EXPECT_EQ(r.content, "");
  // Before its name, an unfinished block is text.
  const Result t = ParseEveryWay(Tools(ToolFormat::kHermes), "ok <tool_call>\n{\"na");
  EXPECT_TRUE(t.calls.empty());
  EXPECT_EQ(t.content, "ok <tool_call>\n{\"na");
}

TEST(ChatOutputTest, Llama3JsonCalls) {
  Result r = ParseEveryWay(Tools(ToolFormat::kLlama3Json),
                           " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; "
                           "{\"type\": \"function\", \"name\": \"g\", \"parameters\": {}}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{"call_x0", "get_weather", "{\"city\": \"Oslo\"}"}));
  EXPECT_EQ(r.calls[1], (Call{"call_x1", "g", "{}"}));
  EXPECT_EQ(r.content, "");
  r = ParseEveryWay(Tools(ToolFormat::kLlama3Json),
                    "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"n\": -1.5e3}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"n\": -1.5e3}");
  // JSON that is not a call (no arguments: a JSON answer with a "name"), and text, stay content.
  for (const char* text : {"{\"answer\": 42}", "The answer is {\"name\": 1}.", "Hello there",
                           "{\"name\": \"Bob\", \"id\": 3}", "{\"name\": \"x\"} and more"}) {
    r = ParseEveryWay(Tools(ToolFormat::kLlama3Json), text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // With the request's tool names, only those are calls.
  ChatOutputOptions named = Tools(ToolFormat::kLlama3Json);
  named.tool_names = {"get_weather"};
  r = ParseEveryWay(named, "{\"name\": \"Bob\", \"parameters\": {}}");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "{\"name\": \"Bob\", \"parameters\": {}}");
  r = ParseEveryWay(named, "{\"name\": \"get_weather\", \"parameters\": {\"c\": 1}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"c\": 1}");
}

TEST(ChatOutputTest, MistralCalls) {
  Result r = ParseEveryWay(
      Tools(ToolFormat::kMistral),
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": \"]\"}}, {\"name\": \"b\", "
      "\"arguments\": {}}]");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{"call_x0", "a", "{\"x\": \"]\"}"}));
  EXPECT_EQ(r.calls[1], (Call{"call_x1", "b", "{}"}));
  EXPECT_EQ(r.content, "");
  r = ParseEveryWay(Tools(ToolFormat::kMistral),
                    "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]f[ARGS]{}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{"call_x0", "get_weather", "{\"city\": \"Rome\"}"}));
  EXPECT_EQ(r.calls[1], (Call{"call_x1", "f", "{}"}));
  ChatOutputOptions nine = Tools(ToolFormat::kMistral);
  nine.id_prefix = "abcdef";
  nine.id_digits = 3;  // Mistral's ids: 9 letters and digits, also past call 9
  std::string many = "[TOOL_CALLS][";
  for (int i = 0; i < 12; ++i) many += std::string(i ? ", " : "") + "{\"name\": \"f\"}";
  r = Parse(nine, many + "]");
  ASSERT_EQ(r.calls.size(), 12u);
  EXPECT_EQ(r.calls[0].id, "abcdef000");
  EXPECT_EQ(r.calls[11].id, "abcdef011");
  ChatOutputOptions forced = Tools(ToolFormat::kMistral);
  forced.forced_tools = true;  // the grammar writes the list without the marker
  r = ParseEveryWay(forced, "[{\"name\": \"a\", \"arguments\": {\"k\": true}}]");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"k\": true}");
  // Cut short before the next call's name: nothing of it is content.
  r = ParseEveryWay(forced, "[{\"name\": \"a\", \"arguments\": {}}, {\"na");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  r = ParseEveryWay(Tools(ToolFormat::kMistral), "No tools [TOOL_CALL here");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "No tools [TOOL_CALL here");
}

ChatOutputOptions Reasoning(bool starts_inside, ToolFormat tools = ToolFormat::kNone) {
  ChatOutputOptions o = Tools(tools);
  o.reasoning = true;
  o.starts_in_reasoning = starts_inside;
  return o;
}

TEST(ChatOutputTest, Reasoning) {
  Result r = ParseEveryWay(Reasoning(false), "<think>\nI think.\n</think>\n\nHello!");
  EXPECT_EQ(r.reasoning, "\nI think.\n");
  EXPECT_EQ(r.content, "Hello!");
  // A template that pre-filled <think>: only the closing tag comes.
  r = ParseEveryWay(Reasoning(true), "Hmm </thin> no.</think>Answer");
  EXPECT_EQ(r.reasoning, "Hmm </thin> no.");
  EXPECT_EQ(r.content, "Answer");
  // No <think> at the start: all content (Qwen3 with enable_thinking false).
  r = ParseEveryWay(Reasoning(false), "  Plain <think> answer");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "  Plain <think> answer");
  // Cut short inside the reasoning: all reasoning.
  r = ParseEveryWay(Reasoning(false), "<think>still going </thi");
  EXPECT_EQ(r.reasoning, "still going </thi");
  EXPECT_EQ(r.content, "");
  r = ParseEveryWay(Reasoning(false), "<thi");
  EXPECT_EQ(r.content, "<thi");
}

TEST(ChatOutputTest, ToolCallsInsideAndAfterThinking) {
  const char* call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n</tool_call>";
  Result r = ParseEveryWay(Reasoning(false, ToolFormat::kHermes),
                           std::string("<think>Use f.</think>\n\n") + call);
  EXPECT_EQ(r.reasoning, "Use f.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{"call_x0", "f", "{\"q\": 1}"}));
  r = ParseEveryWay(Reasoning(true, ToolFormat::kHermes),
                    std::string("Call it. ") + call + "</think>" + call + "\nDone.");
  EXPECT_EQ(r.reasoning, "Call it.");
  EXPECT_EQ(r.content, "\nDone.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].id, "call_x1");
}

TEST(ChatOutputTest, Detection) {
  EXPECT_EQ(DetectToolFormat("{{- '<tool_call>\\n' }}"), ToolFormat::kHermes);
  EXPECT_EQ(DetectToolFormat("[TOOL_CALLS] {{ tool_calls | tojson }}"), ToolFormat::kMistral);
  EXPECT_EQ(DetectToolFormat("{\"name\": function name, \"parameters\": dictionary"),
            ToolFormat::kLlama3Json);
  EXPECT_EQ(DetectToolFormat("{{ messages }}"), ToolFormat::kNone);
  EXPECT_TRUE(DetectReasoning("content.split('</think>')"));
  EXPECT_FALSE(DetectReasoning("{{ messages }}"));
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<think>a</think> <|im_start|>assistant\n"));
  EXPECT_EQ(ToolFormatFromName("qwen"), ToolFormat::kHermes);
  EXPECT_EQ(ToolFormatFromName("llama3_json"), ToolFormat::kLlama3Json);
  EXPECT_FALSE(ToolFormatFromName("pythonic").has_value());
}

// Random texts made of the formats' pieces, under every format with and without reasoning:
// however a text is cut, the result is the same (ParseEveryWay), and nothing is lost that is
// not a call or whitespace next to one.
TEST(ChatOutputTest, RandomTextsAnyCut) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "<think>",
                                           "</think>",
                                           "[TOOL_CALLS]",
                                           "[ARGS]",
                                           "<|python_tag|>",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"name\"",
                                           "\"arguments\"",
                                           "\"parameters\"",
                                           ":",
                                           ",",
                                           ";",
                                           "\"f\"",
                                           "\"a\\\"b\"",
                                           "12",
                                           "true",
                                           " ",
                                           "\n",
                                           "x",
                                           "<",
                                           "\"",
                                           "\\"};
  std::mt19937 rng(1234);
  int calls = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    for (const ToolFormat format :
         {ToolFormat::kHermes, ToolFormat::kLlama3Json, ToolFormat::kMistral}) {
      for (const bool reasoning : {false, true}) {
        ChatOutputOptions o = Tools(format);
        o.reasoning = reasoning;
        o.starts_in_reasoning = reasoning && iter % 2 == 0;
        const Result r = ParseEveryWay(o, text);
        calls += std::ssize(r.calls);
        if (r.calls.empty() && !reasoning) {
          EXPECT_EQ(r.content, text) << "no call: the text is the content";
        }
        for (const Call& c : r.calls) EXPECT_FALSE(c.name.empty());
      }
    }
  }
  EXPECT_GT(calls, 0);
}

TEST(ChatOutputTest, ForcedCallsLeaveTheReasoningAlone) {
  ChatOutputOptions o = Reasoning(false, ToolFormat::kHermes);
  o.forced_tools = true;
  const Result r = ParseEveryWay(
      o,
      "<think><tool_call>\n{\"name\": \"nope\", \"arguments\": 1}\n</tool_call></think>\n"
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.reasoning, "<tool_call>\n{\"name\": \"nope\", \"arguments\": 1}\n</tool_call>");
}

}  // namespace
}  // namespace llm::chat
