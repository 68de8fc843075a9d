#include "engine/chat/chat_output.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/chat/tool_extractor.h"

namespace llm::chat {

std::optional<ToolFormat> ToolFormatFromName(std::string_view name) {
  if (name == "none") return ToolFormat::kNone;
  if (name == "hermes" || name == "qwen") return ToolFormat::kHermes;
  if (name == "llama3_json") return ToolFormat::kLlama3Json;
  if (name == "mistral") return ToolFormat::kMistral;
  return std::nullopt;
}

std::string_view ToolFormatName(ToolFormat format) {
  switch (format) {
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3Json:
      return "llama3_json";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kNone:
      break;
  }
  return "none";
}

ToolFormat DetectToolFormat(std::string_view source) {
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolFormat::kHermes;
  if (source.find(kMistralMarker) != std::string_view::npos) return ToolFormat::kMistral;
  // Llama 3.1 / 3.2: the template asks for {"name": ..., "parameters": ...} and writes past
  // calls after <|python_tag|>.
  if (source.find(kPythonTag) != std::string_view::npos ||
      source.find("\"parameters\": ") != std::string_view::npos) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kNone;
}

bool DetectReasoning(std::string_view source) {
  return source.find(kThinkClose) != std::string_view::npos;
}

bool PromptOpensReasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  // Only the tail of the prompt counts: <think> followed by nothing but whitespace.
  return LStrip(prompt.substr(open + kThinkOpen.size())).empty();
}

void ChatDelta::Append(ChatDelta&& more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ToolCallDelta& d : more.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == d.index && d.name.empty()) {
      tool_calls.back().arguments += d.arguments;
    } else {
      tool_calls.push_back(std::move(d));
    }
  }
}

// ---- The parser: reasoning first, tool calls within each stream.

ChatOutputParser::ChatOutputParser(ChatOutputOptions options) : options_(std::move(options)) {
  phase_ = !options_.reasoning            ? Phase::kContent
           : options_.starts_in_reasoning ? Phase::kReasoning
                                          : Phase::kStart;
  if (options_.tools != ToolFormat::kNone) {
    // Forced calls come after the reasoning, under their grammar: the reasoning is left alone.
    if (!options_.forced_tools) {
      reasoning_tools_ =
          std::make_unique<ToolExtractor>(options_.tools, false, &num_calls_, &options_);
    }
    content_tools_ = std::make_unique<ToolExtractor>(options_.tools, options_.forced_tools,
                                                     &num_calls_, &options_);
  }
}

ChatOutputParser::~ChatOutputParser() = default;

int ChatOutputParser::num_tool_calls() const { return num_calls_; }

void ChatOutputParser::Route(bool reasoning, std::string_view text, ChatDelta* out) {
  if (text.empty()) return;
  std::string* dest = reasoning ? &out->reasoning : &out->content;
  ToolExtractor* tools = reasoning ? reasoning_tools_.get() : content_tools_.get();
  if (tools) {
    tools->Feed(text, dest, &out->tool_calls);
  } else {
    *dest += text;
  }
}

ChatDelta ChatOutputParser::Feed(std::string_view text) {
  ChatDelta out;
  if (phase_ == Phase::kContent) {
    Route(false, text, &out);
    return out;
  }
  held_ += text;
  for (;;) {
    switch (phase_) {
      case Phase::kStart: {
        const std::string_view rest = LStrip(held_);
        if (rest.starts_with(kThinkOpen)) {
          held_.erase(0, held_.size() - rest.size() + kThinkOpen.size());
          phase_ = Phase::kReasoning;
          break;
        }
        if (kThinkOpen.starts_with(rest)) return out;  // maybe <think> still
        phase_ = Phase::kContent;
        Route(false, held_, &out);
        held_.clear();
        return out;
      }
      case Phase::kReasoning: {
        const size_t at = held_.find(kThinkClose);
        if (at == std::string::npos) {
          const size_t keep = PartialTagSuffix(held_, kThinkClose);
          Route(true, std::string_view(held_).substr(0, held_.size() - keep), &out);
          held_.erase(0, held_.size() - keep);
          return out;
        }
        Route(true, std::string_view(held_).substr(0, at), &out);
        if (reasoning_tools_) reasoning_tools_->Finish(&out.reasoning, &out.tool_calls);
        held_.erase(0, at + kThinkClose.size());
        phase_ = Phase::kContentStart;
        break;
      }
      case Phase::kContentStart: {
        const std::string_view rest = LStrip(held_);
        if (rest.empty()) {
          held_.clear();
          return out;
        }
        phase_ = Phase::kContent;
        Route(false, rest, &out);
        held_.clear();
        return out;
      }
      case Phase::kContent:
        Route(false, held_, &out);
        held_.clear();
        return out;
    }
  }
}

ChatDelta ChatOutputParser::Finish() {
  ChatDelta out;
  if (phase_ == Phase::kStart) Route(false, held_, &out);
  if (phase_ == Phase::kReasoning) Route(true, held_, &out);
  held_.clear();
  if (reasoning_tools_ && phase_ == Phase::kReasoning) {
    reasoning_tools_->Finish(&out.reasoning, &out.tool_calls);
  }
  if (content_tools_) content_tools_->Finish(&out.content, &out.tool_calls);
  return out;
}

}  // namespace llm::chat
