// Hugging Face chat templates, rendered as transformers' apply_chat_template renders them
// (Jinja2 with trim_blocks, lstrip_blocks, loopcontrols, its tojson and raise_exception).
// The interpreter covers the Jinja2 subset chat templates use (jinja_*.cc); anything else
// fails in Parse, at start-up, with line and column (or, for a method a value lacks, at render
// time naming it), never as a prompt rendered without it.
//
//   auto tmpl = ChatTemplate::Parse(ChatTemplateSource(tokenizer_config));
//   std::string prompt = tmpl.Render(messages, /*add_generation_prompt=*/true,
//                                    {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
//
// Tests: ninja -C build chat_template_test chat_template_hf_test && build/chat_template_test &&
// build/chat_template_hf_test (the second against @huggingface/jinja on real tokenizers'
// templates; it lists where that library departs from Jinja2, which we follow).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace llm {

namespace jinja {
struct Node;
}

class ChatTemplate {
 public:
  // Throws llm::Error("chat template: line L, column C: ...") for syntax errors, unsupported
  // statements, filters and tests.
  static ChatTemplate Parse(std::string source);

  // `messages` is the OpenAI-style list of {"role", "content", ...}; `extra` holds the other
  // template variables (bos_token, eos_token, tools, date_string, ...). As transformers does,
  // `tools` and `documents` are none unless `extra` sets them. ordered_json keeps the keys'
  // order, which `tojson` and `items()` show (Python dicts keep insertion order).
  // Throws llm::Error for raise_exception(...), runtime errors and exceeded limits.
  std::string Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }

 private:
  struct Parsed;
  std::string source_;
  std::shared_ptr<const Parsed> parsed_;
};

// The `chat_template` of a tokenizer_config.json object: a string, or a list of
// {"name", "template"} from which `name` is taken ("default" unless asked otherwise).
// Throws llm::Error when there is none.
std::string ChatTemplateSource(const nlohmann::json& tokenizer_config,
                               const std::string& name = "default");

}  // namespace llm
