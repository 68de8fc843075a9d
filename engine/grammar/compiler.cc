#include "engine/grammar/compiler.h"

#include <nlohmann/json.hpp>

#include "engine/grammar/json_schema.h"
#include "engine/loader/json_file.h"

namespace llm::grammar {
namespace {

std::string TextField(const nlohmann::ordered_json& j, const char* key) {
  if (!j.contains(key)) return "";
  if (!j[key].is_string()) throw GrammarError(std::string("tool calls: ") + key + " is not text");
  return j[key].get<std::string>();
}

// StructuredSpec::Kind::kToolCalls (compiler.h).
Grammar ToolCallsGrammar(const std::string& text, const JsonSchemaOptions& options,
                         const Limits& limits) {
  const auto format = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!format.is_object() || !format.contains("items") || !format["items"].is_array() ||
      format["items"].empty()) {
    throw GrammarError("tool calls: the format has no items");
  }
  const int min = format.value("min", 1), max = format.value("max", 1);
  if (min < 1 || (max >= 0 && max < min)) throw GrammarError("tool calls: bad min / max");
  GrammarBuilder b(limits);
  std::vector<ExprPtr> items;
  for (const auto& item : format["items"]) {
    if (!item.is_object() || !item.contains("schema")) {
      throw GrammarError("tool calls: an item has no schema");
    }
    JsonSchemaOptions item_options = options;
    item_options.strict = item.value("strict", false);
    items.push_back(
        Seq({Literal(TextField(item, "before")), JsonSchemaExpr(item["schema"], item_options, &b),
             Literal(TextField(item, "after"))}));
  }
  const int call = b.NewRule("tool_call");
  b.Define(call, Alt(std::move(items)));
  const int root = b.NewRule("root");
  b.Define(root, Seq({Literal(TextField(format, "prefix")), RuleRef(call),
                      Repeat(Seq({Literal(TextField(format, "separator")), RuleRef(call)}), min - 1,
                             max < 0 ? -1 : max - 1),
                      Literal(TextField(format, "suffix"))}));
  return b.Build(root);
}

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

// Any bytes without kThinkClose, as an automaton over how much of it the text ends with
// (its bytes are distinct: after a mismatch only '<' restarts it).
ExprPtr WithoutThinkClose(GrammarBuilder* b) {
  const size_t n = kThinkClose.size();
  std::vector<int> state(n);
  for (size_t k = 0; k < n; ++k) state[k] = b->NewRule("thinking_" + std::to_string(k));
  for (size_t k = 0; k < n; ++k) {
    std::vector<ExprPtr> alts = {Empty()};
    ByteSet other;
    other.set();
    other.reset(static_cast<uint8_t>('<'));
    alts.push_back(Seq({Byte('<'), RuleRef(state[1])}));
    if (k > 0) {
      const auto next = static_cast<uint8_t>(kThinkClose[k]);
      other.reset(next);
      if (k + 1 < n) alts.push_back(Seq({Byte(next), RuleRef(state[k + 1])}));
    }
    alts.push_back(Seq({Bytes(other), RuleRef(state[0])}));
    b->Define(state[k], Alt(std::move(alts)));
  }
  return RuleRef(state[0]);
}

std::function<ExprPtr(GrammarBuilder*)> ReasoningPrefix(StructuredSpec::Reasoning reasoning) {
  if (reasoning == StructuredSpec::Reasoning::kNone) return nullptr;
  const bool inside = reasoning == StructuredSpec::Reasoning::kInside;
  return [inside](GrammarBuilder* b) {
    ByteSet space;
    space.set(' ');
    space.set('\n');
    const ExprPtr block =
        Seq({WithoutThinkClose(b), Literal(kThinkClose), Repeat(Bytes(space), 0, 4)});
    return inside ? block : Optional(Seq({Literal(kThinkOpen), block}));
  };
}

}  // namespace

std::string StructuredSpec::Key() const {
  std::string key = std::to_string(int(kind)) + (strict ? "s" : "-") + (compact ? "c" : "-") +
                    std::to_string(int(reasoning));
  key += '\0';
  key += text;
  for (const std::string& c : choices) {
    key += '\0';
    key += c;
  }
  return key;
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab,
                                 CompilerOptions options)
    : vocab_(std::move(vocab)), options_(options) {}

size_t GrammarCompiler::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::Compile(const StructuredSpec& spec) {
  size_t bytes = spec.text.size();
  for (const std::string& c : spec.choices) bytes += c.size();
  if (bytes > options_.max_spec_bytes) {
    throw GrammarError("the structured output specification is too large (" +
                       std::to_string(bytes) + " bytes, at most " +
                       std::to_string(options_.max_spec_bytes) + ")");
  }
  if (JsonNestingDepth(spec.text) > kMaxJsonDepth &&
      (spec.kind == StructuredSpec::Kind::kJsonSchema ||
       spec.kind == StructuredSpec::Kind::kToolCalls)) {
    throw GrammarError("the json schema nests deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels");
  }
  const std::string key = spec.Key();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
  }
  Limits limits;
  limits.prefix = ReasoningPrefix(spec.reasoning);
  limits.deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(options_.timeout_seconds));
  JsonSchemaOptions json_options;
  json_options.strict = spec.strict;
  json_options.compact = spec.compact;
  Grammar g;
  switch (spec.kind) {
    case StructuredSpec::Kind::kJsonSchema: {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(spec.text);
      } catch (const nlohmann::json::exception& e) {
        throw GrammarError(std::string("the json schema is not valid JSON: ") + e.what());
      }
      g = JsonSchemaGrammar(schema, json_options, limits);
      break;
    }
    case StructuredSpec::Kind::kJsonObject:
      g = JsonObjectGrammar(json_options, limits);
      break;
    case StructuredSpec::Kind::kRegex:
      g = RegexGrammar(spec.text, limits);
      break;
    case StructuredSpec::Kind::kChoice:
      g = ChoiceGrammar(spec.choices, limits);
      break;
    case StructuredSpec::Kind::kGrammar:
      g = EbnfGrammar(spec.text, limits);
      break;
    case StructuredSpec::Kind::kToolCalls:
      g = ToolCallsGrammar(spec.text, json_options, limits);
      break;
  }
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(g), vocab_);
  if (compiled->initial_state() == CompiledGrammar::kDead) {
    throw GrammarError(
        "the grammar is too ambiguous to run (its first state holds too many parses)");
  }
  // The first step's mask, ready (a grammar too ambiguous to mask in time is refused here).
  compiled->AllowedTokens(compiled->initial_state(), limits.deadline);
  if (std::chrono::steady_clock::now() > *limits.deadline) {
    throw GrammarError("the grammar did not compile within the time limit");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > options_.cache_size) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace llm::grammar
