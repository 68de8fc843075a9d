#include "engine/chat/chat_template.h"

#include "engine/chat/jinja_ast.h"
#include "engine/chat/jinja_eval.h"
#include "engine/error.h"

namespace llm {

struct ChatTemplate::Parsed {
  jinja::NodeList nodes;
};

ChatTemplate ChatTemplate::Parse(std::string source) {
  auto parsed = std::make_shared<Parsed>();
  parsed->nodes = jinja::ParseTemplate(jinja::Lex(source));
  jinja::CheckNames(parsed->nodes);
  ChatTemplate result;
  result.source_ = std::move(source);
  result.parsed_ = std::move(parsed);
  return result;
}

std::string ChatTemplate::Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  if (!extra.is_object() && !extra.is_null())
    throw Error("chat template: extra variables must be an object");
  try {
    jinja::Dict variables;
    variables.Set("messages", jinja::Value::FromJson(messages));
    variables.Set("tools", jinja::Value::None());
    variables.Set("documents", jinja::Value::None());
    variables.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
    if (extra.is_object()) {
      for (const auto& [key, value] : extra.items())
        variables.Set(key, jinja::Value::FromJson(value));
    }
    return jinja::Render(parsed_->nodes, variables, jinja::RenderLimits{});
  } catch (const jinja::RuntimeError& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
}

std::string ChatTemplateSource(const nlohmann::json& tokenizer_config, const std::string& name) {
  auto it = tokenizer_config.find("chat_template");
  if (it == tokenizer_config.end() || it->is_null())
    throw Error("tokenizer config has no chat_template");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == name && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    throw Error("tokenizer config has no chat_template named '" + name + "'");
  }
  throw Error("tokenizer config: chat_template must be a string or a list of {name, template}");
}

}  // namespace llm
