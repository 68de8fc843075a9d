// response_format / structured_outputs / guided_* -> a compiled grammar on the request.
#include <string>
#include <vector>

#include "server/http/openai_api.h"

namespace llm::server {
namespace {

using json = nlohmann::ordered_json;  // schemas keep their properties' order
using grammar::StructuredSpec;

ApiError Bad(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, "invalid_parameter"};
}

template <typename J>
bool Present(const J& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// A schema given as an object or as JSON text.
std::string SchemaText(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() || v.is_boolean()) return v.dump();
  throw Bad(param, param + " must be a JSON schema (an object)");
}

std::vector<std::string> Choices(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) throw Bad(param, param + " must be a non-empty list of strings");
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) throw Bad(param, param + " must be a non-empty list of strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::string Text(const json& v, const std::string& param) {
  if (!v.is_string()) throw Bad(param, param + " must be a string");
  return v.get<std::string>();
}

// `ordered`: the same body with keys in the client's order (properties keep their order).
std::optional<StructuredSpec> ResponseFormat(const json& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    throw Bad("response_format", "response_format must be an object with a string type");
  }
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  StructuredSpec spec;
  if (type == "json_object") {
    spec.kind = StructuredSpec::Kind::kJsonObject;
    return spec;
  }
  if (type != "json_schema") {
    throw Bad("response_format.type",
              "response_format.type must be text, json_object or json_schema, got '" + type + "'");
  }
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) {
    throw Bad("response_format.json_schema", "response_format.json_schema must be an object");
  }
  const json& js = rf["json_schema"];
  if (js.contains("name") && !js["name"].is_string()) {
    throw Bad("response_format.json_schema.name", "json_schema.name must be a string");
  }
  spec.kind = StructuredSpec::Kind::kJsonSchema;
  // OpenAI's schema is optional (any JSON then); its "strict" asks for the supported subset.
  spec.text =
      Present(js, "schema") ? SchemaText(js["schema"], "response_format.json_schema.schema") : "{}";
  if (Present(js, "strict")) {
    if (!js["strict"].is_boolean()) {
      throw Bad("response_format.json_schema.strict", "json_schema.strict must be a boolean");
    }
    spec.strict = js["strict"].get<bool>();
  }
  return spec;
}

std::optional<StructuredSpec> StructuredOutputs(const json& so) {
  if (!so.is_object()) throw Bad("structured_outputs", "structured_outputs must be an object");
  std::vector<StructuredSpec> specs;
  StructuredSpec spec;
  if (Present(so, "json")) {
    spec.kind = StructuredSpec::Kind::kJsonSchema;
    spec.text = SchemaText(so["json"], "structured_outputs.json");
    specs.push_back(spec);
  }
  if (Present(so, "regex")) {
    spec = {};
    spec.kind = StructuredSpec::Kind::kRegex;
    spec.text = Text(so["regex"], "structured_outputs.regex");
    specs.push_back(spec);
  }
  if (Present(so, "choice")) {
    spec = {};
    spec.kind = StructuredSpec::Kind::kChoice;
    spec.choices = Choices(so["choice"], "structured_outputs.choice");
    specs.push_back(spec);
  }
  if (Present(so, "grammar")) {
    spec = {};
    spec.kind = StructuredSpec::Kind::kGrammar;
    spec.text = Text(so["grammar"], "structured_outputs.grammar");
    specs.push_back(spec);
  }
  if (Present(so, "json_object")) {
    if (!so["json_object"].is_boolean()) {
      throw Bad("structured_outputs.json_object",
                "structured_outputs.json_object must be a boolean");
    }
    if (so["json_object"].get<bool>()) {
      spec = {};
      spec.kind = StructuredSpec::Kind::kJsonObject;
      specs.push_back(spec);
    }
  }
  if (specs.size() > 1) {
    throw Bad("structured_outputs",
              "structured_outputs takes one of json, regex, choice, grammar, json_object");
  }
  if (specs.empty()) return std::nullopt;
  if (Present(so, "whitespace_pattern")) {
    throw Bad("structured_outputs.whitespace_pattern",
              "whitespace_pattern is not supported (whitespace between JSON tokens is bounded)");
  }
  return specs[0];
}

}  // namespace

grammar::StructuredSpec::Reasoning ReasoningFor(const ModelInfo& model, std::string_view prompt) {
  using R = grammar::StructuredSpec::Reasoning;
  if (!model.reasoning) return R::kNone;
  if (chat::PromptOpensReasoning(prompt)) return R::kInside;
  // A prompt whose end closed a block (Qwen3's enable_thinking false writes an empty one).
  const size_t close = prompt.rfind("</think>");
  if (close != std::string_view::npos &&
      prompt.find_first_not_of(" \n", close + 8) == std::string_view::npos) {
    return R::kNone;
  }
  return R::kOptional;
}

void ParseStructuredOutput(const nlohmann::json& unordered, std::string_view body_text,
                           const ModelInfo& model, SamplingParams* sp,
                           grammar::StructuredSpec::Reasoning reasoning) {
  bool any = false;
  for (const char* key : {"response_format", "structured_outputs", "guided_json", "guided_regex",
                          "guided_choice", "guided_grammar"}) {
    any = any || Present(unordered, key);
  }
  if (!any) return;
  // The body again with keys in the client's order (a schema's properties are produced in
  // the order it lists them).
  const json body = body_text.empty() ? json::parse(unordered.dump()) : json::parse(body_text);
  // Every source that is set, with the parameter name a 400 names.
  std::vector<std::pair<std::string, StructuredSpec>> found;
  if (Present(body, "response_format")) {
    if (auto s = ResponseFormat(body["response_format"])) found.push_back({"response_format", *s});
  }
  if (Present(body, "structured_outputs")) {
    if (auto s = StructuredOutputs(body["structured_outputs"])) {
      found.push_back({"structured_outputs", *s});
    }
  }
  const std::pair<const char*, StructuredSpec::Kind> guided[] = {
      {"guided_json", StructuredSpec::Kind::kJsonSchema},
      {"guided_regex", StructuredSpec::Kind::kRegex},
      {"guided_choice", StructuredSpec::Kind::kChoice},
      {"guided_grammar", StructuredSpec::Kind::kGrammar}};
  for (const auto& [key, kind] : guided) {
    if (!Present(body, key)) continue;
    StructuredSpec s;
    s.kind = kind;
    if (kind == StructuredSpec::Kind::kJsonSchema) {
      s.text = SchemaText(body[key], key);
    } else if (kind == StructuredSpec::Kind::kChoice) {
      s.choices = Choices(body[key], key);
    } else {
      s.text = Text(body[key], key);
    }
    found.push_back({key, s});
  }
  if (found.empty()) return;
  if (found.size() > 1) {
    throw Bad(found[1].first, "only one structured output may be asked for; got " + found[0].first +
                                  " and " + found[1].first);
  }
  auto& [param, spec] = found[0];
  if (!model.grammars) {
    throw Bad(param, "structured outputs are not available on this server");
  }
  spec.reasoning = reasoning;
  try {
    sp->grammar = model.grammars->Compile(spec);
  } catch (const grammar::GrammarError& e) {
    throw Bad(param, e.what());
  }
}

}  // namespace llm::server
