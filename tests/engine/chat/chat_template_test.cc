// ChatTemplate against transformers' renderings of real templates (expected.json, made by
// tests/tools/make_chat_template_refs.py), plus one test per construct and hostile inputs.
#include "engine/chat/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <fstream>

#include "engine/error.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using nlohmann::ordered_json;

std::string R(const std::string& source, const ordered_json& extra = ordered_json::object(),
              const ordered_json& messages = ordered_json::array(),
              bool add_generation_prompt = false) {
  return ChatTemplate::Parse(source).Render(messages, add_generation_prompt, extra);
}

TEST(ChatTemplateTest, MatchesTransformersOnRealTemplates) {
  auto dir = test::SourceDir() / "tests/data/chat_templates";
  ordered_json expected = ordered_json::parse(test::ReadFile(dir / "expected.json"));
  int num_cases = 0, num_errors = 0;
  for (const auto& c : expected["cases"]) {
    std::string name = c["template"].get<std::string>();
    SCOPED_TRACE(name + " / " + c["conversation"].get<std::string>() +
                 (c["add_generation_prompt"].get<bool>() ? " +gen" : ""));
    ChatTemplate tmpl = ChatTemplate::Parse(test::ReadFile(dir / (name + ".jinja")));
    ordered_json extra = c["variables"];
    if (c.contains("tools")) extra["tools"] = c["tools"];
    if (c.contains("expected_error")) {
      test::ExpectError([&] { tmpl.Render(c["messages"], c["add_generation_prompt"], extra); },
                        {c["expected_error"].get<std::string>()});
      ++num_errors;
    } else {
      EXPECT_EQ(tmpl.Render(c["messages"], c["add_generation_prompt"], extra),
                c["expected"].get<std::string>());
    }
    ++num_cases;
  }
  EXPECT_GE(num_cases, 100);
  std::cout << num_cases << " cases (" << num_errors << " expected errors) rendered by "
            << expected["renderer"].get<std::string>() << "\n";
}

TEST(ChatTemplateTest, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before it.
  EXPECT_EQ(R("  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}  {% if 1 %}z{% endif %}\n"),
            "  x\n  y  z");
  EXPECT_EQ(R("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(R("a\n  {%- if true -%}\n  b\n{%- endif %}"), "ab");
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(R("x {# note #}\ny\n  {# own line #}\nz"), "x y\nz");
  EXPECT_EQ(R("a\r\nb\n"), "a\nb");
}

TEST(ChatTemplateTest, Literals) {
  EXPECT_EQ(R("{{ 'it\\'s\\n' }}|{{ \"\\u00e9\\t\" }}|{{ 42 }}|{{ 1.5 }}|{{ 1e20 }}|{{ true }}|{{ "
              "None }}"),
            "it's\n|\xC3\xA9\t|42|1.5|1e+20|True|None");
  EXPECT_EQ(R("{{ [1, 'a', none] }}|{{ {'k': \"it's\"} }}|{{ (1, 2) }}"),
            "[1, 'a', None]|{'k': \"it's\"}|(1, 2)");
}

TEST(ChatTemplateTest, Arithmetic) {
  EXPECT_EQ(R("{{ 10/4 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1 + 2 * 3 }} {{ 'a' ~ "
              "1 ~ none }}"),
            "2.5 3 -4 2 1024 7 a1None");
  EXPECT_EQ(R("{{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1 + 1.5 }}"), "ababab [1, 2] 2.5");
  test::ExpectError([] { R("{{ 'a' + none }}"); }, {"unsupported operand", "+"});
  test::ExpectError([] { R("{{ 1 / 0 }}"); }, {"division by zero"});
}

TEST(ChatTemplateTest, ComparisonsAndLogic) {
  EXPECT_EQ(R("{{ 1 < 2 and 'b' > 'a' }} {{ 1 == 1.0 }} {{ 'x' in 'xyz' }} {{ 3 not in [1, 2] }} "
              "{{ 'k' in {'k': 1} }} {{ not 0 }} {{ none or 'd' }} {{ 0 and 1 }}"),
            "True True True True True True d 0");
  EXPECT_EQ(R("{{ 'a' if x else 'b' }}|{{ 'a' if x }}|{{ 'y' if not x is defined }}"), "b||y");
}

TEST(ChatTemplateTest, AccessAndSlicing) {
  ordered_json m = {{"role", "user"}, {"content", "hi"}};
  ordered_json extra = {{"m", m}, {"xs", {1, 2, 3, 4}}};
  EXPECT_EQ(R("{{ m['role'] }} {{ m.content }} {{ m.missing is defined }} {{ xs[-1] }} {{ xs[9] is "
              "defined }}",
              extra),
            "user hi False 4 False");
  EXPECT_EQ(R("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'hello'[1:3] }}", extra),
            "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] el");
  EXPECT_EQ(
      R("{{ m.get('role') }} {{ m.get('x', 'd') }} {{ m.keys() | list }} {{ m.values() | list }} "
        "{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}",
        extra),
      "user d ['role', 'content'] ['user', 'hi'] role=user;content=hi;");
  test::ExpectError([] { R("{{ nope.attr }}"); }, {"'nope' is undefined", "line 1"});
}

TEST(ChatTemplateTest, ForLoops) {
  ordered_json extra = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ x }}"
              "{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}",
              extra),
            "10"
            "3aTrueFalse3 21"
            "2bFalseFalse3 32"
            "1cFalseTrue3 ");
  EXPECT_EQ(R("{% for x in [] %}no{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in xs[1:] if x != 'c' %}{{ x }}{{ loop.length }}{% endfor %}", extra),
            "b1");
  EXPECT_EQ(
      R("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
        "{% endif %}{{ x }}{% endfor %}"),
      "02");
  EXPECT_EQ(R("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}"), "3,7,");
  // A set inside a loop body does not survive the iteration (Jinja2 scoping).
  EXPECT_EQ(R("{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{% endfor %}{{ x }}"),
            "000");
}

TEST(ChatTemplateTest, SetNamespaceMacro) {
  EXPECT_EQ(
      R("{% set ns = namespace(found=false, n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
        "{% set ns.found = true %}{% endfor %}{{ ns.found }} {{ ns.n }}"),
      "True 3");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{% set block %}x{{ a }}{% endset %}{{ block }}"),
            "2x1");
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('Bo') }} {{ greet('Al', punct='?') }}"),
            "Hi Bo! Hi Al?");
}

TEST(ChatTemplateTest, Filters) {
  ordered_json extra = {
      {"msgs", {{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "u"}}}}};
  EXPECT_EQ(R("{{ '  x \\n'|trim }}|{{ 'abc'|length }}|{{ 'h\xC3\xA9'|length }}|{{ 'Ab'|upper }}{{ "
              "'Ab'|lower }}|"
              "{{ 'hello wORLD-x'|title }}|{{ 'hELLO'|capitalize }}|{{ 'aXa'|replace('a', 'b') }}|"
              "{{ [1, 2]|join(', ') }}|{{ [1, 2]|first }}{{ [1, 2]|last }}|{{ x|default('d') }}|"
              "{{ 5|string }}|{{ 'ab'|list }}|{{ '42'|int + 1 }}|{{ [3, 4]|reverse|list }}"),
            "x|3|2|ABab|Hello World-X|Hello|bXb|1, 2|12|d|5|['a', 'b']|43|[4, 3]");
  EXPECT_EQ(R("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}"
              "{{ msgs|rejectattr('role', 'eq', 'user')|list|length }}{{ ['a', "
              "'b']|reject('equalto', 'a')|list }}",
              extra),
            "['u']1['b']");
  EXPECT_EQ(R("{{ {'a': [1, 'é'], 'b': none}|tojson }}"), "{\"a\": [1, \"é\"], \"b\": null}");
  EXPECT_EQ(R("{{ {'a': [1], 'e': {}}|tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1\n  ],\n  \"e\": {}\n}");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2}|items|list }}"), "[('b', 1), ('a', 2)]");
}

TEST(ChatTemplateTest, StringMethods) {
  EXPECT_EQ(R("{{ ' x '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a  '.rstrip() }}|{{ "
              "'abc'.startswith('ab') }}"
              "{{ 'abc'.endswith('bc') }}|{{ 'a b  c'.split() }}|{{ 'a,b'.split(',') }}|{{ "
              "'aB'.upper() }}"
              "{{ 'aB'.lower() }}|{{ 'a-a'.replace('a', 'o') }}|{{ 'hi there'.title() }}"),
            "x|a|a|TrueTrue|['a', 'b', 'c']|['a', 'b']|ABab|o-o|Hi There");
}

TEST(ChatTemplateTest, Tests) {
  ordered_json extra = {{"s", "x"}, {"d", {{"k", 1}}}, {"l", {1}}, {"n", nullptr}};
  EXPECT_EQ(
      R("{{ s is string }}{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}{{ n is none }}"
        "{{ n is not none }}{{ u is defined }}{{ u is undefined }}{{ 3 is odd }}{{ 4 is "
        "divisibleby 2 }}"
        "{{ 1 is number }}{{ s is equalto 'x' }}{{ false is sameas false }}",
        extra),
      "TrueTrueTrueTrueTrueFalseFalseTrueTrueTrueTrueTrueTrue");
}

TEST(ChatTemplateTest, Undefined) {
  EXPECT_EQ(
      R("[{{ x }}]{% if x %}t{% else %}f{% endif %}{{ x|length }}{% for i in x %}i{% endfor %}"),
      "[]f0");
}

TEST(ChatTemplateTest, RaiseExceptionAndTools) {
  test::ExpectError([] { R("{{ raise_exception('Bad roles!') }}"); },
                    {"raise_exception: Bad roles!", "line 1"});
  // Like transformers, `tools` is defined (none) unless given.
  EXPECT_EQ(R("{{ tools is defined }}{{ tools is none }}{{ documents is none }}"), "TrueTrueTrue");
  EXPECT_EQ(R("{{ tools|length }}", {{"tools", {1, 2}}}), "2");
}

TEST(ChatTemplateTest, SyntaxErrorsHaveLineAndColumn) {
  test::ExpectError([] { ChatTemplate::Parse("ok\n{% if x %}\nno end"); },
                    {"line 3", "missing '{% endif %}'"});
  test::ExpectError([] { ChatTemplate::Parse("a\n  {{ x + }}"); }, {"line 2, column 10"});
  test::ExpectError([] { ChatTemplate::Parse("{% raw %}x{% endraw %}"); },
                    {"line 1, column 4", "unsupported statement 'raw'"});
  test::ExpectError([] { ChatTemplate::Parse("{{ x | nosuchfilter }}"); },
                    {"unsupported filter 'nosuchfilter'"});
  test::ExpectError([] { ChatTemplate::Parse("{{ x is nosuchtest }}"); },
                    {"unsupported test 'nosuchtest'"});
  test::ExpectError([] { ChatTemplate::Parse("{{ 'unterminated }}"); }, {"unterminated string"});
  test::ExpectError([] { ChatTemplate::Parse("text {{ x "); },
                    {"line 1, column 6", "unterminated '{{'"});
  test::ExpectError([] { ChatTemplate::Parse("{% if x %}{% endfor %}"); }, {"expected 'endif'"});
  test::ExpectError([] { ChatTemplate::Parse("{# never closed"); }, {"unterminated comment"});
}

// What the interpreter cannot render is an llm::Error that names the construct (the statement,
// filter, test, method or argument), at Parse when it can be seen there, never a prompt
// rendered without it.
TEST(ChatTemplateTest, WhatItCannotRenderIsAnErrorNamingTheConstruct) {
  for (const char* statement : {"include", "import", "from", "extends", "block", "call", "with",
                                "do", "autoescape", "raw", "trans"}) {
    test::ExpectError([&] { ChatTemplate::Parse(std::string("{% ") + statement + " x %}"); },
                      {"unsupported statement '" + std::string(statement) + "'"});
  }
  test::ExpectError([] { ChatTemplate::Parse("{% for x in xs recursive %}{% endfor %}"); },
                    {"recursive loops are not supported"});
  for (const char* filter : {"format", "wordcount", "batch", "center", "groupby", "xmlattr"}) {
    test::ExpectError([&] { ChatTemplate::Parse(std::string("{{ x | ") + filter + " }}"); },
                      {"unsupported filter '" + std::string(filter) + "'"});
  }
  test::ExpectError([] { ChatTemplate::Parse("{{ x is escaped }}"); },
                    {"unsupported test 'escaped'"});
  test::ExpectError([] { ChatTemplate::Parse("{% filter nosuch %}x{% endfilter %}"); },
                    {"unsupported filter 'nosuch'"});
  test::ExpectError([] { ChatTemplate::Parse("{{ f(*xs) }}"); }, {"unexpected '*'"});
  test::ExpectError([] { ChatTemplate::Parse("{{ f(**kw) }}"); }, {"unexpected '**'"});
  // At render time: methods that str and dict do not have, a macro's extra arguments.
  test::ExpectError([] { R("{{ 'abc'.zfill(5) }}"); },
                    {"'string' object has no method 'zfill'", "line 1"});
  test::ExpectError([] { R("{{ {'a': 1}.pop('a') }}"); }, {"'dict' object has no method 'pop'"});
  test::ExpectError([] { R("{% for x in [1] %}{{ loop.changed(x) }}{% endfor %}"); },
                    {"has no method 'changed'"});
  test::ExpectError([] { R("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"); },
                    {"macro 'm' takes not more than 1 argument(s)"});
  test::ExpectError([] { R("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}"); },
                    {"macro 'm' takes no keyword argument 'b'"});
  test::ExpectError([] { R("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}"); },
                    {"'caller' is undefined"});
}

TEST(ChatTemplateTest, FilterBlocksTuplesAndMacroArguments) {
  EXPECT_EQ(R("{% filter upper %}ab{{ 'c' }}{% endfilter %}|{% filter trim|replace('A', 'x') %} "
              "aAb {% endfilter %}"),
            "ABC|axb");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}|{{ (1,) }}|{{ {'k': 1}.items()|list }}"),
            "12|(1,)|[('k', 1)]");
  EXPECT_EQ(R("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}"),
            "1(2,){'k': 3}");
  EXPECT_EQ(R("{% for x in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}"), "10");
  EXPECT_EQ(R("{% set ns = namespace(a=1) %}{{ ns }}"), "<Namespace {'a': 1}>");
}

TEST(ChatTemplateTest, UnicodeStrings) {
  // str.strip() and |trim strip Unicode whitespace (U+00A0, U+3000, ...); case mappings are
  // Unicode's (ß -> SS); lengths, find and slices count code points.
  EXPECT_EQ(
      R("[{{ s|trim }}|{{ s.strip() }}|{{ s.split() }}]", {{"s", "\u00a0 a b\u3000c \u2028"}}),
      "[a b\u3000c|a b\u3000c|['a', 'b', 'c']]");
  EXPECT_EQ(R("{{ 'ß'|upper }}{{ 'ÀÉ'|lower }}{{ 'élan vital'|title }}{{ 'élan'|capitalize }}"),
            "SSàéÉlan VitalÉlan");
  EXPECT_EQ(R("{{ s|length }}{{ s.find('l') }}{{ s[::-1] }}{{ s.strip('hé') }}", {{"s", "héllo"}}),
            "52olléhllo");
  EXPECT_EQ(R("{{ s|tojson }}|{{ s|tojson(ensure_ascii=true) }}", {{"s", "é😀"}}),
            "\"é😀\"|\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_EQ(R("{{ {'b': 1, 'a': [1, 2]}|tojson(separators=(',', ':'), sort_keys=true) }}"),
            "{\"a\":[1,2],\"b\":1}");
}

TEST(ChatTemplateTest, SortUniqueDictsortMinMax) {
  EXPECT_EQ(R("{{ [3, 1, 2]|sort(reverse=true) }}{{ ['b', 'A', 'a']|sort }}{{ ['b', 'A', "
              "'a']|unique|list }}{{ {'b': 1, 'a': 2}|dictsort }}{{ [3, 1, 2]|max }}{{ [3, 1, "
              "2]|min }}{{ [1, 2, 3]|sum }}"),
            "[3, 2, 1]['A', 'a', 'b']['b', 'A'][('a', 2), ('b', 1)]316");
  ordered_json extra = {{"xs", {{{"n", "b"}, {"k", 2}}, {{"n", "a"}, {"k", 1}}}}};
  EXPECT_EQ(R("{{ xs|sort(attribute='k')|map(attribute='n')|join }}{{ (xs|max(attribute='k')).n }}",
              extra),
            "abb");
}

TEST(ChatTemplateTest, HostileTemplatesFailQuickly) {
  // "Quickly" is the work done, so it is measured in this process's CPU time: wall time also
  // counts whatever else the machine runs (it once read 10.2 s under a loaded ctest -j2).
  const std::clock_t start = std::clock();
  std::string deep_expr = std::string(5000, '(') + "1" + std::string(5000, ')');
  test::ExpectError([&] { ChatTemplate::Parse("{{ " + deep_expr + " }}"); }, {"nested too deeply"});
  std::string deep_blocks;
  for (int i = 0; i < 5000; ++i) deep_blocks += "{% if true %}";
  test::ExpectError([&] { ChatTemplate::Parse(deep_blocks); }, {"nested too deeply"});
  test::ExpectError([] { R("{% for i in range(1000000000) %}{% endfor %}"); },
                    {"range() longer than"});
  test::ExpectError(
      [] {
        R("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}");
      },
      {"loop iterations exceed"});
  test::ExpectError(
      [] {
        R("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s "
          "%}"
          "{% endfor %}");
      },
      {"exceeds"});
  test::ExpectError([] { R("{{ 'x' * 1000000000 }}"); }, {"exceeds"});
  test::ExpectError([] { R("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"); },
                    {"rendered output exceeds"});
  test::ExpectError([] { R("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); },
                    {"nested deeper"});
  test::ExpectError([] { R("{{ 2 ** 1000 }}"); }, {"too large"});
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  EXPECT_LT(seconds, 10.0 * test::SlowFactor());
}

// Regression (CI fuzz smoke, tests/fuzz/corpus/chat_template/namespace-cycle.seed): a namespace
// that holds itself, directly or through a list or dict, is a shared_ptr cycle; the render
// frees it on the way out. The leak check is LeakSanitizer's (the asan CI stage runs this).
TEST(ChatTemplateTest, NamespaceCyclesAreFreedAfterTheRender) {
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% set ns.n = ns %}ok"), "ok");
  EXPECT_EQ(R("{% set ns = namespace(l=[]) %}{% set ns.l = [ns, ns] %}{{ ns.l | length }}"), "2");
  EXPECT_EQ(R("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}"
              "{% set a.d = {'x': a} %}{{ a.d.x.b.a is defined }}"),
            "True");
  test::ExpectError(
      [] { R("{% set ns = namespace() %}{% set ns.me = ns %}{{ raise_exception('x') }}"); }, {"x"});
}

// Regression (CI fuzz smoke, tests/fuzz/corpus/chat_template/namespace-cycle-print.seed:
// `{% set ns.n = ns %}...{{ ns.n }}` recursed until the stack overflowed): a namespace met
// again inside itself prints as Python's repr does ({...} for the dict being printed), and
// values too deep to walk are a render error (Python's RecursionError), never a crash: lists
// nested past kMaxValueDepth are refused when built, a namespace chain when printed.
TEST(ChatTemplateTest, SelfHoldingAndDeepValuesPrintOrFailCleanly) {
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns }}|{{ ns.n }}"),
            "<Namespace {'n': <Namespace {...}>}>|<Namespace {'n': <Namespace {...}>}>");
  EXPECT_EQ(R("{% set ns = namespace(l=1) %}{% set ns.l = [ns, {'k': ns}] %}{{ ns.l }}"),
            "[<Namespace {'l': [<Namespace {...}>, {'k': <Namespace {...}>}]}>, "
            "{'k': <Namespace {'l': [<Namespace {...}>, {'k': <Namespace {...}>}]}>}]");
  // Lists 1,000 deep build and print; 1,100 are refused as they are built.
  EXPECT_EQ(R("{% set ns = namespace(x=0) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}"
              "{% endfor %}{{ (ns.x | string) | length }}"),
            "2001");
  test::ExpectError(
      [] {
        R("{% set ns = namespace(x=0) %}{% for i in range(1100) %}{% set ns.x = [ns.x] %}"
          "{% endfor %}");
      },
      {"nested deeper than 1024"});
  // 5,000 namespaces, each holding the one before: built (references), refused when printed.
  test::ExpectError(
      [] {
        R("{% set ns = namespace(x=0) %}{% for i in range(5000) %}"
          "{% set ns.x = namespace(x=ns.x) %}{% endfor %}{{ ns }}");
      },
      {"nested deeper than 1024 levels to print"});
}

TEST(ChatTemplateTest, SourceFromTokenizerConfig) {
  EXPECT_EQ(ChatTemplateSource(nlohmann::json{{"chat_template", "T"}}), "T");
  nlohmann::json named = {
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "A"}}, {{"name", "default"}, {"template", "B"}}}}};
  EXPECT_EQ(ChatTemplateSource(named), "B");
  EXPECT_EQ(ChatTemplateSource(named, "tool_use"), "A");
  test::ExpectError(
      [] {
        ChatTemplateSource(nlohmann::json{{"bos_token", "<s>"}});
      },
      {"no chat_template"});
}

}  // namespace
}  // namespace llm
