#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

namespace llm::grammar {
namespace {

using json = nlohmann::ordered_json;  // properties in the schema's order

constexpr int kMaxDepth = 64;      // schema nesting
constexpr int kMaxIntDigits = 15;  // integer digits produced (exact as doubles)
constexpr int kMaxFractionDigits = 15;
constexpr int kMaxIndent = 24;
constexpr int64_t kMaxMagnitude = 999'999'999'999'999;  // 15 digits
constexpr int kMaxExponent = 292;                       // see Number()

const std::set<std::string>& Annotations() {
  static const std::set<std::string> s = {"title",         "description", "default",  "examples",
                                          "$schema",       "$id",         "$comment", "deprecated",
                                          "readOnly",      "writeOnly",   "$defs",    "definitions",
                                          "discriminator", "x-order"};
  return s;
}

const std::set<std::string>& Supported() {
  static const std::set<std::string> s = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "pattern",
                                          "minLength",
                                          "maxLength",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable"};
  return s;
}

std::string Dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::strict); }

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& options, GrammarBuilder* b)
      : root_(root), opt_(options), b_(b) {
    ws_ = opt_.compact
              ? Empty()
              : Optional(Alt({Byte(' '), Seq({Byte('\n'), Repeat(Byte(' '), 0, kMaxIndent)})}));
  }

  ExprPtr Compile() { return Gen(root_, "#", 0); }

  ExprPtr AnyObject() { return RuleRef(AnyRules().object); }

 private:
  [[noreturn]] void Fail(const std::string& path, const std::string& what) const {
    throw GrammarError("json schema at " + path + ": " + what);
  }

  struct Any {
    int value = -1, object = -1, array = -1;
  };

  // The generic JSON value, object and array rules (built once).
  const Any& AnyRules() {
    if (any_.value >= 0) return any_;
    any_.value = b_->NewRule("any_value");
    any_.object = b_->NewRule("any_object");
    any_.array = b_->NewRule("any_array");
    const ExprPtr v = RuleRef(any_.value);
    const ExprPtr member = Seq({String(0, -1), ws_, Byte(':'), ws_, v});
    b_->Define(any_.object, Seq({Byte('{'), ws_,
                                 Optional(Seq({member, Star(Seq({ws_, Byte(','), ws_, member}))})),
                                 ws_, Byte('}')}));
    b_->Define(any_.array,
               Seq({Byte('['), ws_, Optional(Seq({v, Star(Seq({ws_, Byte(','), ws_, v}))})), ws_,
                    Byte(']')}));
    b_->Define(any_.value, Alt({RuleRef(any_.object), RuleRef(any_.array), String(0, -1), Number(),
                                Literal("true"), Literal("false"), Literal("null")}));
    return any_;
  }

  // One character of a JSON string's content: a plain character or an escape (\u escapes of
  // surrogates are left out, so that every escape is one character of the decoded string).
  ExprPtr StringChar() {
    if (string_char_) return string_char_;
    ByteSet hex;
    for (char c : std::string("0123456789abcdefABCDEF")) hex.set(uint8_t(c));
    ByteSet hex_not_d = hex;
    hex_not_d.reset('d');
    hex_not_d.reset('D');
    ByteSet low_oct;
    for (char c = '0'; c <= '7'; ++c) low_oct.set(uint8_t(c));
    ByteSet simple;
    for (char c : std::string("\"\\/bfnrt")) simple.set(uint8_t(c));
    const ExprPtr u =
        Seq({Byte('u'),
             Alt({Seq({Bytes(hex_not_d), Bytes(hex), Bytes(hex), Bytes(hex)}),
                  Seq({Alt({Byte('d'), Byte('D')}), Bytes(low_oct), Bytes(hex), Bytes(hex)})})});
    const ExprPtr escape = Seq({Byte('\\'), Alt({Bytes(simple), u})});
    const ExprPtr plain = Utf8Class({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}});
    const int r = b_->NewRule("string_char");
    b_->Define(r, Alt({plain, escape}));
    string_char_ = RuleRef(r);
    return string_char_;
  }

  ExprPtr String(int min, int max) {
    return Seq({Byte('"'), Repeat(StringChar(), min, max), Byte('"')});
  }

  static ByteSet Digits(char lo, char hi) {
    ByteSet s;
    for (char c = lo; c <= hi; ++c) s.set(uint8_t(c));
    return s;
  }

  // Digit strings of one length from lo to hi (same length, lo <= hi).
  static ExprPtr SameLength(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return Empty();
    if (lo.find_first_not_of('0') == std::string::npos &&
        hi.find_first_not_of('9') == std::string::npos) {  // every digit string of this length
      return Repeat(Bytes(Digits('0', '9')), int(lo.size()), int(lo.size()));
    }
    if (lo.size() == 1) return Bytes(Digits(lo[0], hi[0]));
    if (lo[0] == hi[0]) return Seq({Byte(uint8_t(lo[0])), SameLength(lo.substr(1), hi.substr(1))});
    const std::string nines(lo.size() - 1, '9'), zeros(lo.size() - 1, '0');
    std::vector<ExprPtr> alts;
    alts.push_back(Seq({Byte(uint8_t(lo[0])), SameLength(lo.substr(1), nines)}));
    if (hi[0] - lo[0] > 1) {
      alts.push_back(
          Seq({Bytes(Digits(char(lo[0] + 1), char(hi[0] - 1))),
               Repeat(Bytes(Digits('0', '9')), int(lo.size()) - 1, int(lo.size()) - 1)}));
    }
    alts.push_back(Seq({Byte(uint8_t(hi[0])), SameLength(zeros, hi.substr(1))}));
    return Alt(std::move(alts));
  }

  // Decimal forms (no leading zeros) of [a, b], 0 <= a <= b.
  static ExprPtr NonNegativeRange(int64_t a, int64_t b) {
    std::vector<ExprPtr> alts;
    int64_t lo_len_start = 1;  // smallest number with this many digits
    for (int len = 1; len <= 19 && (len == 1 || lo_len_start <= b); ++len) {
      const int64_t len_end = len == 19 ? INT64_MAX : lo_len_start * 10 - 1;
      const int64_t lo = std::max(a, len == 1 ? 0 : lo_len_start);
      const int64_t hi = std::min(b, len_end);
      if (lo <= hi) alts.push_back(SameLength(std::to_string(lo), std::to_string(hi)));
      if (len == 19) break;
      lo_len_start *= 10;
    }
    return Alt(std::move(alts));
  }

  static ExprPtr IntegerRange(int64_t lo, int64_t hi) {
    std::vector<ExprPtr> alts;
    if (lo < 0) {  // -1 .. -|lo|, written "-" then the magnitude
      const int64_t neg_hi = std::min<int64_t>(hi, -1);
      alts.push_back(Seq({Byte('-'), NonNegativeRange(-neg_hi, -lo)}));
    }
    if (hi >= 0) alts.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
    return Alt(std::move(alts));
  }

  static ExprPtr Integer() {
    return Seq({Optional(Byte('-')),
                Alt({Byte('0'), Seq({Bytes(Digits('1', '9')),
                                     Repeat(Bytes(Digits('0', '9')), 0, kMaxIntDigits - 1)})})});
  }

  static ExprPtr Number() {
    const ExprPtr digit = Bytes(Digits('0', '9'));
    const ExprPtr integer = Integer();
    const ExprPtr fraction = Seq({Byte('.'), Repeat(digit, 1, kMaxFractionDigits)});
    ByteSet e, sign;
    e.set('e'), e.set('E'), sign.set('+'), sign.set('-');
    // |exponent| <= 292: under 1e15 (15 integer digits) times 1e292 stays below a double's
    // 1.8e308, and 1e-15 times 1e-292 above its smallest normal, so every number produced
    // parses to a finite double (1e999 is Infinity in JSON.parse, an error in nlohmann::json).
    const ExprPtr exponent =
        Seq({Bytes(e), Optional(Bytes(sign)), NonNegativeRange(0, kMaxExponent)});
    return Seq({integer, Optional(fraction), Optional(exponent)});
  }

  // ---- keywords

  void CheckKeywords(const json& s, const std::string& path) const {
    if (!opt_.strict) return;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (Supported().count(it.key()) == 0 && Annotations().count(it.key()) == 0) {
        Fail(path, "the keyword '" + it.key() + "' is not supported (strict)");
      }
    }
  }

  const json& Resolve(const std::string& ref, const std::string& path) const {
    if (ref.empty() || ref[0] != '#') Fail(path, "only local $ref (\"#...\") is supported");
    if (ref == "#") return root_;
    try {
      std::string pointer = ref.substr(1);
      return root_.at(json::json_pointer(pointer));
    } catch (const json::exception&) {
      Fail(path, "$ref '" + ref + "' does not resolve");
    }
  }

  ExprPtr Ref(const std::string& ref, const std::string& path, int depth) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return RuleRef(it->second);
    const json& target = Resolve(ref, path);
    const int rule = b_->NewRule("ref " + ref);
    refs_[ref] = rule;
    b_->Define(rule, Gen(target, ref, depth + 1));
    return RuleRef(rule);
  }

  // A schema that can never be satisfied together with another (merging found it): an
  // allOf is then an error, an anyOf alternative is dropped.
  struct Unsatisfiable {
    std::string what;
  };

  // Keywords that count beside $ref (not annotations).
  static bool HasSiblings(const json& s, const char* key) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() != key && Annotations().count(it.key()) == 0) return true;
    }
    return false;
  }

  // `s` as one schema without allOf and $ref at its top: a $ref's target merged with the
  // keywords beside it (draft 2019+ applies both), the allOf parts merged in.
  json Flatten(const json& s, const std::string& path, int depth) const {
    if (depth > kMaxDepth) Fail(path, "allOf / $ref nest deeper than " + std::to_string(kMaxDepth));
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw Unsatisfiable{"false can never be satisfied"};
      return json::object();
    }
    if (!s.is_object()) Fail(path, "a schema must be an object or a boolean");
    CheckKeywords(s, path);
    json merged = s;
    merged.erase("allOf");
    if (merged.contains("$ref")) {
      if (!merged["$ref"].is_string()) Fail(path, "$ref must be a string");
      const std::string ref = merged["$ref"].get<std::string>();
      merged.erase("$ref");
      json target = Flatten(Resolve(ref, path), ref, depth + 1);
      Merge(&target, merged, path);
      merged = std::move(target);
    }
    if (s.contains("allOf")) {
      const json& parts = s["allOf"];
      if (!parts.is_array() || parts.empty()) Fail(path, "allOf must be a non-empty array");
      for (size_t i = 0; i < parts.size(); ++i) {
        const std::string p = path + "/allOf/" + std::to_string(i);
        Merge(&merged, Flatten(parts[i], p, depth + 1), p);
      }
    }
    return merged;
  }

  // The types a schema allows ("nullable" included); nullopt: any type.
  static std::optional<std::vector<std::string>> TypeSet(const json& s) {
    if (!s.contains("type")) return std::nullopt;
    std::vector<std::string> types;
    const json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    if (t.is_array()) {
      for (const json& x : t) {
        if (x.is_string()) types.push_back(x.get<std::string>());
      }
    }
    if (s.value("nullable", false) && std::find(types.begin(), types.end(), "null") == types.end())
      types.push_back("null");
    return types;
  }

  // Merges the flattened schema `part` into `*into` (both must hold): properties unioned
  // (one named by both gets the allOf of its two schemas), required unioned, types
  // intersected, lower bounds raised and upper bounds lowered, enums intersected. Another
  // keyword both give differently keeps `*into`'s, and is an error under strict.
  void Merge(json* into, const json& part, const std::string& path) const {
    json& m = *into;
    const auto ta = TypeSet(m), tb = TypeSet(part);
    for (auto it = part.begin(); it != part.end(); ++it) {
      const std::string& k = it.key();
      const json& v = *it;
      if (k == "type" || k == "nullable" || Annotations().count(k)) continue;
      if (!m.contains(k)) {
        m[k] = v;
        continue;
      }
      json& have = m[k];
      if (have == v) continue;
      if (k == "properties" && have.is_object() && v.is_object()) {
        for (auto pit = v.begin(); pit != v.end(); ++pit) {
          if (have.contains(pit.key()) && have[pit.key()] != *pit) {
            have[pit.key()] = {{"allOf", json::array({have[pit.key()], *pit})}};
          } else {
            have[pit.key()] = *pit;
          }
        }
      } else if (k == "required" && have.is_array() && v.is_array()) {
        for (const json& r : v) {
          if (std::find(have.begin(), have.end(), r) == have.end()) have.push_back(r);
        }
      } else if ((k == "minimum" || k == "exclusiveMinimum" || k == "minLength" ||
                  k == "minItems") &&
                 have.is_number() && v.is_number()) {
        if (v.get<double>() > have.get<double>()) have = v;
      } else if ((k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" ||
                  k == "maxItems") &&
                 have.is_number() && v.is_number()) {
        if (v.get<double>() < have.get<double>()) have = v;
      } else if (k == "enum" && have.is_array() && v.is_array()) {
        json both = json::array();
        for (const json& x : have) {
          if (std::find(v.begin(), v.end(), x) != v.end()) both.push_back(x);
        }
        if (both.empty()) throw Unsatisfiable{"their enums have no value in common"};
        have = std::move(both);
      } else if (k == "const") {
        throw Unsatisfiable{"their consts differ"};
      } else if ((k == "additionalProperties" || k == "items") &&
                 (have.is_boolean() || v.is_boolean())) {
        if (v == json(false) || have == json(true)) have = v;
      } else if (k == "additionalProperties" || k == "items") {
        have = {{"allOf", json::array({have, v})}};
      } else if (opt_.strict) {
        Fail(path, "combining two different '" + k + "' is not supported (strict)");
      }
    }
    if (!ta && !tb) return;
    std::vector<std::string> types;
    if (!ta || !tb) {
      types = ta ? *ta : *tb;
    } else {
      for (const std::string& t : *ta) {
        auto in_b = [&](const std::string& x) {
          return std::find(tb->begin(), tb->end(), x) != tb->end();
        };
        if (in_b(t)) {
          types.push_back(t);
        } else if ((t == "integer" && in_b("number")) || (t == "number" && in_b("integer"))) {
          types.push_back("integer");
        }
      }
      if (types.empty()) throw Unsatisfiable{"their types do not intersect"};
    }
    m.erase("nullable");
    m["type"] = types.size() == 1 ? json(types[0]) : json(types);
  }

  // A schema with allOf or with keywords beside $ref, merged into one.
  json MergeAll(const json& s, const std::string& path, int depth) const {
    try {
      return Flatten(s, path, depth);
    } catch (const Unsatisfiable& u) {
      Fail(path, (s.contains("allOf") ? "allOf" : "$ref with keywords beside it") +
                     std::string(" can never be satisfied: ") + u.what);
    }
  }

  std::vector<std::string> Types(const json& s, const std::string& path) const {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) Fail(path, "type must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        Fail(path, "type must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    }
    if (s.value("nullable", false) && !types.empty() &&
        std::find(types.begin(), types.end(), "null") == types.end()) {
      types.push_back("null");
    }
    return types;
  }

  int IntKeyword(const json& s, const char* key, int fallback, const std::string& path) const {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() &&
        !(v.is_number() && std::floor(v.get<double>()) == v.get<double>())) {
      Fail(path, std::string(key) + " must be a non-negative integer");
    }
    const double d = v.get<double>();
    if (d < 0) Fail(path, std::string(key) + " must be a non-negative integer");
    if (d > b_->limits().max_repeat) {
      Fail(path, std::string(key) + " above " + std::to_string(b_->limits().max_repeat) +
                     " is not supported");
    }
    return int(d);
  }

  ExprPtr Gen(const json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) Fail(path, "the schema nests deeper than " + std::to_string(kMaxDepth));
    if ((++steps_ & 255) == 0) b_->CheckDeadline();
    if (s.is_boolean()) {
      if (s.get<bool>()) return RuleRef(AnyRules().value);
      Fail(path, "false can never be satisfied");
    }
    if (!s.is_object()) Fail(path, "a schema must be an object or a boolean");
    CheckKeywords(s, path);
    if (s.contains("allOf") || (s.contains("$ref") && HasSiblings(s, "$ref"))) {
      // A rule per distinct schema, so that a recursive one ({"$ref": "#/$defs/node",
      // "maxItems": 3} inside node) refers to itself instead of inlining forever.
      const std::string key = "merged " + Dump(s);
      auto it = refs_.find(key);
      if (it != refs_.end()) return RuleRef(it->second);
      const int rule = b_->NewRule("merged");
      refs_[key] = rule;
      b_->Define(rule, Gen(MergeAll(s, path, depth), path, depth + 1));
      return RuleRef(rule);
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) Fail(path, "$ref must be a string");
      return Ref(s["$ref"].get<std::string>(), path, depth);
    }
    if (s.contains("const")) return Literal(Dump(s["const"]));
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) Fail(path, "enum must be a non-empty array");
      std::vector<ExprPtr> alts;
      for (const json& v : e) alts.push_back(Literal(Dump(v)));
      return Alt(std::move(alts));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& parts = s[key];
      if (!parts.is_array() || parts.empty())
        Fail(path, std::string(key) + " must be a non-empty array");
      // Keywords beside anyOf apply to every alternative (pydantic writes "nullable" fields
      // this way): merged into each as allOf merges; an alternative they contradict is
      // dropped.
      json siblings = s;
      siblings.erase(key);
      const bool merge = HasSiblings(siblings, "");
      std::vector<ExprPtr> alts;
      for (size_t i = 0; i < parts.size(); ++i) {
        const std::string p = path + "/" + key + "/" + std::to_string(i);
        if (!merge) {
          alts.push_back(Gen(parts[i], p, depth + 1));
          continue;
        }
        json part;
        try {
          part = Flatten(siblings, path, depth + 1);
          Merge(&part, Flatten(parts[i], p, depth + 1), p);
        } catch (const Unsatisfiable&) {
          continue;
        }
        alts.push_back(Gen(part, p, depth + 1));
      }
      if (alts.empty()) {
        Fail(path, std::string(key) + ": no alternative can hold with the keywords beside it");
      }
      return Alt(std::move(alts));
    }
    const std::vector<std::string> types = Types(s, path);
    if (types.empty()) return RuleRef(AnyRules().value);
    std::vector<ExprPtr> alts;
    for (const std::string& t : types) alts.push_back(GenType(s, t, path, depth));
    return Alt(std::move(alts));
  }

  ExprPtr GenType(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "null") return Literal("null");
    if (t == "boolean") return Alt({Literal("true"), Literal("false")});
    if (t == "string") return GenString(s, path);
    if (t == "integer" || t == "number") return GenNumber(s, t == "integer", path);
    if (t == "object") return GenObject(s, path, depth);
    if (t == "array") return GenArray(s, path, depth);
    Fail(path, "unknown type '" + t + "'");
  }

  ExprPtr GenString(const json& s, const std::string& path) {
    const int min = IntKeyword(s, "minLength", 0, path);
    const int max = IntKeyword(s, "maxLength", -1, path);
    if (max >= 0 && max < min) Fail(path, "maxLength is below minLength");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) Fail(path, "pattern must be a string");
      if (opt_.strict && (s.contains("minLength") || s.contains("maxLength"))) {
        Fail(path, "pattern together with minLength / maxLength is not supported (strict)");
      }
      try {
        return Seq(
            {Byte('"'), RegexJsonStringExpr(s["pattern"].get<std::string>(), b_), Byte('"')});
      } catch (const GrammarError& e) {
        Fail(path + "/pattern", e.what());
      }
    }
    if (opt_.strict && s.contains("format"))
      Fail(path, "the keyword 'format' is not supported (strict)");
    return String(min, max);
  }

  ExprPtr GenNumber(const json& s, bool integer, const std::string& path) {
    const bool bounded = s.contains("minimum") || s.contains("maximum") ||
                         s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
    if (!bounded) return integer ? Integer() : Number();
    double lo = -double(kMaxMagnitude), hi = double(kMaxMagnitude);
    auto bound = [&](const char* key) -> std::optional<double> {
      if (!s.contains(key)) return std::nullopt;
      if (!s[key].is_number()) Fail(path, std::string(key) + " must be a number");
      return s[key].get<double>();
    };
    // Integers in the range: ceil / floor of the bounds, one step in for exclusive ones.
    if (auto v = bound("minimum")) lo = std::max(lo, std::ceil(*v));
    if (auto v = bound("exclusiveMinimum")) lo = std::max(lo, std::floor(*v) + 1);
    if (auto v = bound("maximum")) hi = std::min(hi, std::floor(*v));
    if (auto v = bound("exclusiveMaximum")) hi = std::min(hi, std::ceil(*v) - 1);
    if (lo > hi) {
      Fail(path, integer ? "no integer lies between the bounds"
                         : "the bounds hold no integer, the only numbers produced under bounds");
    }
    return IntegerRange(int64_t(lo), int64_t(hi));
  }

  ExprPtr Member(const std::string& key, ExprPtr value) {
    return Seq({Literal(Dump(json(key))), ws_, Byte(':'), ws_, std::move(value)});
  }

  ExprPtr GenObject(const json& s, const std::string& path, int depth) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) Fail(path, "properties must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) Fail(path, "required must be an array of strings");
      for (const json& r : s["required"]) {
        if (!r.is_string()) Fail(path, "required must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    const json additional =
        s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    // The members in order: listed properties, then required names the properties lack.
    std::vector<std::pair<std::string, ExprPtr>> members;
    std::vector<bool> must;
    for (auto it = props.begin(); it != props.end(); ++it) {
      members.push_back({it.key(), Gen(*it, path + "/properties/" + it.key(), depth + 1)});
      must.push_back(required.count(it.key()) > 0);
    }
    for (const std::string& r : required) {
      if (props.contains(r)) continue;
      if (additional.is_boolean() && !additional.get<bool>()) {
        Fail(path, "required property '" + r + "' is not allowed (additionalProperties false)");
      }
      members.push_back({r, Gen(additional, path + "/additionalProperties", depth + 1)});
      must.push_back(true);
    }
    const ExprPtr open = Seq({Byte('{'), ws_});
    const ExprPtr close = Seq({ws_, Byte('}')});
    const ExprPtr comma = Seq({ws_, Byte(','), ws_});
    if (members.empty()) {
      if (additional.is_boolean() && !additional.get<bool>()) return Seq({open, close});
      // Any members whose values match additionalProperties.
      const ExprPtr value = additional.is_boolean()
                                ? RuleRef(AnyRules().value)
                                : Gen(additional, path + "/additionalProperties", depth + 1);
      const ExprPtr member = Seq({String(0, -1), ws_, Byte(':'), ws_, value});
      return Seq({open, Optional(Seq({member, Star(Seq({comma, member}))})), close});
    }
    // tail(i, first): members i.. where `first` says nothing has been written yet (no comma).
    std::vector<ExprPtr> tail_first(members.size() + 1), tail_more(members.size() + 1);
    tail_first[members.size()] = Empty();
    tail_more[members.size()] = Empty();
    for (size_t i = members.size(); i-- > 0;) {
      const ExprPtr m = Member(members[i].first, members[i].second);
      // Rules for the tails keep the lowered grammar linear in the number of properties.
      const int rf = b_->NewRule("members"), rm = b_->NewRule("members");
      const ExprPtr with_first = Seq({m, tail_more[i + 1]});
      const ExprPtr with_more = Seq({comma, m, tail_more[i + 1]});
      b_->Define(rf, must[i] ? with_first : Alt({with_first, tail_first[i + 1]}));
      b_->Define(rm, must[i] ? with_more : Alt({with_more, tail_more[i + 1]}));
      tail_first[i] = RuleRef(rf);
      tail_more[i] = RuleRef(rm);
    }
    return Seq({open, tail_first[0], close});
  }

  ExprPtr GenArray(const json& s, const std::string& path, int depth) {
    std::vector<ExprPtr> prefix;
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) Fail(path, "prefixItems must be an array");
      for (size_t i = 0; i < p.size(); ++i) {
        prefix.push_back(Gen(p[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
      }
    }
    int min = IntKeyword(s, "minItems", 0, path);
    int max = IntKeyword(s, "maxItems", -1, path);
    ExprPtr items;
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        max = max < 0 ? int(prefix.size()) : std::min(max, int(prefix.size()));
      } else if (it.is_array()) {  // draft 4-7 tuple form
        for (size_t i = 0; i < it.size(); ++i) {
          prefix.push_back(Gen(it[i], path + "/items/" + std::to_string(i), depth + 1));
        }
        if (s.contains("additionalItems") && s["additionalItems"] == json(false)) {
          max = max < 0 ? int(prefix.size()) : std::min(max, int(prefix.size()));
        } else {
          items = RuleRef(AnyRules().value);
        }
      } else {
        items = Gen(it, path + "/items", depth + 1);
      }
    } else {
      items = RuleRef(AnyRules().value);
    }
    if (max >= 0 && max < min) Fail(path, "maxItems is below minItems (or than the items allowed)");
    const ExprPtr comma = Seq({ws_, Byte(','), ws_});
    auto elem = [&](size_t i) { return i < prefix.size() ? prefix[i] : items; };
    // rest(i): elements i.. after element i - 1 (each preceded by a comma).
    std::function<ExprPtr(size_t)> rest = [&](size_t i) -> ExprPtr {
      if (max >= 0 && int(i) >= max) return Empty();
      if (i >= prefix.size()) {
        const int need = std::max(0, min - int(i));
        return Repeat(Seq({comma, items}), need, max < 0 ? -1 : max - int(i));
      }
      const ExprPtr more = Seq({comma, elem(i), rest(i + 1)});
      return int(i) < min ? more : Optional(more);
    };
    ExprPtr body;
    if (max == 0) {
      body = Empty();
    } else {
      const ExprPtr first = Seq({elem(0), rest(1)});
      body = min > 0 ? first : Optional(first);
    }
    return Seq({Byte('['), ws_, body, ws_, Byte(']')});
  }

  const json& root_;
  JsonSchemaOptions opt_;
  GrammarBuilder* b_;
  ExprPtr ws_;
  ExprPtr string_char_;
  Any any_;
  std::map<std::string, int> refs_;
  size_t steps_ = 0;
};

}  // namespace

Grammar JsonSchemaGrammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options,
                          const Limits& limits) {
  try {
    GrammarBuilder b(limits);
    SchemaCompiler c(schema, options, &b);
    const int root = b.NewRule("root");
    b.Define(root, c.Compile());
    return b.Build(root);
  } catch (const json::exception& e) {  // e.g. invalid UTF-8 in a const
    throw GrammarError(std::string("json schema: ") + e.what());
  }
}

Grammar JsonObjectGrammar(const JsonSchemaOptions& options, const Limits& limits) {
  GrammarBuilder b(limits);
  const json schema = json::object();
  SchemaCompiler c(schema, options, &b);
  const int root = b.NewRule("root");
  b.Define(root, c.AnyObject());
  return b.Build(root);
}

ExprPtr JsonSchemaExpr(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options,
                       GrammarBuilder* b) {
  try {
    SchemaCompiler c(schema, options, b);
    return c.Compile();
  } catch (const json::exception& e) {
    throw GrammarError(std::string("json schema: ") + e.what());
  }
}

}  // namespace llm::grammar
