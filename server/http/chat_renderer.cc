// The chat template of a model folder (tokenizer_config.json's chat_template) as a
// ChatRenderer: parsed once at start-up (a template the interpreter cannot parse is a
// start-up error naming the file, never a silent fallback), rendered per request.
#include <filesystem>

#include "engine/chat/chat_template.h"
#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "server/http/http_server.h"
#include "server/http/openai_api.h"

namespace llm::server {

ChatRenderer MakeChatRenderer(const std::string& model_dir, const Tokenizer& tokenizer,
                              std::string* source) {
  if (source) source->clear();
  const std::filesystem::path path = std::filesystem::path(model_dir) / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return nullptr;
  const nlohmann::json config = ReadJsonFile(path.string());
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return nullptr;
  std::shared_ptr<ChatTemplate> chat;
  try {
    chat = std::make_shared<ChatTemplate>(ChatTemplate::Parse(ChatTemplateSource(config)));
  } catch (const Error& e) {
    throw Error(path.string() + ": " + e.what());
  }
  if (source) *source = chat->source();
  // bos_token / eos_token as the template sees them: the config's strings (possibly
  // {"content": ...} objects), else the tokenizer's pieces.
  auto token_string = [&](const char* key, int id) -> std::string {
    if (config.contains(key) && config[key].is_string()) return config[key].get<std::string>();
    if (config.contains(key) && config[key].is_object() && config[key].contains("content")) {
      return config[key]["content"].get<std::string>();
    }
    return id >= 0 ? std::string(tokenizer.IdToPiece(id)) : "";
  };
  const nlohmann::ordered_json tokens = {
      {"bos_token", token_string("bos_token", tokenizer.bos_id())},
      {"eos_token", token_string("eos_token", tokenizer.eos_id())}};
  return [chat, tokens](const ChatInputs& inputs) {
    // The request's variables (tools, chat_template_kwargs) over the special tokens.
    nlohmann::ordered_json variables = tokens;
    for (const auto& [key, value] : inputs.variables.items()) variables[key] = value;
    try {
      return chat->Render(inputs.messages, inputs.add_generation_prompt, variables);
    } catch (const Error& e) {  // raise_exception(...) in the template: the client's fault
      throw ApiError{400, e.what(), "invalid_request_error", "messages", "chat_template_error"};
    }
  };
}

}  // namespace llm::server
