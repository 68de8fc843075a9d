// The OpenAI-compatible wire format: request JSON -> engine::Request (with precise 4xx errors
// in OpenAI's error shape), engine outputs -> response / SSE chunk JSON. No sockets here.
//
// Unknown-field policy: fields this server does not know are ignored (as vLLM does), so
// clients written for newer API versions keep working; `user` is accepted and ignored.
// Fields it knows but cannot honour (`echo: true`, `best_of` != n, `suffix`) are a 400.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_output.h"
#include "engine/grammar/compiler.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm::server {

// An error the client caused (or an overload): HTTP status and OpenAI's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" when none
  std::string code;   // machine-readable code, "" when none
};

// {"error": {"message", "type", "param", "code"}}; the message is cut to 1,000 bytes so
// an error never echoes a large input back.
nlohmann::json ErrorBody(const ApiError& error);

struct ModelInfo {
  std::string id;  // the served model name
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
  // Structured outputs (response_format, structured_outputs); null: such requests are a 400.
  std::shared_ptr<grammar::GrammarCompiler> grammars = nullptr;
  // How the chat template writes tool calls (--tool-call-parser, else read off the template)
  // and whether it thinks in <think> blocks (--reasoning-parser).
  chat::ToolFormat tool_format = chat::ToolFormat::kNone;
  bool reasoning = false;
};

// What a chat request's `tools`, `tool_choice` and `parallel_tool_calls` ask of the output.
struct ToolsRequest {
  chat::ToolFormat format = chat::ToolFormat::kNone;  // kNone: calls are not looked for
  bool forced = false;  // tool_choice "required" or named: the output is calls, under `spec`
  grammar::StructuredSpec spec;
  std::vector<std::string> names;  // the tools' function names
};
// Checks tools ({"type": "function", "function": {"name", "description", "parameters",
// "strict"}}), tool_choice ("none", "auto" (the default with tools), "required", or
// {"type": "function", "function": {"name"}} naming one of them) and parallel_tool_calls
// (with false, a forced choice makes one call). A forced choice's grammar is made, compiled
// by CompileForcedCalls. Throws ApiError naming the field.
ToolsRequest ParseTools(const nlohmann::ordered_json& body, const ModelInfo& model);
std::shared_ptr<const grammar::CompiledGrammar> CompileForcedCalls(
    const ToolsRequest& tools, const ModelInfo& model,
    grammar::StructuredSpec::Reasoning reasoning);
// Past assistant tool calls whose arguments are JSON text get them as an object, which
// templates (Qwen, Llama) write with tojson, as vLLM passes them; their null content is "".
void PrepareToolMessages(nlohmann::ordered_json* messages);
// A new request's tool-call id prefix (its calls are prefix + index): "call_" and 22 random
// letters and digits; Mistral, whose template wants 9 letters and digits: 6 random (and the
// index in 3 digits: ChatOutputOptions::id_digits).
std::string NewToolCallIdPrefix(chat::ToolFormat format);

// The structured-output fields of a completion or chat request, as a grammar for the sampler
// (sp->grammar; unset when the request has none):
//   response_format: {"type": "text" | "json_object" | "json_schema", "json_schema":
//                     {"name", "schema", "strict", "description"}}
//   structured_outputs (vLLM): {"json": schema (object or text) | "regex": str |
//                     "choice": [str] | "grammar": EBNF | "json_object": true}
//   guided_json, guided_regex, guided_choice, guided_grammar (vLLM's older names)
// At most one of them. Throws ApiError naming the field and the problem (a schema that does
// not compile, an unsupported keyword under strict, one too large or too slow to compile).
// `body_text` (when given) is `body`'s text, read again for the keys' order. `reasoning`: what
// a reasoning model may think before the output (chat: ReasoningFor).
void ParseStructuredOutput(
    const nlohmann::json& body, std::string_view body_text, const ModelInfo& model,
    SamplingParams* sp,
    grammar::StructuredSpec::Reasoning reasoning = grammar::StructuredSpec::Reasoning::kNone);
// Whether a chat reply may think before a structured output, from the rendered prompt: inside
// an open <think>, may start one, or neither (no reasoning template, or the prompt closed the
// block: Qwen3's enable_thinking false).
grammar::StructuredSpec::Reasoning ReasoningFor(const ModelInfo& model, std::string_view prompt);

struct ParsedRequest {
  Request request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool is_chat = false;
  int top_logprobs = 0;  // chat: top_logprobs; completions: logprobs
  bool want_logprobs = false;
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" (ids that do not
  // decode to text on their own stay distinguishable).
  bool tokens_as_ids = false;
  // Chat: how each choice's text splits into reasoning, content and tool calls (the default:
  // all content).
  chat::ChatOutputOptions chat_output;
};

// POST /v1/completions. `prompt`: a string, a list with one string, a list of token ids, or
// a list with one list of token ids. Throws ApiError.
// `body_text`: the body's text when the caller has it (a JSON schema's properties keep
// their order).
ParsedRequest ParseCompletion(const nlohmann::json& body, const Tokenizer& tokenizer,
                              const ModelInfo& model, std::string_view body_text = {});
// POST /v1/chat/completions, with the rendered prompt text already made by the caller from
// `messages` (the chat template). Throws ApiError.
ParsedRequest ParseChat(const nlohmann::json& body, const std::string& rendered_prompt,
                        const Tokenizer& tokenizer, const ModelInfo& model,
                        std::string_view body_text = {});

// What a chat request gives its template. ordered_json: a template's tojson / items() show
// keys in the client's order.
struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = true;
  // More template variables: `tools` (the request's), then chat_template_kwargs' keys (as
  // vLLM passes them: they override the special tokens, `tools` and add_generation_prompt).
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

// Renders a chat conversation to prompt text; throws ApiError / llm::Error.
using ChatRenderer = std::function<std::string(const ChatInputs& inputs)>;

// POST /v1/chat/completions from the body's text (`body` is its parse): checks `messages`
// (a non-empty list), `add_generation_prompt` (a boolean, default true), `tools` (a list of
// objects) and `chat_template_kwargs` (an object, not setting `messages`), renders them with
// `chat` (keys in the client's order), then ParseChat. Throws ApiError, or llm::Error from the
// renderer.
ParsedRequest ParseChatBody(std::string_view body_text, const nlohmann::json& body,
                            const ChatRenderer& chat, const Tokenizer& tokenizer,
                            const ModelInfo& model);

// Accumulates a request's outputs into the non-streamed response.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& req, const Tokenizer& tokenizer, std::string id,
                  std::string model);
  void Add(const RequestOutput& out);
  nlohmann::json Final() const;  // the whole response object
  // One SSE chunk for `out` (null json when the event carries nothing to send).
  nlohmann::json Chunk(const RequestOutput& out) const;
  nlohmann::json UsageChunk() const;  // choices: [] + usage (stream_options.include_usage)
  // The first chat chunk per choice carries the role.
  nlohmann::json RoleChunk(int index) const;

 private:
  nlohmann::json LogprobsJson(const std::vector<OutputLogprob>& lps) const;
  std::string TokenName(int token) const;  // the piece, or "token_id:<id>"
  nlohmann::json Envelope() const;

  const ParsedRequest& req_;
  const Tokenizer& tokenizer_;
  std::string id_, model_;
  int64_t created_ = 0;
  struct ToolCall {
    std::string id, name, arguments;
  };
  struct Choice {
    std::string text;  // chat: the content
    std::string reasoning;
    std::vector<ToolCall> tool_calls;
    std::vector<OutputLogprob> logprobs;
    FinishReason finish = FinishReason::kNone;
    // Chat with tools or reasoning: splits the text; `last` is what the latest Add made of it
    // (the next Chunk's delta).
    std::unique_ptr<chat::ChatOutputParser> parser;
    chat::ChatDelta last;
  };
  // finish_reason: "tool_calls" for a choice that stopped after calling tools.
  nlohmann::json FinishJson(const Choice& c, FinishReason reason) const;
  std::vector<Choice> choices_;
  Usage usage_;
};

// "stop" / "length" / ... as OpenAI spells finish_reason ("abort" and "timeout" are ours).
std::string FinishReasonString(FinishReason reason);

}  // namespace llm::server
