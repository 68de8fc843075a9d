// The chat template of a model folder as a ChatRenderer. Until the Jinja interpreter lands
// (engine/chat_template.h), a folder with a chat_template is served without chat.
#include <filesystem>

#include "engine/json_file.h"
#include "server/commands.h"

namespace llm::cli {

std::function<std::string(const nlohmann::json&, bool)> MakeChatRenderer(
    const std::string& model_dir, const Tokenizer& tokenizer) {
  (void)model_dir;
  (void)tokenizer;
  return nullptr;
}

}  // namespace llm::cli
