// ResponseBuilder: engine outputs -> OpenAI response objects and SSE chunks.
#include <chrono>

#include "server/http/openai_api.h"

namespace llm::server {
namespace {

using nlohmann::json;

json FinishJson(FinishReason reason) {
  return reason == FinishReason::kNone ? json(nullptr) : json(FinishReasonString(reason));
}

}  // namespace

ResponseBuilder::ResponseBuilder(const ParsedRequest& req, const Tokenizer& tokenizer,
                                 std::string id, std::string model)
    : req_(req), tokenizer_(tokenizer), id_(std::move(id)), model_(std::move(model)) {
  created_ = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  choices_.resize(static_cast<size_t>(std::max(1, req.request.sampling.n)));
  const chat::ChatOutputOptions& co = req.chat_output;
  if (req.is_chat && (co.tools != chat::ToolFormat::kNone || co.reasoning)) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      chat::ChatOutputOptions o = co;
      if (i > 0) {  // each choice's calls have ids of their own (n > 1)
        o.id_prefix = NewToolCallIdPrefix(co.id_digits > 0 ? chat::ToolFormat::kMistral
                                                           : chat::ToolFormat::kHermes);
      }
      choices_[i].parser = std::make_unique<chat::ChatOutputParser>(std::move(o));
    }
  }
}

json ResponseBuilder::FinishJson(const Choice& c, FinishReason reason) const {
  if (reason == FinishReason::kStop && !c.tool_calls.empty()) return "tool_calls";
  return llm::server::FinishJson(reason);
}

void ResponseBuilder::Add(const RequestOutput& out) {
  Choice& c = choices_.at(static_cast<size_t>(out.index));
  if (c.parser) {
    c.last = c.parser->Feed(out.text);
    if (out.finish_reason != FinishReason::kNone) c.last.Append(c.parser->Finish());
    c.text += c.last.content;
    c.reasoning += c.last.reasoning;
    for (const chat::ToolCallDelta& d : c.last.tool_calls) {
      if (!d.name.empty()) c.tool_calls.push_back({d.id, d.name, ""});
      if (!c.tool_calls.empty()) c.tool_calls.back().arguments += d.arguments;
    }
  } else {
    c.text += out.text;
  }
  c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  if (out.finish_reason != FinishReason::kNone) c.finish = out.finish_reason;
  if (out.is_last) usage_ = out.usage;
}

json ResponseBuilder::Envelope() const {
  return {{"id", id_},
          {"object", req_.is_chat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_}};
}

std::string ResponseBuilder::TokenName(int token) const {
  if (req_.tokens_as_ids) return "token_id:" + std::to_string(token);
  return std::string(tokenizer_.IdToPiece(token));
}

json ResponseBuilder::LogprobsJson(const std::vector<OutputLogprob>& lps) const {
  if (!req_.want_logprobs) return nullptr;
  if (req_.is_chat) {  // {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
    json content = json::array();
    for (const OutputLogprob& lp : lps) {
      json top = json::array();
      for (const TokenLogprob& t : lp.top) {
        top.push_back({{"token", TokenName(t.token)}, {"logprob", t.logprob}});
      }
      content.push_back(
          {{"token", TokenName(lp.token)}, {"logprob", lp.logprob}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array();
  for (const OutputLogprob& lp : lps) {
    tokens.push_back(TokenName(lp.token));
    token_logprobs.push_back(lp.logprob);
    json alts = json::object();
    for (const TokenLogprob& t : lp.top) alts[TokenName(t.token)] = t.logprob;
    top.push_back(alts);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}};
}

json ResponseBuilder::Final() const {
  json r = Envelope();
  r["choices"] = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i},
                   {"finish_reason", FinishJson(c, c.finish)},
                   {"logprobs", LogprobsJson(c.logprobs)}};
    if (req_.is_chat) {
      json message = {{"role", "assistant"},
                      {"content", c.text.empty() && !c.tool_calls.empty() ? json() : json(c.text)}};
      if (req_.chat_output.reasoning) {
        message["reasoning_content"] = c.reasoning.empty() ? json() : json(c.reasoning);
      }
      if (!c.tool_calls.empty()) {
        json calls = json::array();
        for (const ToolCall& t : c.tool_calls) {
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    r["choices"].push_back(choice);
  }
  r["usage"] = {{"prompt_tokens", usage_.prompt_tokens},
                {"completion_tokens", usage_.completion_tokens},
                {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", usage_.cached_prompt_tokens}}}};
  return r;
}

json ResponseBuilder::Chunk(const RequestOutput& out) const {
  const Choice& c = choices_.at(static_cast<size_t>(out.index));
  const bool nothing = c.parser ? c.last.empty() : out.text.empty();
  if (nothing && out.finish_reason == FinishReason::kNone && out.logprobs.empty()) {
    return nullptr;
  }
  json r = Envelope();
  r["object"] = req_.is_chat ? "chat.completion.chunk" : "text_completion";
  json choice = {{"index", out.index},
                 {"finish_reason", FinishJson(c, out.finish_reason)},
                 {"logprobs", LogprobsJson(out.logprobs)}};
  if (req_.is_chat && c.parser) {
    json delta = json::object();
    if (!c.last.reasoning.empty()) delta["reasoning_content"] = c.last.reasoning;
    if (!c.last.content.empty()) delta["content"] = c.last.content;
    if (!c.last.tool_calls.empty()) {
      json calls = json::array();
      for (const chat::ToolCallDelta& d : c.last.tool_calls) {
        if (d.name.empty()) {
          calls.push_back({{"index", d.index}, {"function", {{"arguments", d.arguments}}}});
        } else {
          calls.push_back({{"index", d.index},
                           {"id", d.id},
                           {"type", "function"},
                           {"function", {{"name", d.name}, {"arguments", d.arguments}}}});
        }
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
  } else if (req_.is_chat) {
    choice["delta"] = out.text.empty() ? json::object() : json{{"content", out.text}};
  } else {
    choice["text"] = out.text;
  }
  r["choices"] = json::array({choice});
  return r;
}

json ResponseBuilder::RoleChunk(int index) const {
  json r = Envelope();
  r["object"] = "chat.completion.chunk";
  r["choices"] = json::array({{{"index", index},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return r;
}

json ResponseBuilder::UsageChunk() const {
  json r = Envelope();
  r["object"] = req_.is_chat ? "chat.completion.chunk" : "text_completion";
  r["choices"] = json::array();
  r["usage"] = {{"prompt_tokens", usage_.prompt_tokens},
                {"completion_tokens", usage_.completion_tokens},
                {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
  return r;
}

}  // namespace llm::server
