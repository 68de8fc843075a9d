// Fuzzes the OpenAI request parsing: the input is a request body. A JSON object with
// "messages" goes the /v1/chat/completions way (ParseChatBody, rendered by one of the real
// chat templates in tests/data/chat_templates, picked by the input's length), any other
// object the /v1/completions way (ParseCompletion). Every input must parse or throw ApiError
// or llm::Error, as HttpServer::Generate expects (it catches exactly those). The model has a
// grammar compiler (structured outputs and forced tool calls compile, under a 1 s deadline) and
// a tool-call format picked by the input's length, and the last message's content, taken as
// the model's reply, goes through the response builder (ChatOutputParser) whole and cut in
// pieces (it is valid UTF-8, as the engine's text always is).
//
//   scripts/fuzz.sh openai_request
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "engine/chat/chat_template.h"
#include "engine/error.h"
#include "server/http/openai_api.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using llm::server::ApiError;

// The renderers of every template in tests/data/chat_templates (sorted by file name),
// made as MakeChatRenderer makes them: template errors become a 400.
const std::vector<llm::server::ChatRenderer>& Renderers() {
  static const std::vector<llm::server::ChatRenderer> renderers = [] {
    std::vector<std::filesystem::path> paths;
    for (const auto& entry :
         std::filesystem::directory_iterator(LLM_SOURCE_DIR "/tests/data/chat_templates")) {
      if (entry.path().extension() == ".jinja") paths.push_back(entry.path());
    }
    std::sort(paths.begin(), paths.end());
    std::vector<llm::server::ChatRenderer> out;
    for (const auto& path : paths) {
      std::ifstream in(path);
      std::stringstream source;
      source << in.rdbuf();
      auto chat = std::make_shared<llm::ChatTemplate>(llm::ChatTemplate::Parse(source.str()));
      out.push_back([chat](const llm::server::ChatInputs& inputs) {
        nlohmann::ordered_json variables = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
        for (const auto& [key, value] : inputs.variables.items()) variables[key] = value;
        try {
          return chat->Render(inputs.messages, inputs.add_generation_prompt, variables);
        } catch (const llm::Error& e) {
          throw ApiError{400, e.what(), "invalid_request_error", "messages", "chat_template_error"};
        }
      });
    }
    if (out.empty()) std::abort();
    return out;
  }();
  return renderers;
}

llm::server::ModelInfo Model(const llm::Tokenizer& tokenizer, size_t size) {
  static const auto grammars = [&] {
    llm::grammar::CompilerOptions options;
    options.timeout_seconds = 1;
    return std::make_shared<llm::grammar::GrammarCompiler>(
        llm::grammar::TokenVocabulary::FromTokenizer(tokenizer, {tokenizer.eos_id()},
                                                     tokenizer.vocab_size()),
        options);
  }();
  llm::server::ModelInfo model{"stories260K", 512, tokenizer.vocab_size()};
  model.grammars = grammars;
  constexpr llm::chat::ToolFormat kFormats[] = {
      llm::chat::ToolFormat::kNone, llm::chat::ToolFormat::kHermes,
      llm::chat::ToolFormat::kLlama3Json, llm::chat::ToolFormat::kMistral};
  model.tool_format = kFormats[size % 4];
  model.reasoning = size % 3 == 0;
  return model;
}

// `text` as the model's reply to `parsed`: whole, and in pieces of 1 to 7 bytes cut at
// character boundaries (as the engine's detokenizer releases text); every chunk and the final
// response print as JSON (a piece that split a character would throw there).
void Respond(const llm::server::ParsedRequest& parsed, std::string_view text,
             const llm::Tokenizer& tokenizer) {
  for (size_t piece : {text.size() + 1, size_t{1} + text.size() % 7}) {
    llm::server::ResponseBuilder builder(parsed, tokenizer, "chatcmpl-0", "m");
    for (size_t at = 0; at < text.size();) {
      size_t end = std::min(text.size(), at + piece);
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
      llm::RequestOutput out;
      out.text = std::string(text.substr(at, end - at));
      at = end;
      builder.Add(out);
      builder.Chunk(out).dump();
    }
    llm::RequestOutput last;
    last.finish_reason = llm::FinishReason::kStop;
    last.is_last = true;
    builder.Add(last);
    builder.Chunk(last).dump();
    builder.Final().dump();  // UTF-8 the input broke is a type_error here, as in the server
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const llm::Tokenizer& tokenizer = llm::fuzz::StoriesTokenizer();
  const llm::server::ModelInfo model = Model(tokenizer, size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) return 0;  // the server's 400 invalid_json
  try {
    if (body.contains("messages")) {
      const auto& renderers = Renderers();
      const llm::server::ParsedRequest parsed = llm::server::ParseChatBody(
          text, body, renderers[size % renderers.size()], tokenizer, model);
      const nlohmann::json& last = body["messages"].back();
      if (last.is_object() && last.contains("content") && last["content"].is_string()) {
        Respond(parsed, last["content"].get<std::string>(), tokenizer);
      }
    } else {
      llm::server::ParseCompletion(body, tokenizer, model);
    }
  } catch (const ApiError&) {
  } catch (const llm::Error&) {
  }
  return 0;
}
