// Synthetic tokenizer.json files for the differential tests of tokenizer_hf_components_test.cc
// and tokenizer_hf_load_test.cc: a BPE vocabulary builder (characters or the byte-level
// alphabet, merges learned from a few words), one builder per component, and the comparison
// of our tokenizer with the library (npm `tokenizers`, one node process) on a batch of files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llm::test {

using nlohmann::json;

// The model options of a synthetic BPE tokenizer (models/bpe/model.rs's fields).
struct SyntheticBpeOptions {
  std::optional<std::string> unk_token;  // added to the vocabulary
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool byte_fallback = false;  // also adds the 256 "<0xNN>" tokens
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool merges_as_pairs = false;  // [["a", "b"], ...] instead of ["a b", ...]
  json dropout = nullptr;
};

// A tokenizer.json holding a BPE model: one token per character of `alphabet` (with the
// subword prefix / word suffix forms the options ask for), then merges learned from `words`
// (the most frequent adjacent pair first, `num_merges` times, as BPE training does), and every
// other component null for the caller to set. `words` are split into characters; a character
// missing from the alphabet is added.
json SyntheticBpeTokenizer(const std::vector<std::string>& alphabet,
                           const std::vector<std::string>& words, int num_merges,
                           const SyntheticBpeOptions& options = {});
// The byte-level alphabet (GPT-2's bytes_char): 256 characters, one per byte.
std::vector<std::string> ByteLevelAlphabet();
// `text`'s bytes as byte-level characters ("Ġ" for a space).
std::string ByteLevelString(std::string_view text);
// One added_tokens entry.
json AddedTokenJson(int id, const std::string& content, bool special, bool normalized = false,
                    bool lstrip = false, bool rstrip = false, bool single_word = false);

inline const std::string kMeta = "\xE2\x96\x81";  // ▁, Metaspace's replacement

// Words the merges are learned from and the texts are made of.
const std::vector<std::string>& SyntheticWords();
// One token per character: printable ASCII, space, newline, tab, ▁ and a few non-ASCII ones.
std::vector<std::string> CharAlphabet();
// The words as the model sees them after a pre-tokenizer: plain, after Metaspace (a leading
// ▁, spaces as ▁) or after ByteLevel (byte-level characters, "Ġ" for a space).
enum class Surface { kPlain, kMetaspace, kByteLevel };
std::vector<std::string> ModelWords(Surface surface);
// Model options by name: "unk" (<unk>), "fuse", "bytes" (byte_fallback), "prefix" (##),
// "suffix" (</w>), "ignore" (ignore_merges), "pairs" (merges as pairs), "dropout0", "dropout2".
SyntheticBpeOptions BpeOptions(const std::string& flags);
// A character vocabulary with merges learned from ModelWords(surface); a byte-level one.
json CharBpe(Surface surface, const std::string& options = "unk", int num_merges = 80);
json ByteBpe(int num_merges = 120);
// Appends added tokens with the ids the library gives them (the model's id for a vocabulary
// token, an earlier entry's for the same content, else the next one after the vocabulary).
void AddTokens(json* file, const std::vector<json>& tokens);
json SpecialToken(const std::string& content);  // special, not normalized
int IdOf(const json& file, const std::string& token);
void AddBosEos(json* file);  // <s> and </s>, special

// Components, with every field the library requires.
json Pattern(const std::string& kind, const std::string& value);  // {"String"|"Regex": value}
json SplitPre(const json& pattern, const std::string& behavior, bool invert);
json ByteLevel(bool add_prefix_space, bool use_regex);  // pre-tokenizer, decoder, processor
json Metaspace(const std::string& scheme, bool split, const std::string& replacement = kMeta);
json MetaspaceDecoder(const std::string& scheme, const std::string& replacement = kMeta);
json Seq(const char* key, std::vector<json> items);  // {"type": "Sequence", key: items}
json ReplaceStep(const json& pattern, const std::string& content);  // normalizer or decoder
// Strip with stop > 0 is not compared: strip.rs panics on a token of fewer than `stop`
// characters, all of them `content` (and where start and stop overlap), which ends the oracle.
json StripDecoder(const std::string& content, int start, int stop);
// Llama 2's decoder: ▁ -> space, byte tokens to bytes, one string, one leading space off.
json Llama2Decoder();
// A TemplateProcessing whose single template is `single` ("$A" or special tokens of `file`).
json TemplateProcessor(const std::vector<std::string>& single, const json& file);
// SyntheticWords() and `extra`: what a case's texts are made of.
std::vector<std::string> PiecesOf(std::vector<std::string> extra = {});

// One synthetic tokenizer.json and the strings its texts are made of.
struct SyntheticCase {
  std::string name;
  json file;
  std::vector<std::string> pieces;
};

struct LibraryComparison {
  int num_differences = 0;
  std::string details;  // the first differences of each case
  std::string summary;  // one line per case
};

// Writes each case's file under `dir` and checks it against the library (one node process):
// a file the library refuses, we must refuse (and load what it loads); a few hundred texts
// (random ones, ones of the case's pieces) must give its ids with and without special tokens;
// decoding our ids and random id lists, its text with and without skipping special tokens;
// the IncrementalDecoder's stream, our whole Decode.
LibraryComparison CompareWithLibrary(const std::vector<SyntheticCase>& cases,
                                     const std::filesystem::path& dir, uint32_t seed);

}  // namespace llm::test
