// The schema corpus of bench/grammar_bench.cc: JSON schemas generated deterministically from a
// seed, a JSONSchemaBench-like mix of ten kinds (flat and nested objects, arrays of objects,
// enums, string patterns, $defs + $ref, a recursive tree, discriminated anyOf / oneOf unions,
// allOf, prefixItems tuples), with bounded strings and integer ranges among the primitives.
#pragma once

#include <cstdint>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace llm::bench {

using nlohmann::ordered_json;

class SchemaGen {
 public:
  explicit SchemaGen(uint32_t seed) : rng_(seed) {}

  // One schema of the kind `kind` (0 .. kNumKinds - 1), with its kind's name.
  static constexpr int kNumKinds = 10;
  static const char* KindName(int kind) {
    static const char* kNames[kNumKinds] = {"flat",    "nested", "array_of_objects", "enum",
                                            "pattern", "refs",   "recursive",        "union",
                                            "allof",   "tuple"};
    return kNames[kind];
  }

  ordered_json Make(int kind) {
    switch (kind) {
      case 0:
        return Object(Pick(3, 10), 0);
      case 1:
        return Object(Pick(2, 5), 2);
      case 2:
        return ordered_json{{"type", "object"},
                            {"properties", {{Name(), ArrayOf(Object(Pick(2, 5), 0))}}},
                            {"required", ordered_json::array()}};
      case 3:
        return Object(Pick(2, 4), 0, /*force=*/"enum");
      case 4:
        return Object(Pick(2, 5), 0, /*force=*/"pattern");
      case 5:
        return Refs();
      case 6:
        return Recursive();
      case 7:
        return Union();
      case 8:
        return ordered_json{{"allOf", {Object(Pick(1, 3), 0), Object(Pick(1, 3), 0)}}};
      default:
        return Tuple();
    }
  }

 private:
  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng_); }

  std::string Name() {
    static const char* kWords[] = {"id",     "name",    "title",   "email",  "age",   "price",
                                   "count",  "status",  "created", "tags",   "owner", "address",
                                   "city",   "country", "score",   "active", "notes", "version",
                                   "amount", "url",     "phone",   "kind",   "items", "summary"};
    std::string n = kWords[Pick(0, int(std::size(kWords)) - 1)];
    if (Coin(0.3)) n += "_" + std::string(kWords[Pick(0, int(std::size(kWords)) - 1)]);
    return n;
  }

  ordered_json Enum() {
    static const char* kValues[] = {"pending", "active", "done",   "failed", "red",   "green",
                                    "blue",    "small",  "medium", "large",  "north", "south",
                                    "east",    "west",   "admin",  "user",   "guest", "other"};
    ordered_json values = ordered_json::array();
    const int n = Pick(2, 12);
    for (int i = 0; i < n; ++i) values.push_back(kValues[Pick(0, int(std::size(kValues)) - 1)]);
    if (Coin(0.2)) values.push_back(nullptr);
    return {{"enum", values}};
  }

  ordered_json Pattern() {
    static const char* kPatterns[] = {
        "^\\d{4}-\\d{2}-\\d{2}$",
        "^[A-Z]{2,3}-\\d{3,6}$",
        "^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$",
        "^\\+?[0-9]{7,15}$",
        "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        "^(https?)://[a-z0-9.-]+(/[a-zA-Z0-9._-]*)*$",
        "^[A-Za-z ]{1,40}$",
        "^(\\d{1,3}\\.){3}\\d{1,3}$"};
    return {{"type", "string"}, {"pattern", kPatterns[Pick(0, int(std::size(kPatterns)) - 1)]}};
  }

  ordered_json Primitive(const std::string& force = "") {
    const int k = force == "enum" ? 6 : force == "pattern" ? 7 : Pick(0, 7);
    switch (k) {
      case 0:
        return {{"type", "string"}};
      case 1:
        return {{"type", "string"}, {"minLength", Pick(0, 3)}, {"maxLength", Pick(4, 64)}};
      case 2:
        return {{"type", "integer"}};
      case 3:
        return {{"type", "integer"}, {"minimum", Pick(-100, 0)}, {"maximum", Pick(1, 100000)}};
      case 4:
        return {{"type", "number"}};
      case 5:
        return Coin() ? ordered_json{{"type", "boolean"}}
                      : ordered_json{{"type", {"string", "null"}}};
      case 6:
        return Enum();
      default:
        return Pattern();
    }
  }

  ordered_json ArrayOf(ordered_json items) {
    ordered_json a = {{"type", "array"}, {"items", std::move(items)}};
    if (Coin()) a["minItems"] = Pick(0, 2);
    if (Coin()) a["maxItems"] = Pick(3, 10);
    return a;
  }

  // An object with `n` properties; `depth` more levels of nested objects / arrays below.
  ordered_json Object(int n, int depth, const std::string& force = "") {
    ordered_json props = ordered_json::object(), required = ordered_json::array();
    for (int i = 0; i < n; ++i) {
      std::string name = Name();
      while (props.contains(name)) name += "_" + std::to_string(i);
      ordered_json value;
      if (depth > 0 && Coin(0.4)) {
        value = Coin() ? Object(Pick(2, 4), depth - 1) : ArrayOf(Object(Pick(1, 3), depth - 1));
      } else if (Coin(0.15)) {
        value = ArrayOf(Primitive(force));
      } else {
        value = Primitive(force.empty() || Coin(0.5) ? force : "");
      }
      if (Coin(0.3)) value["description"] = "The " + name + " of the record.";
      props[name] = std::move(value);
      if (Coin(0.7)) required.push_back(name);
    }
    ordered_json o = {{"type", "object"}, {"properties", props}, {"required", required}};
    if (Coin(0.5)) o["additionalProperties"] = false;
    return o;
  }

  ordered_json Refs() {  // pydantic's shape: $defs, referenced more than once
    ordered_json defs = {{"Address", Object(Pick(2, 4), 0)}, {"Item", Object(Pick(2, 5), 0)}};
    return {{"$defs", defs},
            {"type", "object"},
            {"properties",
             {{"shipping", {{"$ref", "#/$defs/Address"}}},
              {"billing", {{"$ref", "#/$defs/Address"}}},
              {"items", {{"type", "array"}, {"items", {{"$ref", "#/$defs/Item"}}}}}}},
            {"required", {"shipping", "items"}}};
  }

  ordered_json Recursive() {  // a tree: children refer back to the node
    ordered_json node = Object(Pick(1, 3), 0);
    node["properties"]["children"] = {
        {"type", "array"}, {"items", {{"$ref", "#/$defs/Node"}}}, {"maxItems", Pick(2, 4)}};
    if (Coin()) {
      node["properties"]["parent"] = {{"anyOf", {{{"$ref", "#/$defs/Node"}}, {{"type", "null"}}}}};
    }
    return {{"$defs", {{"Node", node}}}, {"$ref", "#/$defs/Node"}};
  }

  ordered_json Union() {  // a discriminated union (oneOf with a const tag)
    ordered_json alts = ordered_json::array();
    const int n = Pick(2, 4);
    for (int i = 0; i < n; ++i) {
      ordered_json alt = Object(Pick(1, 4), 0);
      alt["properties"]["kind"] = {{"const", "variant_" + std::to_string(i)}};
      alt["required"].push_back("kind");
      alts.push_back(alt);
    }
    return {{Coin() ? "oneOf" : "anyOf", alts}};
  }

  ordered_json Tuple() {
    ordered_json prefix = ordered_json::array();
    const int n = Pick(2, 5);
    for (int i = 0; i < n; ++i) prefix.push_back(Primitive());
    return {{"type", "array"}, {"prefixItems", prefix}, {"items", false}};
  }

  std::mt19937 rng_;
};

}  // namespace llm::bench
