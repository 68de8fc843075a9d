#include "server/http/openai_api.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>

#include "engine/error.h"

namespace llm::server {
namespace {

using nlohmann::json;

ApiError BadParam(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, "invalid_parameter"};
}

// Typed optional field access: a wrong type is a 400 naming the field.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}
  bool Has(const char* key) const { return body_.contains(key) && !body_[key].is_null(); }
  double Number(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    if (!body_[key].is_number()) throw BadParam(key, std::string(key) + " must be a number");
    return body_[key].get<double>();
  }
  // An integer, or a float with an integral value within int64's range (1e40 is refused,
  // not cast: that was undefined behaviour).
  int64_t Int(const char* key, int64_t fallback) const {
    if (!Has(key)) return fallback;
    const json& v = body_[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d)) return static_cast<int64_t>(d);
    }
    throw BadParam(key, std::string(key) + " must be an integer");
  }
  // Int for an int field: values beyond int's range are clamped to it (not wrapped: 2^32 + 1
  // would have become 1), so that the range checks that follow see them and refuse them.
  int ClampedInt(const char* key, int64_t fallback) const {
    return static_cast<int>(std::clamp<int64_t>(Int(key, fallback), INT_MIN, INT_MAX));
  }
  bool Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!body_[key].is_boolean()) throw BadParam(key, std::string(key) + " must be a boolean");
    return body_[key].get<bool>();
  }

 private:
  const json& body_;
};

std::vector<std::string> StopStrings(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& s = body["stop"];
  if (s.is_string()) return {s.get<std::string>()};
  if (!s.is_array()) throw BadParam("stop", "stop must be a string or a list of strings");
  std::vector<std::string> out;
  for (const json& x : s) {
    if (!x.is_string()) throw BadParam("stop", "stop must be a string or a list of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

std::vector<int> IntList(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return {};
  if (!body[key].is_array()) throw BadParam(key, std::string(key) + " must be a list of integers");
  std::vector<int> out;
  for (const json& x : body[key]) {
    if (!x.is_number_integer())
      throw BadParam(key, std::string(key) + " must be a list of integers");
    // Clamped, not wrapped, to int: an id beyond it stays outside the vocabulary.
    out.push_back(static_cast<int>(std::clamp<int64_t>(x.get<int64_t>(), INT_MIN, INT_MAX)));
  }
  return out;
}

// The sampling fields shared by completions and chat (vLLM's extensions included).
void ParseSampling(const json& body, std::string_view body_text, const ModelInfo& model,
                   int64_t num_prompt, ParsedRequest* out,
                   grammar::StructuredSpec::Reasoning reasoning = {}) {
  const Fields f(body);
  SamplingParams& sp = out->request.sampling;
  sp.temperature = f.Number("temperature", 1.0);
  if (sp.temperature > 2.0) throw BadParam("temperature", "temperature must be in [0, 2]");
  sp.top_p = f.Number("top_p", 1.0);
  sp.top_k = f.ClampedInt("top_k", 0);
  sp.min_p = f.Number("min_p", 0.0);
  sp.presence_penalty = f.Number("presence_penalty", 0.0);
  sp.frequency_penalty = f.Number("frequency_penalty", 0.0);
  sp.repetition_penalty = f.Number("repetition_penalty", 1.0);
  sp.n = f.ClampedInt("n", 1);
  if (f.Has("best_of") && f.Int("best_of", sp.n) != sp.n) {
    throw BadParam("best_of", "best_of different from n is not supported");
  }
  if (f.Has("seed")) sp.seed = static_cast<uint64_t>(f.Int("seed", 0));
  sp.ignore_eos = f.Bool("ignore_eos", false);
  out->request.skip_special_tokens = f.Bool("skip_special_tokens", true);
  sp.stop = StopStrings(body);
  sp.stop_token_ids = IntList(body, "stop_token_ids");
  // max_tokens (or chat's max_completion_tokens); default: the rest of the context.
  const char* max_key = f.Has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t room = model.max_model_len - num_prompt;
  sp.max_tokens = f.ClampedInt(max_key, out->is_chat ? room : 16);
  if (sp.max_tokens < 1) throw BadParam(max_key, std::string(max_key) + " must be at least 1");
  if (num_prompt >= model.max_model_len || sp.max_tokens > room) {
    throw BadParam(max_key, "This model's maximum context length is " +
                                std::to_string(model.max_model_len) + " tokens; the prompt has " +
                                std::to_string(num_prompt) + " and " + max_key + " is " +
                                std::to_string(sp.max_tokens));
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    if (!body["logit_bias"].is_object())
      throw BadParam("logit_bias", "logit_bias must be an object");
    for (const auto& [key, value] : body["logit_bias"].items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || !value.is_number()) {
        throw BadParam("logit_bias", "logit_bias maps token ids (as strings) to numbers");
      }
      // Clamped, not wrapped (2^32 + 13 was token 13): Validate refuses it as outside the
      // vocabulary.
      sp.logit_bias[static_cast<int>(std::clamp<long>(id, INT_MIN, INT_MAX))] = value.get<float>();
    }
  }
  if (f.Has("timeout")) {
    const double seconds = f.Number("timeout", 0);
    if (seconds <= 0) throw BadParam("timeout", "timeout must be a positive number of seconds");
    out->request.deadline = DeadlineAfter(seconds);
  }
  out->stream = f.Bool("stream", false);
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    out->include_usage = Fields(body["stream_options"]).Bool("include_usage", false);
  }
  ParseStructuredOutput(body, body_text, model, &sp, reasoning);
  if (const std::string problem = sp.Validate(model.vocab_size); !problem.empty()) {
    const std::string param = problem.substr(0, problem.find(' '));
    throw BadParam(param, problem);
  }
}

std::vector<int> PromptIds(const json& body, const Tokenizer& tokenizer, const ModelInfo& model) {
  if (!body.contains("prompt")) throw BadParam("prompt", "prompt is required");
  json p = body["prompt"];
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
  if (p.is_string()) return tokenizer.EncodePrompt(p.get<std::string>());
  if (p.is_array() && !p.empty()) {
    std::vector<int> ids;
    for (const json& x : p) {
      if (!x.is_number_integer()) {
        throw BadParam("prompt", "prompt must be a string or a list of token ids (one prompt)");
      }
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= model.vocab_size) {
        throw BadParam("prompt", "token id " + std::to_string(id) + " is outside the vocabulary");
      }
      ids.push_back(static_cast<int>(id));
    }
    return ids;
  }
  throw BadParam("prompt", "prompt must be a non-empty string or list of token ids (one prompt)");
}

}  // namespace

json ErrorBody(const ApiError& error) {
  std::string message = error.message.substr(0, 1000);
  return {{"error",
           {{"message", message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

std::string FinishReasonString(FinishReason reason) { return FinishReasonName(reason); }

ParsedRequest ParseCompletion(const json& body, const Tokenizer& tokenizer, const ModelInfo& model,
                              std::string_view body_text) {
  if (!body.is_object()) throw BadParam("", "the request body must be a JSON object");
  ParsedRequest out;
  const Fields f(body);
  if (f.Bool("echo", false)) throw BadParam("echo", "echo is not supported");
  if (f.Has("suffix")) throw BadParam("suffix", "suffix is not supported");
  out.request.prompt_ids = PromptIds(body, tokenizer, model);
  ParseSampling(body, body_text, model, std::ssize(out.request.prompt_ids), &out);
  out.tokens_as_ids = f.Bool("return_tokens_as_token_ids", false);
  if (f.Has("logprobs")) {
    const int64_t n = f.Int("logprobs", 0);
    if (n < 0 || n > 20) throw BadParam("logprobs", "logprobs must be between 0 and 20");
    out.want_logprobs = true;
    out.top_logprobs = static_cast<int>(n);
    out.request.sampling.logprobs = static_cast<int>(n);
  }
  return out;
}

ParsedRequest ParseChat(const json& body, const std::string& rendered_prompt,
                        const Tokenizer& tokenizer, const ModelInfo& model,
                        std::string_view body_text) {
  ParsedRequest out;
  out.is_chat = true;
  const Fields f(body);
  // The chat template already wrote BOS where the model wants it: no second one.
  out.request.prompt_ids = tokenizer.EncodeWithSpecialTokens(rendered_prompt);
  if (out.request.prompt_ids.empty()) throw BadParam("messages", "the conversation is empty");
  ParseSampling(body, body_text, model, std::ssize(out.request.prompt_ids), &out,
                ReasoningFor(model, rendered_prompt));
  out.tokens_as_ids = f.Bool("return_tokens_as_token_ids", false);
  if (f.Bool("logprobs", false)) {
    const int64_t n = f.Int("top_logprobs", 0);
    if (n < 0 || n > 20) throw BadParam("top_logprobs", "top_logprobs must be between 0 and 20");
    out.want_logprobs = true;
    out.top_logprobs = static_cast<int>(n);
    out.request.sampling.logprobs = static_cast<int>(n);
  }
  return out;
}

ParsedRequest ParseChatBody(std::string_view body_text, const json& body, const ChatRenderer& chat,
                            const Tokenizer& tokenizer, const ModelInfo& model) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    throw BadParam("messages", "messages must be a non-empty list");
  }
  const Fields f(body);
  if (f.Has("chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object()) {
      throw BadParam("chat_template_kwargs", "chat_template_kwargs must be an object");
    }
    if (body["chat_template_kwargs"].contains("messages")) {
      throw BadParam("chat_template_kwargs", "chat_template_kwargs cannot set messages");
    }
  }
  auto ordered = nlohmann::ordered_json::parse(body_text);
  const ToolsRequest tools = ParseTools(ordered, model);
  ChatInputs inputs;
  inputs.messages = std::move(ordered["messages"]);
  PrepareToolMessages(&inputs.messages);
  // Fields::Bool, not json::value: a non-boolean is a 400, not a json::type_error (a 500).
  inputs.add_generation_prompt = f.Bool("add_generation_prompt", true);
  if (f.Has("tools")) inputs.variables["tools"] = std::move(ordered["tools"]);
  if (f.Has("chat_template_kwargs")) {
    for (auto& [key, value] : ordered["chat_template_kwargs"].items()) {
      inputs.variables[key] = std::move(value);
    }
  }
  const std::string prompt = chat(inputs);
  ParsedRequest out = ParseChat(body, prompt, tokenizer, model, body_text);
  if (tools.forced) {
    if (out.request.sampling.grammar) {
      throw BadParam("tool_choice",
                     "tool_choice \"required\" or a named function cannot be combined with "
                     "another structured output (response_format, structured_outputs)");
    }
    out.request.sampling.grammar = CompileForcedCalls(tools, model, ReasoningFor(model, prompt));
  }
  chat::ChatOutputOptions& co = out.chat_output;
  co.tools = tools.format;
  co.forced_tools = tools.forced;  // calls only (after the reasoning, if the model thinks)
  co.reasoning = model.reasoning;
  co.starts_in_reasoning = model.reasoning && chat::PromptOpensReasoning(prompt);
  co.tool_names = tools.names;
  // The model's own format decides the ids and special tokens (a model with none writes forced
  // calls as a JSON list, parsed as Mistral's, but its ids are OpenAI's).
  const bool mistral = model.tool_format == chat::ToolFormat::kMistral;
  co.id_prefix = NewToolCallIdPrefix(model.tool_format);
  co.id_digits = mistral ? 3 : 0;
  // Mistral's [TOOL_CALLS] is a special token: the parser must see it.
  if (mistral && tools.format != chat::ToolFormat::kNone) out.request.skip_special_tokens = false;
  return out;
}

}  // namespace llm::server
