// A chat model's output text split into what OpenAI's API returns: reasoning
// (`<think>...</think>`, as `reasoning_content`), content, and tool calls, in a model family's
// format:
//   kHermes      Hermes, Qwen 2.5, Qwen3:  <tool_call>\n{"name": N, "arguments":
//   {...}}\n</tool_call>
//                (one block per call; text before the first block is content)
//   kLlama3Json  Llama 3.1 / 3.2:  {"name": N, "parameters": {...}} at the start of the output
//                (optionally after <|python_tag|>), more calls after ";"
//   kMistral     Mistral:  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...], or the newer
//                [TOOL_CALLS]N[ARGS]{...} (the marker is a special token: the text must keep
//                special tokens)
// In a call object, "arguments" and "parameters" both name the arguments; "type" and "id" are
// ignored. A block that is not a call object (before its name is known) stays text.
//
// Streaming: Feed() takes the output in pieces of any size and returns what is final: text
// that could still be the start of a tag is held back, a call's id and name come in its first
// delta and its arguments in fragments as they arrive (their raw JSON text). The sum of the
// deltas depends only on the whole text, never on how it was cut into pieces, so a streamed
// response adds up to the non-streamed one.
// Whitespace next to a tool call (between blocks, before one) is dropped; leading whitespace of
// the content after </think> too.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llm::chat {

enum class ToolFormat { kNone, kHermes, kLlama3Json, kMistral };

// "hermes" (also "qwen"), "llama3_json", "mistral", "none"; nullopt for anything else.
std::optional<ToolFormat> ToolFormatFromName(std::string_view name);
std::string_view ToolFormatName(ToolFormat format);
// The format a chat template writes tool calls in (kNone when it shows none).
ToolFormat DetectToolFormat(std::string_view template_source);
// Whether a chat template knows <think> blocks (Qwen3, DeepSeek-R1 style).
bool DetectReasoning(std::string_view template_source);
// Whether a rendered prompt leaves a <think> open (the template pre-filled it): the output
// then starts inside the reasoning.
bool PromptOpensReasoning(std::string_view prompt);

struct ToolCallDelta {
  int index = 0;
  std::string id;    // the first delta of a call: its id and name
  std::string name;  // "" on the later deltas
  std::string arguments;
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void Append(ChatDelta&& more);
};

struct ChatOutputOptions {
  ToolFormat tools = ToolFormat::kNone;  // kNone: tool calls are not looked for
  bool reasoning = false;                // <think>...</think> becomes reasoning
  bool starts_in_reasoning = false;      // the prompt opened <think> (PromptOpensReasoning)
  // The output is tool calls only (after the reasoning, if any), made under their grammar
  // (tool_choice required or named); for kMistral they start after the [TOOL_CALLS] marker.
  bool forced_tools = false;
  // Call ids: id_prefix + the call's index, zero-padded to id_digits digits when set (ids of
  // one length: Mistral's template wants 9 letters and digits).
  std::string id_prefix = "call_";
  int id_digits = 0;
  // kLlama3Json, whose calls have no marker: a JSON object is a call only when it names one of
  // these (when set) and has "parameters" or "arguments".
  std::vector<std::string> tool_names;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions options);
  ~ChatOutputParser();
  // Not movable: the extractors point at options_ and num_calls_.
  ChatOutputParser(const ChatOutputParser&) = delete;
  ChatOutputParser& operator=(const ChatOutputParser&) = delete;

  ChatDelta Feed(std::string_view text);
  // The end of the output: what was held back is released (an unfinished tag is text, an
  // unfinished call keeps the arguments it has).
  ChatDelta Finish();
  int num_tool_calls() const;

  class ToolExtractor;  // chat_output.cc

 private:
  void Route(bool reasoning, std::string_view text, ChatDelta* out);

  ChatOutputOptions options_;
  enum class Phase { kStart, kReasoning, kContentStart, kContent } phase_;
  std::string held_;  // text that may still be (the start of) <think> or </think>
  int num_calls_ = 0;
  std::unique_ptr<ToolExtractor> reasoning_tools_, content_tools_;
};

}  // namespace llm::chat
