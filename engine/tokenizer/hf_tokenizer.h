// Hugging Face's tokenizer.json (the `tokenizers` library's format), as the library runs it:
//   added tokens split out of the raw text (then, for `normalized` ones, out of the normalized
//   text) -> normalizer -> pre-tokenizer -> BPE model -> post-processor (encoding), and
//   ids -> tokens -> decoder chain (decoding).
// Component semantics follow the library's Rust sources (tokenizers/src/...); the tests compare
// against the library itself (npm `tokenizers`) on real tokenizer files and random text.
// Internal to engine/tokenizer/: the engine sees llm::Tokenizer (tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/tokenizer/flat_map.h"
#include "engine/tokenizer/regex.h"

namespace llm::hf {

struct AddedToken {
  int id = 0;
  std::string content;
  std::string decoded;  // what decoding yields: `content`, normalized when `normalized`
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A byte trie of added-token contents, matched leftmost-longest (the library's Aho-Corasick
// with MatchKind::LeftmostLongest).
class TokenTrie {
 public:
  void Insert(std::string_view text, int token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // The leftmost match in text[from:], longest at that position: {start, end, token index}.
  bool FindFrom(std::string_view text, size_t from, size_t* start, size_t* end, int* index) const;

 private:
  struct Node {
    std::unordered_map<unsigned char, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_{1};
  bool first_byte_[256] = {};
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend, kStrip };
  Kind kind = Kind::kNfc;
  std::shared_ptr<Regex> pattern;  // kReplace
  std::string content;             // kReplace: replacement; kPrepend: the prefix
  bool strip_left = false, strip_right = false;
};

// A piece of text between pre-tokenization steps; `first` when it starts at the original
// text's offset 0 (what Metaspace's prepend_scheme "first" asks). Where normalization or an
// earlier step may move characters (HfTokenizer::track_origins_), `origins` holds, per byte,
// the offset in the original text where its character begins, and `first` is origins[0] == 0
// (so a piece after a prepended or expanded character may be first too, as in the library).
struct PreToken {
  std::string text;
  bool first = false;
  std::vector<uint32_t> origins;  // empty: not tracked
};

// Replaces every match of `pattern` in *text by `content` (NormalizedString::replace). With
// `origins` (per byte of *text, see PreToken; nullptr: not tracked) the inserted bytes take the
// origin of the byte before the match's end, `base` at offset 0, as the library aligns them.
void ReplaceMatches(const Regex& pattern, std::string_view content, std::string* text,
                    std::vector<uint32_t>* origins, uint32_t base);

struct PreTokenizerStep {
  enum class Kind {
    kSplit,
    kByteLevel,
    kMetaspace,
    kDigits,
    kPunctuation,
    kWhitespace,
    kWhitespaceSplit
  };
  Kind kind = Kind::kSplit;
  std::shared_ptr<Regex> pattern;  // kSplit (a string pattern is a literal regex)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = true;          // kByteLevel
  std::string replacement;        // kMetaspace (one character)
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;               // kMetaspace
  bool individual_digits = false;  // kDigits
};

struct DecoderStep {
  enum class Kind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace };
  Kind kind = Kind::kFuse;
  std::shared_ptr<Regex> pattern;  // kReplace
  std::string literal;             // kReplace: the pattern when it is a plain string
  std::string content;             // kReplace: replacement; kStrip: the character
  std::string replacement;         // kMetaspace
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  size_t start = 0, stop = 0;  // kStrip
};

// The BPE model (models/bpe/model.rs).
struct Bpe {
  StringIds vocab;
  std::vector<std::string_view> id_to_token;  // views of vocab's texts; empty where no token
  using Merge = PairTable::Value;
  PairTable merges;
  std::optional<std::string> unk_token;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  int unk_id = -1;
  int byte_ids[256];  // "<0xNN>" ids (byte_fallback), -1 when absent

  Bpe();
  // Appends the ids of one pre-token (BPE::tokenize); thread-safe.
  void Tokenize(std::string_view word, std::vector<int>* ids) const;
  // The merging itself (BPE::merge_word), uncached.
  void MergeWord(std::string_view word, std::vector<int>* ids) const;
  uint64_t instance = 0;  // names this model in the per-thread word caches
};

// One post-processor item: special-token ids, or the encoded sequence.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int> ids;
};

class HfTokenizer;

// Streaming state of the decoder chain (one per Decode or IncrementalDecoder).
struct HfDecodeState {
  std::vector<size_t> tokens_seen;  // per step: tokens it has received (Metaspace's index)
  std::vector<std::string> held;    // per step: what it holds back (bytes, a partial match)
  std::vector<bool> started;        // per step: whether it has output anything (Strip)
  bool joined_any = false;          // no decoder: tokens are joined with " "
};

class HfTokenizer {
 public:
  // tokenizer.json; throws llm::Error naming `path` and the field at fault.
  static std::unique_ptr<HfTokenizer> Load(const std::string& path);

  // Encoding with add_special_tokens = false / true (the post-processor's specials).
  std::vector<int> Encode(std::string_view text, bool add_special_tokens) const;
  std::string Decode(std::span<const int> ids, bool skip_special_tokens) const;
  void DecodeStart(HfDecodeState* state) const;
  // Appends the text that `id` makes final; Finish appends what is still held back.
  void DecodePush(HfDecodeState* state, int id, bool skip_special_tokens, std::string* out) const;
  void DecodeFinish(HfDecodeState* state, std::string* out) const;

  int vocab_size() const { return vocab_size_; }
  // The token string of an id ("" outside the vocabulary).
  std::string_view IdToToken(int id) const;
  std::optional<int> TokenToId(std::string_view token) const;
  bool IsSpecial(int id) const;
  bool IsByteToken(int id) const;
  // The bytes `id` adds to a decoded text after other tokens (the decoder chain run on it
  // alone in a continuation: byte-level bytes, "▁" as " ", <0xNN> as its byte); nullopt for
  // a special token or an id outside the vocabulary.
  std::optional<std::string> TokenBytes(int id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const std::string& path() const { return path_; }

 private:
  friend class HfLoader;
  // Encodes the text between two raw added tokens, `offset` bytes into the text.
  void EncodeSegment(std::string_view raw, size_t offset, std::vector<int>* ids) const;
  void PreTokenize(std::vector<PreToken>* pieces) const;
  // The normalizer chain (hf_normalize.cc); `origins`, when given, are updated with the text
  // (`base`: the origin of an insertion at offset 0, the text's own start).
  std::string Normalize(std::string_view text, std::vector<uint32_t>* origins = nullptr,
                        uint32_t base = 0) const;
  // Runs tokens through decoder steps from `step` on (the streaming chain).
  void Feed(HfDecodeState* state, size_t step, std::string token, std::string* out) const;
  void FlushStep(HfDecodeState* state, size_t step, std::string* out) const;

  std::string path_;
  Bpe bpe_;
  std::vector<AddedToken> added_;
  std::unordered_map<int, size_t> added_by_id_;
  std::unordered_map<std::string, size_t> added_by_content_;
  struct ViewHash {  // lookups by std::string_view, no copy (decoding looks up every token)
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // every content added as special
  std::unordered_set<std::string, ViewHash, std::equal_to<>> special_contents_;
  TokenTrie raw_trie_, normalized_trie_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  bool has_decoder_ = false;
  std::vector<DecoderStep> decoder_;
  std::vector<bool> decoder_joined_;       // per step: whether its input is one joined string
  std::vector<TemplateItem> post_single_;  // the single template; empty: the ids as they are
  bool track_origins_ = false;  // a Metaspace "first" step after steps that move characters
  int vocab_size_ = 0;
};

}  // namespace llm::hf
