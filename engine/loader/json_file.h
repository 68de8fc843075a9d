// Reading a JSON file with errors that name it (config.json, the shard index, ...).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace llm {

// Nesting that JSON from a client may have. nlohmann parses any depth, but copying or printing
// a value recurses once per level: 200,000 nested brackets overflowed the stack (a request
// body, a schema). Bodies and schemas deeper than this are refused before they are parsed.
constexpr size_t kMaxJsonDepth = 512;
// The deepest nesting of [ and { in JSON text (brackets in strings are skipped; the text need
// not be valid).
size_t JsonNestingDepth(std::string_view text);

// Throws llm::Error("<path>: cannot open" / "<path>: not well-formed JSON: ...").
nlohmann::json ReadJsonFile(const std::string& path);

}  // namespace llm
