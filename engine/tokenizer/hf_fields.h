// Typed reads of tokenizer.json's fields for the loader (hf_load.cc): each failure is an
// llm::Error naming the file and the field's path ("pre_tokenizer.pretokenizers[1].behavior").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/error.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace llm::hf {

class FieldReader {
 protected:
  using json = nlohmann::json;
  explicit FieldReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void Fail(const std::string& field, const std::string& message) const {
    throw Error(path_ + ": " + (field.empty() ? "" : field + ": ") + message);
  }

  static const json* Get(const json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

  std::string String(const json& object, const char* key, const std::string& field) const {
    const json* v = Get(object, key);
    if (v == nullptr || !v->is_string()) Fail(field + "." + key, "must be a string");
    return v->get<std::string>();
  }
  std::optional<std::string> OptionalString(const json& object, const char* key,
                                            const std::string& field) const {
    const json* v = Get(object, key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) Fail(field + "." + key, "must be a string or null");
    return v->get<std::string>();
  }
  // An optional flag (the library's Option<bool>): missing or null is `fallback`.
  bool Bool(const json& object, const char* key, bool fallback, const std::string& field) const {
    const json* v = Get(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) Fail(field + "." + key, "must be true or false");
    return v->get<bool>();
  }
  // A flag the library's deserializer requires (a plain bool field: null is refused too).
  bool RequiredBool(const json& object, const char* key, const std::string& field) const {
    const auto it = object.find(key);
    if (it == object.end() || !it->is_boolean()) Fail(field + "." + key, "must be true or false");
    return it->get<bool>();
  }
  // A flag with a serde default: missing is `fallback`, null is refused.
  bool DefaultBool(const json& object, const char* key, bool fallback,
                   const std::string& field) const {
    return object.contains(key) ? RequiredBool(object, key, field) : fallback;
  }
  size_t Size(const json& object, const char* key, const std::string& field) const {
    const json* v = Get(object, key);
    if (v == nullptr || !v->is_number_unsigned()) {
      Fail(field + "." + key, "must be a non-negative integer");
    }
    return v->get<size_t>();
  }
  std::string Type(const json& object, const std::string& field) const {
    if (!object.is_object()) Fail(field, "must be an object");
    return String(object, "type", field);
  }
  const json& Array(const json& object, const char* key, const std::string& field) const {
    const json* v = Get(object, key);
    if (v == nullptr || !v->is_array()) Fail(field + "." + key, "must be an array");
    return *v;
  }
  std::string OneChar(const json& object, const char* key, const std::string& field) const {
    std::string s = String(object, key, field);
    if (s.empty() || !unicode::IsValidUtf8(s) || unicode::CharLength(s[0]) != s.size()) {
      Fail(field + "." + key, "must be one character");
    }
    return s;
  }

  // ByteLevel's fields, one struct for the pre-tokenizer, the decoder and the post-processor
  // (byte_level.rs): add_prefix_space and trim_offsets required, use_regex true by default.
  bool ByteLevelFlags(const json& object, const std::string& field,
                      bool* use_regex = nullptr) const {
    const bool add_prefix_space = RequiredBool(object, "add_prefix_space", field);
    RequiredBool(object, "trim_offsets", field);
    const bool regex = DefaultBool(object, "use_regex", true, field);
    if (use_regex != nullptr) *use_regex = regex;
    return add_prefix_space;
  }

  // {"String": "..."} or {"Regex": "..."}; *literal gets the string of a String pattern.
  std::shared_ptr<Regex> Pattern(const json& object, const std::string& field,
                                 std::string* literal = nullptr) const {
    const json* p = Get(object, "pattern");
    const std::string f = field + ".pattern";
    if (p == nullptr || !p->is_object() || p->size() != 1) {
      Fail(f, "must be {\"String\": ...} or {\"Regex\": ...}");
    }
    try {
      if (p->contains("String") && (*p)["String"].is_string()) {
        const std::string s = (*p)["String"].get<std::string>();
        if (literal != nullptr) *literal = s;
        return std::make_shared<Regex>(Regex::Literal(s));
      }
      if (p->contains("Regex") && (*p)["Regex"].is_string()) {
        return std::make_shared<Regex>((*p)["Regex"].get<std::string>());
      }
    } catch (const Error& e) {
      Fail(f, e.what());
    }
    Fail(f, "must be {\"String\": ...} or {\"Regex\": ...}");
  }

  SplitBehavior Behavior(const json& object, const std::string& field,
                         std::optional<SplitBehavior> fallback = std::nullopt) const {
    if (fallback && Get(object, "behavior") == nullptr) return *fallback;
    const std::string b = String(object, "behavior", field);
    if (b == "Removed") return SplitBehavior::kRemoved;
    if (b == "Isolated") return SplitBehavior::kIsolated;
    if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (b == "Contiguous") return SplitBehavior::kContiguous;
    Fail(field + ".behavior", "unknown behavior \"" + b + "\"");
  }

  // Metaspace's prepend_scheme (default "always"), with the older add_prefix_space: false must
  // come with "never" (metaspace.rs refuses it with the default "always", as the library
  // does).
  PrependScheme Prepend(const json& object, const std::string& field) const {
    PrependScheme scheme = PrependScheme::kAlways;
    if (object.contains("prepend_scheme")) {
      const json& p = object["prepend_scheme"];
      const std::string s = p.is_string() ? p.get<std::string>() : "";
      if (s == "always") {
        scheme = PrependScheme::kAlways;
      } else if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else {
        Fail(field + ".prepend_scheme", "must be \"always\", \"first\" or \"never\"");
      }
    }
    if (!Bool(object, "add_prefix_space", true, field) && scheme != PrependScheme::kNever) {
      Fail(field + ".add_prefix_space",
           "false does not match prepend_scheme (\"never\" is needed)");
    }
    return scheme;
  }

  std::string path_;
};

}  // namespace llm::hf
