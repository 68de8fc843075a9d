#include "engine/loader/json_file.h"

#include <fstream>
#include <sstream>

#include "engine/error.h"

namespace llm {

nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not well-formed JSON: " + e.what());
  }
}

}  // namespace llm
