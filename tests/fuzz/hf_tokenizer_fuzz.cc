// Fuzzes the tokenizer.json pipeline (engine/tokenizer/hf_*.cc). The first byte picks the mode,
// the rest is the payload:
//   0: a tokenizer.json file, optionally followed by "\xff\xfe" and a text (bytes JSON cannot
//      hold): loaded, then the text (or a fixed one) encoded and decoded, and the ids up to
//      1,024 decoded;
//   1: text encoded by two fixed tokenizers that use every component (a SentencePiece-like
//      one: normalizers, Split, Punctuation, Metaspace "first", byte fallback, added tokens
//      with every flag, a template, Llama 2's decoder chain; and a byte-level one), then
//      decoded;
//   2: token ids (little-endian int16 pairs, so some are negative or beyond the vocabulary)
//      decoded by both, with and without special tokens, whole and streamed.
// Texts and id lists are cut to their first KiB.
// Every input must load or throw llm::Error; decoding never throws, nor does encoding with the
// fixed tokenizers (a fuzzed file's regex may hit PCRE2's match limits: llm::Error); encoded
// ids are in the vocabulary; an IncrementalDecoder's Push + Flush equals Decode.
//
//   scripts/fuzz.sh hf_tokenizer
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::json;

// A folder of its own for the process's tokenizer.json files (the loader picks the format by
// the file name).
const std::filesystem::path& WorkDir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "hf_fuzz.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) abort();
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// <dir>/fuzzed/tokenizer.json, a link to an in-memory file the input is written to.
const std::string& WriteFuzzedFile(const uint8_t* data, size_t size) {
  static llm::fuzz::MemFile file;
  static const std::string path = [] {
    const std::filesystem::path folder = WorkDir() / "fuzzed";
    std::filesystem::create_directories(folder);
    std::filesystem::create_symlink(file.Write(nullptr, 0), folder / "tokenizer.json");
    return (folder / "tokenizer.json").string();
  }();
  file.Write(data, size);
  return path;
}

// A BPE vocabulary: `chars` one token each, then the merges (their results added).
json Model(const std::vector<std::string>& chars,
           const std::vector<std::pair<std::string, std::string>>& merges, bool byte_fallback) {
  json vocab = json::object();
  auto add = [&](const std::string& token) {
    if (!vocab.contains(token)) vocab[token] = vocab.size();
  };
  add("<unk>");
  if (byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      add(name);
    }
  }
  for (const std::string& c : chars) add(c);
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    add(a);
    add(b);
    add(a + b);
    merge_list.push_back(a + " " + b);
  }
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", "<unk>"},
          {"fuse_unk", true},
          {"byte_fallback", byte_fallback},
          {"vocab", vocab},
          {"merges", merge_list}};
}

json Added(int id, const std::string& content, bool special, bool normalized, bool lstrip,
           bool rstrip, bool single_word) {
  return {{"id", id},
          {"content", content},
          {"special", special},
          {"normalized", normalized},
          {"lstrip", lstrip},
          {"rstrip", rstrip},
          {"single_word", single_word}};
}

json Pattern(const char* kind, const std::string& value) { return {{kind, value}}; }

std::string SentencePieceLike() {
  const std::string meta = "\xE2\x96\x81";
  std::vector<std::string> chars = {meta, " ", "'", ".", ",", "!", "?", "-"};
  for (char c = 'a'; c <= 'z'; ++c) chars.emplace_back(1, c);
  for (char c = '0'; c <= '9'; ++c) chars.emplace_back(1, c);
  json model = Model(chars,
                     {{meta, "t"},
                      {"h", "e"},
                      {meta + "t", "he"},
                      {"i", "n"},
                      {meta, "a"},
                      {"n", "d"},
                      {meta + "a", "nd"},
                      {"l", "l"},
                      {"o", "w"},
                      {"e", "r"}},
                     /*byte_fallback=*/true);
  const int n = static_cast<int>(model["vocab"].size());
  const json added = {Added(n, "<s>", true, false, false, false, false),
                      Added(n + 1, "</s>", true, false, false, false, false),
                      Added(n + 2, "[MASK]", true, false, true, true, false),
                      Added(n + 3, "tok", false, true, false, false, true),
                      Added(n + 4, "<X>", true, true, false, true, false),
                      Added(n + 5, meta + "xyz", false, false, false, false, false)};
  const json sequence_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json sequence_b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  auto special = [](const char* name) {
    return json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
  };
  return json{{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer",
               {{"type", "Sequence"},
                {"normalizers",
                 {{{"type", "NFKC"}},
                  {{"type", "Lowercase"}},
                  {{"type", "Replace"}, {"pattern", Pattern("Regex", "\\s+")}, {"content", " "}},
                  {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}}}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", Pattern("Regex", "\\p{N}{1,3}|(?i:'s|'t)")},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "Punctuation"}, {"behavior", "MergedWithPrevious"}},
                  {{"type", "Digits"}, {"individual_digits", false}},
                  {{"type", "Metaspace"},
                   {"replacement", meta},
                   {"prepend_scheme", "first"},
                   {"split", true}}}}}},
              {"model", model},
              {"post_processor",
               {{"type", "TemplateProcessing"},
                {"single", {special("<s>"), sequence_a, special("</s>")}},
                {"pair", {sequence_a, sequence_b}},
                {"special_tokens",
                 {{"<s>", {{"id", "<s>"}, {"ids", {n}}, {"tokens", {"<s>"}}}},
                  {"</s>", {{"id", "</s>"}, {"ids", {n + 1}}, {"tokens", {"</s>"}}}}}}}},
              {"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {{{"type", "Replace"}, {"pattern", Pattern("String", meta)}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}}
      .dump();
}

std::string ByteLevelLike() {
  std::vector<std::string> chars;  // GPT-2's byte-level alphabet
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int c = printable ? b : 256 + n++;
    std::string s;
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    chars.push_back(s);
  }
  const std::string space = "\xC4\xA0";  // Ġ
  json model = Model(chars, {{space, "t"}, {"h", "e"}, {space + "t", "he"}, {"i", "n"}},
                     /*byte_fallback=*/false);
  model["ignore_merges"] = true;
  const int size = static_cast<int>(model["vocab"].size());
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}};
  return json{
      {"version", "1.0"},
      {"added_tokens",
       {Added(size, "<|eot|>", true, false, false, false, false),
        Added(size + 1, "the", false, true, false, false, false)}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            Pattern("Regex",
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")},
           {"behavior", "Isolated"},
           {"invert", false}},
          byte_level}}}},
      {"model", model},
      {"post_processor", byte_level},
      {"decoder", byte_level}}
      .dump();
}

const std::vector<std::unique_ptr<llm::Tokenizer>>& FixedTokenizers() {
  static const std::vector<std::unique_ptr<llm::Tokenizer>> tokenizers = [] {
    std::vector<std::unique_ptr<llm::Tokenizer>> out;
    int i = 0;
    for (const std::string& text : {SentencePieceLike(), ByteLevelLike()}) {
      const std::filesystem::path folder = WorkDir() / ("fixed" + std::to_string(i++));
      std::filesystem::create_directories(folder);
      std::ofstream(folder / "tokenizer.json") << text;
      out.push_back(llm::Tokenizer::FromFile((folder / "tokenizer.json").string()));
    }
    return out;
  }();
  return tokenizers;
}

void CheckDecode(const llm::Tokenizer& tokenizer, std::span<const int> ids) {
  for (const bool skip : {false, true}) {
    llm::IncrementalDecoder decoder(tokenizer, {}, skip);
    std::string streamed;
    for (int id : ids) streamed += decoder.Push(id);
    streamed += decoder.Flush();
    if (streamed != tokenizer.Decode(ids, skip)) __builtin_trap();
  }
}

// Both encodings' ids must be in the vocabulary; the prompt's (with special tokens) are decoded.
void EncodeDecode(const llm::Tokenizer& tokenizer, std::string_view text) {
  const std::vector<int> prompt = tokenizer.EncodePrompt(text);
  for (const std::vector<int>& ids : {tokenizer.Encode(text), prompt}) {
    for (int id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
    }
  }
  CheckDecode(tokenizer, prompt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const std::string_view payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Texts and id lists past 1 KiB find nothing new and cost the most (each is encoded and
  // decoded eight times, under ASan).
  const std::string_view head = payload.substr(0, 1024);
  if (mode == 0) {
    const auto [file, text] = llm::fuzz::SplitAt(payload, "\xff\xfe");
    std::unique_ptr<llm::Tokenizer> tokenizer;
    try {
      tokenizer = llm::Tokenizer::FromFile(
          WriteFuzzedFile(reinterpret_cast<const uint8_t*>(file.data()), file.size()));
    } catch (const llm::Error&) {
      return 0;
    }
    try {  // a fuzzed regex may run into PCRE2's match limits: an llm::Error, not a crash
      EncodeDecode(*tokenizer, text.empty() ? std::string_view("Hello world, I'm 42! \xe2\x96\x81 "
                                                               "<s> \xf0\x9f\x98\x80 \xff")
                                            : text.substr(0, 1024));
    } catch (const llm::Error&) {
    }
    std::vector<int> all(std::min(tokenizer->vocab_size() + 2, 1024));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    CheckDecode(*tokenizer, all);
    for (int id : all) tokenizer->PieceToId(tokenizer->IdToPiece(id));
  } else if (mode == 1) {
    for (const auto& tokenizer : FixedTokenizers()) EncodeDecode(*tokenizer, head);
  } else {
    std::vector<int> ids(head.size() / 2);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int16_t>(static_cast<uint8_t>(head[2 * i]) |
                                    (static_cast<uint8_t>(head[2 * i + 1]) << 8));
    }
    for (const auto& tokenizer : FixedTokenizers()) CheckDecode(*tokenizer, ids);
  }
  return 0;
}
