// Chat tools: `tools`, `tool_choice` and `parallel_tool_calls` checked; past tool calls made
// ready for the template; tool_choice "required" or a named function turned into the grammar
// of a tool call in the model family's format (so the call always parses, its arguments
// valid for the function's parameters).
#include <algorithm>
#include <random>

#include "engine/loader/json_file.h"
#include "server/http/openai_api.h"

namespace llm::server {
namespace {

using json = nlohmann::ordered_json;
using chat::ToolFormat;

ApiError Bad(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param, "invalid_parameter"};
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// {"type": "function", "function": {"name", "description", "parameters", "strict"}}.
const json& CheckTool(const json& tool, size_t i) {
  const std::string param = "tools[" + std::to_string(i) + "]";
  if (!tool.is_object()) throw Bad("tools", "tools must be a list of objects");
  if (tool.contains("type") && tool["type"] != "function") {
    throw Bad(param + ".type", "only tools of type \"function\" are supported");
  }
  if (!tool.contains("function") || !tool["function"].is_object()) {
    throw Bad(param + ".function", param + ".function must be an object");
  }
  const json& f = tool["function"];
  if (!f.contains("name") || !f["name"].is_string() || !ValidName(f["name"].get<std::string>())) {
    throw Bad(param + ".function.name",
              param + ".function.name must be 1 to 64 letters, digits, '_', '-' or '.'");
  }
  if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object()) {
    throw Bad(param + ".function.parameters",
              param + ".function.parameters must be a JSON schema (an object)");
  }
  if (f.contains("strict") && !f["strict"].is_null() && !f["strict"].is_boolean()) {
    throw Bad(param + ".function.strict", param + ".function.strict must be a boolean");
  }
  return f;
}

// The grammar of the calls a forced tool_choice allows, in the family's format (compiler.h:
// StructuredSpec::Kind::kToolCalls). A model without a known format writes a JSON list of
// {"name", "arguments"}, as Mistral does after its [TOOL_CALLS] marker.
grammar::StructuredSpec ForcedCallsSpec(ToolFormat format, const std::vector<const json*>& funcs,
                                        bool parallel) {
  json spec = json::object();
  std::string args_key = "arguments";
  switch (format) {
    case ToolFormat::kHermes:
      spec["prefix"] = "<tool_call>\n";
      spec["separator"] = "\n</tool_call>\n<tool_call>\n";
      spec["suffix"] = "\n</tool_call>";
      break;
    case ToolFormat::kLlama3Json:
      spec["prefix"] = "";
      spec["separator"] = "; ";
      spec["suffix"] = "";
      args_key = "parameters";
      break;
    case ToolFormat::kMistral:
    case ToolFormat::kNone:
      spec["prefix"] = "[";
      spec["separator"] = ", ";
      spec["suffix"] = "]";
      break;
  }
  spec["min"] = 1;
  // Llama 3.1's template refuses more than one call per message in the history.
  spec["max"] = parallel && format != ToolFormat::kLlama3Json ? -1 : 1;
  spec["items"] = json::array();
  for (const json* f : funcs) {
    // Arguments are an object: a schema without a type gets "object" (at its root, so that
    // its "#/$defs/..." references still resolve); one of another type is refused.
    json schema = json{{"type", "object"}, {"properties", json::object()}};
    if (f->contains("parameters") && (*f)["parameters"].is_object()) schema = (*f)["parameters"];
    if (!schema.contains("type")) schema["type"] = "object";
    const json& type = schema["type"];
    const bool object = type == "object" || (type.is_array() && std::find(type.begin(), type.end(),
                                                                          "object") != type.end());
    if (!object) {
      throw Bad("tools", "the parameters of \"" + (*f)["name"].get<std::string>() +
                             "\" must describe an object (type \"object\")");
    }
    if (type.is_array()) schema["type"] = "object";
    spec["items"].push_back(
        {{"before", "{\"name\": " + json((*f)["name"]).dump() + ", \"" + args_key + "\": "},
         {"schema", std::move(schema)},
         {"after", "}"},
         {"strict", f->contains("strict") && (*f)["strict"] == true}});
  }
  grammar::StructuredSpec s;
  s.kind = grammar::StructuredSpec::Kind::kToolCalls;
  s.text = spec.dump();
  return s;
}

}  // namespace

ToolsRequest ParseTools(const json& body, const ModelInfo& model) {
  ToolsRequest out;
  const bool has_tools = body.contains("tools") && !body["tools"].is_null();
  std::vector<const json*> funcs;
  if (has_tools) {
    if (!body["tools"].is_array()) throw Bad("tools", "tools must be a list of objects");
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      funcs.push_back(&CheckTool(body["tools"][i], i));
      out.names.push_back((*funcs.back())["name"].get<std::string>());
    }
  }
  bool parallel = true;
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    if (!body["parallel_tool_calls"].is_boolean()) {
      throw Bad("parallel_tool_calls", "parallel_tool_calls must be a boolean");
    }
    parallel = body["parallel_tool_calls"].get<bool>();
  }
  std::string choice = funcs.empty() ? "none" : "auto";
  std::vector<const json*> forced;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      choice = tc.get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required") {
        throw Bad("tool_choice",
                  "tool_choice must be \"none\", \"auto\", \"required\" or a named function");
      }
      if (choice == "required") forced = funcs;
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      const std::string name = tc["function"]["name"].get<std::string>();
      for (const json* f : funcs) {
        if ((*f)["name"] == name) forced.push_back(f);
      }
      if (forced.empty()) {
        throw Bad("tool_choice", "tool_choice names the function \"" + name +
                                     "\", which is not among the request's tools");
      }
      choice = "named";
    } else {
      throw Bad("tool_choice",
                "tool_choice must be \"none\", \"auto\", \"required\" or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (choice == "required" && funcs.empty()) {
      throw Bad("tool_choice", "tool_choice \"required\" needs a non-empty tools list");
    }
  }
  if (choice == "none") return out;
  out.format = model.tool_format;
  if (forced.empty()) return out;  // auto: the output is parsed, not constrained
  if (!model.grammars) {
    throw Bad("tool_choice", "tool_choice \"" + choice +
                                 "\" needs structured outputs, which this server does not have");
  }
  out.forced = true;
  if (out.format == ToolFormat::kNone) out.format = ToolFormat::kMistral;  // the JSON list
  out.spec = ForcedCallsSpec(model.tool_format, forced, parallel);
  return out;
}

std::shared_ptr<const grammar::CompiledGrammar> CompileForcedCalls(
    const ToolsRequest& tools, const ModelInfo& model,
    grammar::StructuredSpec::Reasoning reasoning) {
  grammar::StructuredSpec spec = tools.spec;
  spec.reasoning = reasoning;
  try {
    return model.grammars->Compile(spec);
  } catch (const grammar::GrammarError& e) {
    throw Bad("tools", std::string("the tools' parameters do not compile: ") + e.what());
  }
}

void PrepareToolMessages(json* messages) {
  for (json& m : *messages) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    // OpenAI clients send content null beside tool calls; templates test it as text (Qwen3's
    // `'</think>' in content` fails on none, in Jinja2 as here).
    if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
    for (json& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
        continue;
      }
      json& f = call["function"];
      // OpenAI sends arguments as JSON text; templates write them with tojson (Qwen, Llama)
      // and expect the object, as vLLM passes it.
      if (f.contains("arguments") && f["arguments"].is_string() &&
          JsonNestingDepth(f["arguments"].get<std::string>()) <= kMaxJsonDepth) {
        json args = json::parse(f["arguments"].get<std::string>(), nullptr, false);
        if (args.is_object()) f["arguments"] = std::move(args);
      }
    }
  }
}

std::string NewToolCallIdPrefix(ToolFormat format) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, sizeof(kAlnum) - 2);
  // Mistral's template wants ids of 9 letters and digits: 6 here and the call's index in 3
  // digits (ChatOutputOptions::id_digits).
  const int n = format == ToolFormat::kMistral ? 6 : 22;
  std::string id = format == ToolFormat::kMistral ? "" : "call_";
  for (int i = 0; i < n; ++i) id += kAlnum[pick(rng)];
  return id;
}

}  // namespace llm::server
