// Reading a JSON file with errors that name it (config.json, the shard index, ...).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace llm {

// Throws llm::Error("<path>: cannot open" / "<path>: not well-formed JSON: ...").
nlohmann::json ReadJsonFile(const std::string& path);

}  // namespace llm
