// Fuzzes the chat-template interpreter (lexer, parser, evaluator): the input is a template
// source, optionally followed by a NUL byte and a messages JSON list. Without one (the
// real templates in tests/data/chat_templates are seeds as they are) a four-turn
// conversation is used. add_generation_prompt is the input length's parity. Every input
// must parse and render or throw llm::Error.
//
//   scripts/fuzz.sh chat_template
#include <cstddef>
#include <cstdint>

#include "engine/chat/chat_template.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const nlohmann::ordered_json& DefaultMessages() {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Tell me a story."}])");
  return messages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto [source, messages_text] = llm::fuzz::SplitAt(input, std::string_view("\0", 1));
  nlohmann::ordered_json messages = DefaultMessages();
  if (!messages_text.empty()) {
    auto parsed = nlohmann::ordered_json::parse(messages_text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_array()) messages = std::move(parsed);  // the server passes a list only
  }
  const nlohmann::ordered_json extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  try {
    const llm::ChatTemplate tmpl = llm::ChatTemplate::Parse(std::string(source));
    tmpl.Render(messages, /*add_generation_prompt=*/size % 2 == 0, extra);
  } catch (const llm::Error&) {
  }
  return 0;
}
