// The grammar engine on its own: regexes, choices, EBNF and JSON Schema lowered to byte-level
// automata (which strings they accept and refuse), token masks against a brute-force check
// of every token, and the sampler drawing only valid outputs from random logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/grammar/compiler.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/sample/sampler.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace llm::grammar {
namespace {

using json = nlohmann::ordered_json;

// A small vocabulary: every single byte, some multi-byte tokens, one EOS (id 0) and one
// special token (id 1) that must never be allowed.
std::shared_ptr<const TokenVocabulary> SmallVocab() {
  std::vector<std::optional<std::string>> bytes;
  bytes.push_back(std::nullopt);  // 0: EOS
  bytes.push_back(std::nullopt);  // 1: special
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  for (const char* t :
       {"{\"", "\":",  "\"}", "true", "false", "null", "ab", "abc",  "123",      " \"",
        "\",", "\n  ", "é",   "\xC3", "\xA9",  "[1",   ", ", "name", "\"name\"", "})"}) {
    bytes.push_back(std::string(t));
  }
  bytes.push_back(std::string());  // an empty token: never allowed
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int>{0},
                                                 int64_t(bytes.size() + 5));
}

std::shared_ptr<const CompiledGrammar> Compile(Grammar g) {
  return std::make_shared<const CompiledGrammar>(std::move(g), SmallVocab());
}

bool Accepts(const CompiledGrammar& g, std::string_view text) {
  const int32_t s = g.NextBytes(g.initial_state(), text);
  return s >= 0 && g.IsAccepting(s);
}
bool IsPrefix(const CompiledGrammar& g, std::string_view text) {
  return g.NextBytes(g.initial_state(), text) >= 0;
}

bool Bit(const uint32_t* m, int id) { return (m[id / 32] >> (id % 32)) & 1u; }

void CheckMasksAlongText(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text);

TEST(GrammarRegex, AcceptsExactlyItsLanguage) {
  auto g = Compile(RegexGrammar(R"(^(\d{3})-[a-z]+(x|yz)?$)"));
  EXPECT_TRUE(Accepts(*g, "123-abc"));
  EXPECT_TRUE(Accepts(*g, "123-abcyz"));
  EXPECT_TRUE(Accepts(*g, "000-qx"));
  EXPECT_FALSE(Accepts(*g, "12-abc"));
  EXPECT_FALSE(Accepts(*g, "123-"));
  EXPECT_FALSE(Accepts(*g, "123-ABC"));
  EXPECT_TRUE(IsPrefix(*g, "123-a"));
  EXPECT_FALSE(IsPrefix(*g, "123a"));
}

TEST(GrammarRegex, UnicodeClassesAndEscapes) {
  auto g = Compile(RegexGrammar(R"([^a-c]\s\w+\.[α-ω]{2}\u00e9?\x41)"));
  EXPECT_TRUE(Accepts(*g, "z a_9.αωA"));
  EXPECT_TRUE(Accepts(*g, "\xE2\x82\xAC\ta.βγéA"));  // € is outside [a-c]
  EXPECT_FALSE(Accepts(*g, "a a.αωA"));
  EXPECT_FALSE(Accepts(*g, "z a.αA"));
  EXPECT_FALSE(IsPrefix(*g, "\xED\xA0\x80"));  // a surrogate is not a character
  auto dot = Compile(RegexGrammar("a.c"));
  EXPECT_TRUE(Accepts(*dot,
                      "a\xF0\x9F\x98\x80"
                      "c"));
  EXPECT_FALSE(Accepts(*dot, "a\nc"));
}

TEST(GrammarRegex, BoundedRepetition) {
  auto g = Compile(RegexGrammar("(ab|c){2,3}d*"));
  EXPECT_FALSE(Accepts(*g, "ab"));
  EXPECT_TRUE(Accepts(*g, "abc"));
  EXPECT_TRUE(Accepts(*g, "ccab"));
  EXPECT_TRUE(Accepts(*g, "ccabddd"));
  EXPECT_FALSE(Accepts(*g,
                       "ababab"
                       "c"));
}

TEST(GrammarRegex, UnsupportedSyntaxIsAnErrorNamingIt) {
  for (const char* p : {"(a)\\1", "a(?=b)", "a++", "(?i)a", "a\\bb", "[z-a]", "(ab", "ab)",
                        "a{3,2}", "a{99999}", "a^b"}) {
    EXPECT_THROW(RegexGrammar(p), GrammarError) << p;
  }
  try {
    RegexGrammar("a(?=b)");
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("lookaround"), std::string::npos) << e.what();
  }
}

// A quantifier on a quantifier is an error, as in ECMAScript (new RegExp("a{2}{3}", "u")
// throws "Nothing to repeat"); a repetition of a repetition is written with a group, and a
// brace that is no quantifier stays a literal.
TEST(GrammarRegex, QuantifierOnAQuantifierIsAnError) {
  for (const char* p : {"a{2}{3}", "a{2}{3,}", "a{2,}{3,4}", "a*{2}", "a{2}?{3}", "a{2}*"}) {
    try {
      RegexGrammar(p);
      ADD_FAILURE() << p << " compiled";
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find("quantifier follows a quantifier"), std::string::npos)
          << e.what();
    }
  }
  auto g = Compile(RegexGrammar("(a{2}){3}"));
  EXPECT_TRUE(Accepts(*g, "aaaaaa"));
  EXPECT_FALSE(Accepts(*g, "aaaa"));
  auto brace = Compile(RegexGrammar("a{2}{x}"));
  EXPECT_TRUE(Accepts(*brace, "aa{x}"));
}

// A star or plus over a body that can match nothing is not left recursion (the repetition
// continues at its parent, so an empty round revisits a seen expansion): (a?)* is a*.
TEST(GrammarRegex, NullableBodyOfAStar) {
  for (const char* p : {"(a?)*", "(a?)+", "(a*)*", "(a|b?)*c", "((a?)*)*", "(a?b?)*"}) {
    auto g = Compile(RegexGrammar(p));
    const bool needs_c = std::string(p).back() == 'c';
    EXPECT_TRUE(Accepts(*g, needs_c ? "c" : "")) << p;
    EXPECT_TRUE(Accepts(*g, needs_c ? "aaac" : "aaa")) << p;
    EXPECT_FALSE(IsPrefix(*g, "x")) << p;
    int32_t s = g->initial_state();
    for (int i = 0; i < 1000; ++i) s = g->Next(s, 'a');
    ASSERT_GE(s, 0) << p;
    EXPECT_LE(g->stats().states, 6u) << p;
    CheckMasksAlongText(g, needs_c ? "aac" : "aa");
  }
  auto e = Compile(EbnfGrammar("root ::= (ws item)* \"!\"\nws ::= \" \"?\nitem ::= \"x\"?"));
  EXPECT_TRUE(Accepts(*e, "!"));
  EXPECT_TRUE(Accepts(*e, " x xx !"));
  EXPECT_FALSE(Accepts(*e, "  y!"));
  // Left recursion that grows the stack is still refused.
  EXPECT_THROW(EbnfGrammar("root ::= a\na ::= b \"x\" | \"y\"\nb ::= a"), GrammarError);
  EXPECT_THROW(EbnfGrammar("root ::= a\na ::= \"\"? a \"x\" | \"y\""), GrammarError);
}

TEST(GrammarChoice, OneOfTheStrings) {
  auto g = Compile(ChoiceGrammar({"yes", "no", "yes!"}));
  EXPECT_TRUE(Accepts(*g, "yes"));
  EXPECT_TRUE(Accepts(*g, "yes!"));
  EXPECT_TRUE(Accepts(*g, "no"));
  EXPECT_FALSE(Accepts(*g, "n"));
  EXPECT_FALSE(Accepts(*g, "maybe"));
}

TEST(GrammarEbnf, RulesRecursionAndErrors) {
  auto g = Compile(EbnfGrammar(R"(
    root ::= list            # a comment
    list ::= "[" (item ("," item)*)? "]"
    item ::= [0-9]+ | list | 'x'{2}
  )"));
  EXPECT_TRUE(Accepts(*g, "[]"));
  EXPECT_TRUE(Accepts(*g, "[1,[2,[]],xx]"));
  EXPECT_FALSE(Accepts(*g, "[1,]"));
  EXPECT_FALSE(Accepts(*g, "[x]"));
  EXPECT_THROW(EbnfGrammar("root ::= a\na ::= a \"x\" | \"y\""), GrammarError);  // left-recursive
  EXPECT_THROW(EbnfGrammar("root ::= missing"), GrammarError);
  EXPECT_THROW(EbnfGrammar("start ::= \"a\""), GrammarError);  // no root
  EXPECT_THROW(EbnfGrammar("root ::= \"a"), GrammarError);
}

Grammar Schema(const char* text, bool strict = false) {
  JsonSchemaOptions o;
  o.strict = strict;
  return JsonSchemaGrammar(json::parse(text), o);
}

TEST(GrammarJsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  auto g = Compile(Schema(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":4},"age":{"type":"integer","minimum":0,"maximum":120},
      "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
      "required":["name"],"additionalProperties":false})"));
  EXPECT_TRUE(Accepts(*g, R"({"name":"bob"})"));
  EXPECT_TRUE(Accepts(*g, R"({"name":"bob","age":7,"tags":["a","b"]})"));
  EXPECT_TRUE(Accepts(*g, "{\n  \"name\": \"\\\"x\",\n  \"tags\": []\n}"));
  EXPECT_TRUE(Accepts(*g, R"({"name":"","age":120})"));
  EXPECT_FALSE(Accepts(*g, R"({"age":7})"));                          // name is required
  EXPECT_FALSE(Accepts(*g, R"({"name":"bobby"})"));                   // maxLength
  EXPECT_FALSE(Accepts(*g, R"({"name":"b","age":121})"));             // maximum
  EXPECT_FALSE(Accepts(*g, R"({"name":"b","age":-1})"));              // minimum
  EXPECT_FALSE(Accepts(*g, R"({"name":"b","age":007})"));             // leading zeros
  EXPECT_FALSE(Accepts(*g, R"({"name":"b","tags":["a","b","a"]})"));  // maxItems
  EXPECT_FALSE(Accepts(*g, R"({"name":"b",})"));
  EXPECT_FALSE(Accepts(*g, "{\"name\":\"b\"}  "));  // no trailing whitespace
  EXPECT_FALSE(IsPrefix(*g, "{  "));                // at most one space between tokens
}

TEST(GrammarJsonSchema, IntegerRangesAreExact) {
  for (auto [lo, hi] :
       std::vector<std::pair<int, int>>{{-25, 17}, {3, 3}, {-1000, -990}, {95, 1203}}) {
    const std::string s = "{\"type\":\"integer\",\"minimum\":" + std::to_string(lo) +
                          ",\"maximum\":" + std::to_string(hi) + "}";
    auto g = Compile(JsonSchemaGrammar(json::parse(s)));
    for (int v = lo - 30; v <= hi + 30; ++v) {
      EXPECT_EQ(Accepts(*g, std::to_string(v)), v >= lo && v <= hi) << s << " " << v;
    }
  }
  auto ex = Compile(Schema(R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":3})"));
  EXPECT_FALSE(Accepts(*ex, "0"));
  EXPECT_TRUE(Accepts(*ex, "1"));
  EXPECT_TRUE(Accepts(*ex, "2"));
  EXPECT_FALSE(Accepts(*ex, "3"));
}

TEST(GrammarJsonSchema, RefsUnionsPatternsAndTuples) {
  auto g = Compile(Schema(R"({
    "$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
             "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},
             "required":["v"],"additionalProperties":false}},
    "type":"object","properties":{
      "root":{"$ref":"#/$defs/node"},
      "id":{"type":"string","pattern":"^[A-Z]{2}-\\d+$"},
      "maybe":{"type":["string","null"]},
      "pair":{"type":"array","prefixItems":[{"type":"boolean"},{"const":"k"}],"items":false,"minItems":2},
      "any":{"anyOf":[{"type":"integer"},{"type":"object","properties":{"q":{"const":1}},"required":["q"]}]}
    },"required":["root","id","pair"]})"));
  EXPECT_TRUE(Accepts(
      *g, R"({"root":{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]},"id":"AB-12","pair":[true,"k"]})"));
  EXPECT_TRUE(
      Accepts(*g, R"({"root":{"v":1},"id":"ZZ-0","maybe":null,"pair":[false,"k"],"any":{"q":1}})"));
  EXPECT_FALSE(Accepts(*g, R"({"root":{"v":1},"id":"A-12","pair":[true,"k"]})"));
  EXPECT_FALSE(Accepts(*g, R"({"root":{"v":1},"id":"AB-12","pair":[true]})"));
  EXPECT_FALSE(Accepts(*g, R"({"root":{"kids":[]},"id":"AB-12","pair":[true,"k"]})"));
}

TEST(GrammarJsonSchema, AllOfMergesObjects) {
  auto g = Compile(Schema(R"({"allOf":[
      {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
      {"properties":{"b":{"type":"boolean"}},"required":["b"]}]})"));
  EXPECT_TRUE(Accepts(*g, R"({"a":1,"b":true})"));
  EXPECT_FALSE(Accepts(*g, R"({"a":1})"));
}

// Keywords beside $ref apply with it (draft 2019+): {"$ref": X, ...} is allOf [X, the rest],
// merged as allOf merges (bounds tightened), also under strict and through recursion.
TEST(GrammarJsonSchema, KeywordsBesideRefApply) {
  for (bool strict : {false, true}) {
    auto s = Compile(Schema(R"({"$defs":{"s":{"type":"string","maxLength":10}},
        "$ref":"#/$defs/s","maxLength":2})",
                            strict));
    EXPECT_TRUE(Accepts(*s, R"("ab")"));
    EXPECT_FALSE(Accepts(*s, R"("abc")"));
    auto n = Compile(Schema(R"({"$defs":{"n":{"type":"integer","minimum":-10}},
        "$ref":"#/$defs/n","minimum":0,"maximum":5})",
                            strict));
    EXPECT_TRUE(Accepts(*n, "0"));
    EXPECT_TRUE(Accepts(*n, "5"));
    EXPECT_FALSE(Accepts(*n, "-1"));
    EXPECT_FALSE(Accepts(*n, "6"));
  }
  auto tree = Compile(Schema(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node","required":["v"]}}}}},
      "$ref":"#/$defs/node"})"));
  EXPECT_TRUE(Accepts(*tree, R"({"kids":[{"v":1,"kids":[{"v":2}]}]})"));
  EXPECT_FALSE(Accepts(*tree, R"({"kids":[{"v":1,"kids":[{}]}]})"));
  auto all = Compile(Schema(R"({"allOf":[{"type":"integer","minimum":0,"maximum":10},
      {"minimum":3,"maximum":20}]})"));
  EXPECT_FALSE(Accepts(*all, "2"));
  EXPECT_TRUE(Accepts(*all, "3"));
  EXPECT_TRUE(Accepts(*all, "10"));
  EXPECT_FALSE(Accepts(*all, "11"));
  EXPECT_THROW(Schema(R"({"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","type":"integer"})"),
               GrammarError);
}

// Keywords beside anyOf / oneOf merge into each alternative the way allOf merges: the
// properties unioned (one named by both gets both schemas), required unioned; an
// alternative they contradict is dropped.
TEST(GrammarJsonSchema, KeywordsBesideAnyOfMergeIntoEachAlternative) {
  for (const char* key : {"anyOf", "oneOf"}) {
    const std::string text = std::string(R"({"type":"object","properties":{
        "a":{"type":"integer","minimum":0}},"required":["a"],")") +
                             key + R"(":[
        {"properties":{"a":{"maximum":5},"b":{"type":"string"}},"required":["b"]},
        {"properties":{"c":{"type":"boolean"}},"required":["c"]}]})";
    auto g = Compile(Schema(text.c_str()));
    EXPECT_TRUE(Accepts(*g, R"({"a":1,"b":"x"})")) << key;
    EXPECT_TRUE(Accepts(*g, R"({"a":9,"c":true})")) << key;
    EXPECT_FALSE(Accepts(*g, R"({"b":"x"})")) << key;          // a is required beside anyOf
    EXPECT_FALSE(Accepts(*g, R"({"a":1})")) << key;            // b or c
    EXPECT_FALSE(Accepts(*g, R"({"a":6,"b":"x"})")) << key;    // the branch's maximum
    EXPECT_FALSE(Accepts(*g, R"({"a":-1,"c":true})")) << key;  // the sibling's minimum
  }
  auto s = Compile(Schema(R"({"type":"string","anyOf":[{"type":"null"},{"maxLength":2}]})"));
  EXPECT_TRUE(Accepts(*s, R"("ab")"));
  EXPECT_FALSE(Accepts(*s, R"("abc")"));
  EXPECT_FALSE(Accepts(*s, "null"));  // contradicts type string: dropped
  EXPECT_THROW(Schema(R"({"type":"string","anyOf":[{"type":"null"},{"type":"integer"}]})"),
               GrammarError);
}

// Every number produced is a finite double: exponents stop at 292 in magnitude (1e999 was
// allowed, and JSON.parse reads it as Infinity); bounds beside a $ref or in allOf hold.
TEST(GrammarJsonSchema, NumbersAreFiniteDoublesAndBoundsHold) {
  auto g = Compile(Schema(R"({"type":"number"})"));
  const std::string biggest = std::string(15, '9') + "." + std::string(15, '9');
  for (int e = 0; e <= 999; ++e) {
    for (const char* sign : {"e", "E+", "e-"}) {
      const std::string text = "-" + biggest + sign + std::to_string(e);
      EXPECT_EQ(Accepts(*g, text), e <= 292) << text;
      if (e <= 292) {
        const double v = std::strtod(text.c_str(), nullptr);
        EXPECT_TRUE(std::isfinite(v) && v != 0) << text;
      }
    }
  }
  EXPECT_TRUE(Accepts(*g, "0.000000000000001e-292"));
  EXPECT_TRUE(std::strtod("0.000000000000001e-292", nullptr) > 0);
  for (const char* schema :
       {R"({"$defs":{"n":{"type":"number","minimum":-5}},"$ref":"#/$defs/n","maximum":5})",
        R"({"allOf":[{"type":"number"},{"maximum":5,"minimum":-5}]})",
        R"({"type":"number","anyOf":[{"maximum":5}],"minimum":-5})"}) {
    auto b = Compile(Schema(schema));
    EXPECT_TRUE(Accepts(*b, "5")) << schema;
    for (const char* out : {"1e999", "6", "1e1", "-6", "1e292"}) {
      EXPECT_FALSE(Accepts(*b, out)) << schema << " " << out;
    }
  }
}

TEST(GrammarJsonSchema, StrictNamesUnsupportedKeywords) {
  EXPECT_NO_THROW(Schema(R"({"type":"string","format":"email"})"));
  try {
    Schema(R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})", true);
    FAIL() << "no error";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("uniqueItems"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("#/properties/a"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Schema(R"({"$ref":"#/$defs/nope"})"), GrammarError);
  EXPECT_THROW(Schema(R"({"$ref":"#"})"), GrammarError);  // left-recursive
  EXPECT_THROW(Schema(R"({"type":"strin"})"), GrammarError);
  EXPECT_THROW(Schema(R"({"type":"integer","minimum":5,"maximum":1})"), GrammarError);
  EXPECT_THROW(Schema(R"(false)"), GrammarError);
  std::string deep = "{\"type\":\"string\"}";
  for (int i = 0; i < 100; ++i) deep = "{\"type\":\"array\",\"items\":" + deep + "}";
  EXPECT_THROW(JsonSchemaGrammar(json::parse(deep)), GrammarError);
}

TEST(GrammarJsonSchema, JsonObjectAcceptsAnyObjectOnly) {
  auto g = Compile(JsonObjectGrammar());
  EXPECT_TRUE(Accepts(*g, R"({"a":[1,2.5e-3,{"b":null}],"c":"\u00e9\n"})"));
  EXPECT_TRUE(Accepts(*g, "{}"));
  EXPECT_FALSE(Accepts(*g, "[]"));
  EXPECT_FALSE(Accepts(*g, R"({"a":01})"));
  EXPECT_FALSE(Accepts(*g, "{\"a\":\"\x01\"}"));  // a raw control character
}

TEST(GrammarJsonSchema, CompileDeadline) {
  Limits limits;
  limits.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  std::string big = "{\"type\":\"object\",\"properties\":{";
  for (int i = 0; i < 3000; ++i) {
    if (i > 0) big += ",";
    big += "\"p";
    big += std::to_string(i);
    big += "\":{\"type\":\"string\"}";
  }
  big += "}}";
  EXPECT_THROW(JsonSchemaGrammar(json::parse(big), {}, limits), GrammarError);
}

// The mask against the definition: token t is allowed iff its bytes keep the output a prefix
// of the language (EOS iff the output is complete; special and empty tokens never).
void CheckMasksAlongText(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  const TokenVocabulary& v = g->vocab();
  int32_t state = g->initial_state();
  for (size_t i = 0; i <= text.size(); ++i) {
    auto mask = g->AllowedTokens(state);
    for (int id = 0; id < v.mask_vocab(); ++id) {
      bool want = false;
      if (v.IsEos(id)) {
        want = g->IsAccepting(state);
      } else if (const std::string* b = v.bytes(id); b && !b->empty()) {
        want = g->NextBytes(state, *b) >= 0;
      }
      ASSERT_EQ(Bit(mask->data(), id), want) << "at " << i << " token " << id;
    }
    if (i < text.size()) state = g->Next(state, uint8_t(text[i]));
    ASSERT_GE(state, 0);
  }
}

TEST(GrammarMask, EqualsBruteForceAlongAnOutput) {
  CheckMasksAlongText(Compile(Schema(R"({"type":"object","properties":{"name":{"type":"string"},
      "ok":{"type":"boolean"}},"required":["name","ok"]})")),
                      "{\"name\": \"ab\\u00e9\xC3\xA9\", \"ok\": true}");
  CheckMasksAlongText(Compile(RegexGrammar("[0-9]{1,3}(abc)?")), "12abc");
}

// States where every plain byte (printable ASCII but " and \) leads to one state take their
// plain tokens by length without a walk (matcher.cc): strings bounded and not, loops, chains
// that end dead, and classes that hold only some plain bytes (walked) give the brute-force
// masks.
TEST(GrammarMask, PlainTokensByLengthEqualBruteForce) {
  CheckMasksAlongText(Compile(Schema(R"({"type":"string","maxLength":5})")), "\"ab c\"");
  CheckMasksAlongText(Compile(Schema(R"({"type":"string","minLength":2,"maxLength":3})")),
                      "\"n\\\"a\"");
  CheckMasksAlongText(Compile(Schema(R"({"type":"array","items":{"type":"string"}})")),
                      "[\"abc\", \"name\\n\"]");
  CheckMasksAlongText(Compile(RegexGrammar(".*x")), "ab\"cx");
  CheckMasksAlongText(Compile(RegexGrammar("[ -~]{0,4}(true)?")), "a\"btrue");
  CheckMasksAlongText(Compile(RegexGrammar("[a-z ]{1,6}!")), "ab c!");
}

// A vocabulary of text tokens (plain bytes and whole UTF-8 characters, at the edges of each
// length: U+0080, U+07FF, U+0800, U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF), of 1 to 9
// characters, beside tokens that are not text: cut characters, overlong forms, surrogates,
// bytes past U+10FFFF, quotes, backslashes, control bytes and DEL.
std::shared_ptr<const TokenVocabulary> Utf8Vocab() {
  std::vector<std::optional<std::string>> bytes;
  bytes.push_back(std::nullopt);  // 0: EOS
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  const std::vector<std::string> chars = {"a",
                                          " ",
                                          "~",
                                          "\xC2\x80",
                                          "\xDF\xBF",
                                          "\xC3\xA9",
                                          "\xE0\xA0\x80",
                                          "\xED\x9F\xBF",
                                          "\xEE\x80\x80",
                                          "\xEF\xBF\xBF",
                                          "\xE4\xB8\xAD",
                                          "\xF0\x90\x80\x80",
                                          "\xF4\x8F\xBF\xBF",
                                          "\xF0\x9F\x98\x80"};
  std::mt19937 rng(11);
  for (int n = 1; n <= 9; ++n) {
    for (int k = 0; k < 24; ++k) {
      std::string t;
      for (int i = 0; i < n; ++i) t += chars[rng() % chars.size()];
      bytes.push_back(t);
    }
  }
  for (const char* t : {"\xC3",
                        "\xA9",
                        "\xE4\xB8",
                        "a\xE4",
                        "\xB8\xAD",
                        "\xC0\x80",
                        "\xC1\xBF",
                        "\xE0\x80\x80",
                        "\xED\xA0\x80",
                        "\xF4\x90\x80\x80",
                        "\xF5\x80\x80\x80",
                        "\xF8",
                        "\xC3\xA9\"",
                        "\xC3\xA9\",",
                        "ab\\n",
                        "\xE4\xB8\xAD\\u00e9",
                        "\x7F",
                        "a\x7F",
                        "\xC3\xA9\n",
                        "\"}",
                        "\":\"",
                        "\x01\xC3\xA9",
                        "\xC3\xA9\xC3"}) {
    bytes.push_back(std::string(t));
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int>{0},
                                                 int64_t(bytes.size()));
}

// Where every character leads to one state (a JSON string's content, bounded or not), the
// text tokens are taken by their number of characters (matcher.cc: UniformTextLocked); the
// masks equal the brute-force check of every token, also where the grammar takes only some
// UTF-8 characters (then the shortcut must not apply) or all but the plain bytes.
TEST(GrammarMask, TextTokensByCharactersEqualBruteForce) {
  auto vocab = Utf8Vocab();
  auto compile = [&](Grammar g) {
    return std::make_shared<const CompiledGrammar>(std::move(g), vocab);
  };
  const std::string mixed = "\"a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80 b\"";  // a é 中 😀 space b
  for (const char* schema : {R"({"type":"string"})", R"({"type":"string","maxLength":6})",
                             R"({"type":"string","minLength":3,"maxLength":9})",
                             R"({"type":"string","minLength":7,"maxLength":7})",
                             R"({"type":"string","pattern":"^[^é]{0,7}$"})",
                             R"({"type":"string","pattern":"^[\u0000-\uffff]{0,8}$"})",
                             R"({"type":"string","pattern":"^.{2,6}$"})"}) {
    SCOPED_TRACE(schema);
    auto g = compile(Schema(schema));
    // Along the longest prefix of `mixed` (and of a plain string) that the grammar allows.
    for (const std::string& text : {mixed, std::string("\"abcdefghij\"")}) {
      size_t n = text.size();
      while (n > 0 && !IsPrefix(*g, text.substr(0, n))) --n;
      CheckMasksAlongText(g, text.substr(0, n));
    }
  }
  CheckMasksAlongText(compile(Schema(R"({"type":"string","maxLength":6})")), mixed);
  CheckMasksAlongText(
      compile(Schema(R"({"type":"array","items":{"type":"string","maxLength":3}})")),
      "[\"\xC3\xA9\xC3\xA9\", \"x\"]");
  CheckMasksAlongText(compile(RegexGrammar("[^\"]{0,5}\"")), "a\xE4\xB8\xAD\"");
}

// Threads asking one grammar for the masks of many states at once (each state's mask is
// walked by one of them, the rest wait for it; transitions are read without the lock) get the
// masks a single thread computes on its own copy of the grammar. Run under TSan in CI.
TEST(GrammarMask, ConcurrentMasksEqualSingleThreaded) {
  auto vocab = Utf8Vocab();
  const char* schema = R"({"type":"object","properties":{"s":{"type":"string","maxLength":12},
      "n":{"type":"integer"},"t":{"type":"array","items":{"enum":["ab","\u00e9\u00e9","c"]}}},
      "required":["s","n","t"]})";
  const std::vector<std::string> outputs = {
      "{\"s\":\"ab\xC3\xA9 \xE4\xB8\xAD\", \"n\": 12, \"t\": [\"ab\", \"c\"]}",
      "{\"s\":\"\",\"n\":-3,\"t\":[\"\xC3\xA9\xC3\xA9\"]}",
      "{\"s\":\"aaaaaaaaaaaa\",\"n\":0,\"t\":[]}"};
  auto shared = std::make_shared<const CompiledGrammar>(Schema(schema), vocab);
  constexpr int kThreads = 8;
  std::vector<std::vector<std::vector<uint32_t>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread runs the outputs in its own order, so different states meet at once.
      for (size_t k = 0; k < outputs.size(); ++k) {
        const std::string& text = outputs[(k + size_t(t)) % outputs.size()];
        int32_t state = shared->initial_state();
        for (char c : text) {
          got[size_t(t)].push_back(*shared->AllowedTokens(state));
          state = shared->Next(state, uint8_t(c));
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    auto alone = std::make_shared<const CompiledGrammar>(Schema(schema), vocab);
    size_t i = 0;
    for (size_t k = 0; k < outputs.size(); ++k) {
      const std::string& text = outputs[(k + size_t(t)) % outputs.size()];
      int32_t state = alone->initial_state();
      for (char c : text) {
        ASSERT_EQ(got[size_t(t)][i++], *alone->AllowedTokens(state)) << "thread " << t;
        state = alone->Next(state, uint8_t(c));
        ASSERT_GE(state, 0);
      }
    }
  }
  EXPECT_EQ(shared->stats().masks_computed, shared->stats().masks_cached);
}

TEST(GrammarMatcher, DeadAfterADisallowedTokenAllowsOnlyEos) {
  auto g = Compile(ChoiceGrammar({"ab"}));
  Matcher m(g);
  EXPECT_FALSE(Bit(m.AllowedTokens(), 0));  // EOS: not yet
  EXPECT_TRUE(m.Accept(2 + 'a'));
  EXPECT_FALSE(m.Accept(2 + 'x'));
  EXPECT_TRUE(m.dead());
  EXPECT_TRUE(Bit(m.AllowedTokens(), 0));
  for (int id = 1; id < g->vocab().mask_vocab(); ++id) EXPECT_FALSE(Bit(m.AllowedTokens(), id));
}

// The sampler draws from random logits under a grammar: every output is in the language and
// ends with EOS exactly when it is complete.
TEST(GrammarSampler, RandomLogitsGiveValidOutputs) {
  auto vocab = SmallVocab();
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {
      std::make_shared<const CompiledGrammar>(RegexGrammar("[a-c]{2,5}(-[0-9]+)?"), vocab),
      std::make_shared<const CompiledGrammar>(
          Schema(R"({"type":"object","properties":{"n":{"type":"integer","minimum":-5,"maximum":5},
            "s":{"type":"string","maxLength":3}},"required":["n","s"]})"),
          vocab),
      std::make_shared<const CompiledGrammar>(ChoiceGrammar({"true", "false", "null"}), vocab)};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (const auto& g : grammars) {
    for (int trial = 0; trial < 40; ++trial) {
      SamplingParams p;
      p.temperature = 1.0;
      p.seed = uint64_t(trial);
      p.grammar = g;
      Sampler s(p);
      std::string out;
      bool ended = false;
      for (int step = 0; step < 200 && !ended; ++step) {
        std::vector<float> logits(size_t(vocab->mask_vocab()));
        for (float& l : logits) l = normal(rng);
        const int t = s.Sample(logits).token;
        if (vocab->IsEos(t)) {
          ended = true;
        } else {
          ASSERT_NE(vocab->bytes(t), nullptr) << t;
          out += *vocab->bytes(t);
        }
      }
      ASSERT_TRUE(ended) << out;
      EXPECT_TRUE(Accepts(*g, out)) << out;
    }
  }
}

// A repetition keeps one stack depth: a long run of one character revisits one state (and
// its cached mask) instead of making a new, deeper one per character.
TEST(GrammarMatcher, RepetitionRevisitsOneState) {
  for (const char* pattern : {"a*", "[^\n]*x?"}) {
    auto g = Compile(RegexGrammar(pattern));
    int32_t s = g->initial_state();
    for (int i = 0; i < 1000; ++i) s = g->Next(s, 'a');
    ASSERT_GE(s, 0);
    EXPECT_LE(g->stats().states, 4u) << pattern;
  }
  auto json = Compile(Schema(R"({"type":"object","properties":{"s":{"type":"string"}}})"));
  const size_t before = json->stats().states;
  int32_t s = json->NextBytes(json->initial_state(), "{\"s\":\"");
  for (int i = 0; i < 2000; ++i) s = json->Next(s, 'q');
  ASSERT_GE(s, 0);
  EXPECT_LE(json->stats().states, before + 40);
}

// Grammars that can match nothing, or parts of them, are refused or dropped: every state the
// automaton reaches can still complete.
TEST(GrammarBuild, EmptyLanguagesAreRefusedAndDeadEndsDropped) {
  for (const char* p : {"[^\\s\\S]", "a[^\\s\\S]", "\xff\xfe"}) {
    EXPECT_THROW(RegexGrammar(p), GrammarError) << p;
  }
  EXPECT_THROW(Schema(R"({"type":"string","pattern":"[^\\s\\S]"})"), GrammarError);
  auto g = Compile(RegexGrammar("a|ab[^\\s\\S]"));
  EXPECT_TRUE(Accepts(*g, "a"));
  EXPECT_FALSE(IsPrefix(*g, "ab"));
}

TEST(GrammarBuild, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(30000, '(') + "a" + std::string(30000, ')');
  EXPECT_THROW(RegexGrammar(deep), GrammarError);
  EXPECT_THROW(EbnfGrammar("root ::= " + deep), GrammarError);
  EXPECT_NO_THROW(RegexGrammar(std::string(200, '(') + "a" + std::string(200, ')')));
}

TEST(GrammarJsonSchema, RangesEndingAtZero) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{-1, 0}, {0, 0}, {-12, 0}}) {
    const std::string s = "{\"type\":\"integer\",\"minimum\":" + std::to_string(lo) +
                          ",\"maximum\":" + std::to_string(hi) + "}";
    auto g = Compile(JsonSchemaGrammar(json::parse(s)));
    for (int v = lo - 5; v <= hi + 5; ++v) {
      EXPECT_EQ(Accepts(*g, std::to_string(v)), v >= lo && v <= hi) << s << " " << v;
    }
  }
}

// An ambiguous grammar whose first mask cannot be made in time is a compile error (a 400),
// not a request stuck on the engine thread.
TEST(GrammarCompiler, AmbiguousGrammarsHitTheDeadline) {
  std::vector<std::optional<std::string>> bytes = {std::nullopt};
  for (int n = 1; n <= 64; ++n) bytes.push_back(std::string(size_t(n), 'a'));
  auto vocab = std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int>{0}, 65);
  CompilerOptions o;
  o.timeout_seconds = 0.5;
  GrammarCompiler c(vocab, o);
  StructuredSpec spec;
  spec.kind = StructuredSpec::Kind::kRegex;
  for (const char* p : {"(a?){2000}", "((a?){100}){200}"}) {
    spec.text = p;
    const auto start = std::chrono::steady_clock::now();
    try {
      c.Compile(spec);
    } catch (const GrammarError&) {
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << p;
  }
  // Nested nullable repetitions: the first state's expansion walks ~2 M items of empty
  // alternatives before its first stack (the fuzzer's nested-nullable-repeat.seed); it stops at
  // its item cap and the grammar is refused.
  spec.text = "((a?){1001}){699}";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(c.Compile(spec), GrammarError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(GrammarCompiler, CachesBySpecAndRefusesTooLarge) {
  CompilerOptions o;
  o.max_spec_bytes = 1000;
  GrammarCompiler c(SmallVocab(), o);
  StructuredSpec spec;
  spec.kind = StructuredSpec::Kind::kRegex;
  spec.text = "[a-z]+";
  auto a = c.Compile(spec);
  auto b = c.Compile(spec);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(c.cache_hits(), 1u);
  spec.text = std::string(2000, 'a');
  EXPECT_THROW(c.Compile(spec), GrammarError);
  spec.kind = StructuredSpec::Kind::kJsonSchema;
  spec.text = "{not json";
  EXPECT_THROW(c.Compile(spec), GrammarError);
}

// Token bytes of the real tokenizers: SentencePiece pieces ("▁" as a space, <0xNN> as a byte)
// and a byte-level BPE tokenizer.json; control tokens are never allowed.
TEST(GrammarVocabulary, TokenBytesOfRealTokenizers) {
  auto tok = Tokenizer::Load(test::StoriesDir());
  int bytes_seen = 0, spaces_seen = 0;
  for (int id = 0; id < tok->vocab_size(); ++id) {
    const auto b = tok->TokenBytes(id);
    if (tok->IsControl(id) || id == tok->unk_id()) {
      EXPECT_FALSE(b.has_value()) << id;
      continue;
    }
    ASSERT_TRUE(b.has_value()) << id;
    if (tok->IsByte(id)) {
      EXPECT_EQ(b->size(), 1u);
      ++bytes_seen;
    }
    if (!b->empty() && (*b)[0] == ' ') ++spaces_seen;
    // Decoding a token after a plain one adds exactly its bytes (valid UTF-8 ones).
    const int a = tok->Encode("a").back();
    const std::string both = tok->Decode(std::vector<int>{a, id});
    const std::string one = tok->Decode(std::vector<int>{a});
    if (!tok->IsByte(id)) {
      EXPECT_EQ(both.substr(one.size()), *b) << id;
    }
  }
  EXPECT_EQ(bytes_seen, 256);
  EXPECT_GT(spaces_seen, 50);
}

}  // namespace
}  // namespace llm::grammar
