// Reading tokenizer.json into HfTokenizer's components. Every error names the file and the
// field ("tokenizer.json: pre_tokenizer.pretokenizers[1].behavior: ..."); a component the
// pipeline does not implement is refused by name, never skipped.
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace llm::hf {

using nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

class HfLoader {
 public:
  explicit HfLoader(std::string path) : path_(std::move(path)) {}

  std::unique_ptr<HfTokenizer> Load() {
    const json root = ReadJsonFile(path_);
    if (!root.is_object()) Fail("", "not a JSON object");
    auto tok = std::make_unique<HfTokenizer>();
    tok->path_ = path_;
    if (root.contains("version") && root["version"] != "1.0") {
      Fail("version", "unknown tokenizer version " + root["version"].dump());
    }
    if (!root.contains("model")) Fail("model", "missing");
    LoadModel(root["model"], "model", &tok->bpe_);
    if (const json* n = Get(root, "normalizer")) LoadNormalizer(*n, "normalizer", tok.get());
    if (const json* p = Get(root, "pre_tokenizer")) {
      LoadPreTokenizer(*p, "pre_tokenizer", &tok->pre_tokenizer_);
    }
    if (const json* d = Get(root, "decoder")) {
      tok->has_decoder_ = true;
      LoadDecoder(*d, "decoder", &tok->decoder_);
      CheckDecoderChain(tok.get());
    }
    int max_id = static_cast<int>(tok->bpe_.id_to_token.size()) - 1;
    if (const json* a = Get(root, "added_tokens")) LoadAddedTokens(*a, tok.get(), &max_id);
    tok->vocab_size_ = max_id + 1;
    if (const json* p = Get(root, "post_processor")) {
      std::vector<TemplateItem> items = {TemplateItem{true, {}}};
      LoadPostProcessor(*p, "post_processor", tok.get(), &items);
      bool only_sequence = items.size() == 1 && items[0].is_sequence;
      if (!only_sequence) tok->post_single_ = std::move(items);
    }
    return tok;
  }

 private:
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
  bool Bool(const json& object, const char* key, bool fallback, const std::string& field) const {
    const json* v = Get(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) Fail(field + "." + key, "must be true or false");
    return v->get<bool>();
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

  // Metaspace's prepend_scheme, with the older add_prefix_space (false means "never").
  PrependScheme Prepend(const json& object, const std::string& field) const {
    PrependScheme scheme = PrependScheme::kAlways;
    if (const json* p = Get(object, "prepend_scheme")) {
      const std::string s = p->is_string() ? p->get<std::string>() : "";
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
    if (!Bool(object, "add_prefix_space", true, field)) {
      if (scheme != PrependScheme::kNever && Get(object, "prepend_scheme") != nullptr) {
        Fail(field + ".add_prefix_space", "false does not match prepend_scheme");
      }
      scheme = PrependScheme::kNever;
    }
    return scheme;
  }

  void LoadModel(const json& m, const std::string& field, Bpe* bpe) const {
    if (!m.is_object()) Fail(field, "must be an object");
    const std::string type = Get(m, "type") ? String(m, "type", field) : "BPE";
    if (type != "BPE") Fail(field + ".type", "the " + type + " model is not supported (BPE is)");
    if (const json* d = Get(m, "dropout"); d != nullptr && !d->is_number()) {
      Fail(field + ".dropout", "must be a number or null");
    }
    bpe->unk_token = OptionalString(m, "unk_token", field);
    bpe->continuing_subword_prefix = OptionalString(m, "continuing_subword_prefix", field);
    bpe->end_of_word_suffix = OptionalString(m, "end_of_word_suffix", field);
    bpe->fuse_unk = Bool(m, "fuse_unk", false, field);
    bpe->byte_fallback = Bool(m, "byte_fallback", false, field);
    bpe->ignore_merges = Bool(m, "ignore_merges", false, field);
    const json* vocab = Get(m, "vocab");
    if (vocab == nullptr || !vocab->is_object()) Fail(field + ".vocab", "must be an object");
    bpe->vocab.reserve(vocab->size());
    int max_id = -1;
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= (1 << 30)) {
        Fail(field + ".vocab[\"" + it.key() + "\"]", "the id must be an integer in [0, 2^30)");
      }
      const int id = it->get<int>();
      bpe->vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    bpe->id_to_token.assign(max_id + 1, std::string_view());
    for (const auto& [token, id] : bpe->vocab) bpe->id_to_token[id] = token;
    auto id_of = [&](const std::string& token, const std::string& f) {
      auto it = bpe->vocab.find(token);
      if (it == bpe->vocab.end()) Fail(f, "\"" + token + "\" is not in the vocabulary");
      return it->second;
    };
    if (bpe->unk_token) {
      auto it = bpe->vocab.find(*bpe->unk_token);
      if (it == bpe->vocab.end()) {
        Fail(field + ".unk_token", "\"" + *bpe->unk_token + "\" is not in the vocabulary");
      }
      bpe->unk_id = it->second;
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = bpe->vocab.find(name);
      bpe->byte_ids[b] = it == bpe->vocab.end() ? -1 : it->second;
    }
    const json& merges = Array(m, "merges", field);
    const size_t prefix_length =
        bpe->continuing_subword_prefix ? bpe->continuing_subword_prefix->size() : 0;
    bpe->merges.reserve(merges.size());
    uint32_t rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& merge = merges[i];
      const std::string f = field + ".merges[" + std::to_string(i) + "]";
      std::string a, b;
      if (merge.is_string()) {
        const std::string line = merge.get<std::string>();
        if (line.starts_with("#version")) continue;
        const size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          Fail(f, "must be two tokens separated by one space");
        }
        a = line.substr(0, space);
        b = line.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      } else {
        Fail(f, "must be \"a b\" or [\"a\", \"b\"]");
      }
      const int a_id = id_of(a, f), b_id = id_of(b, f);
      if (b.size() < prefix_length) Fail(f, "\"" + b + "\" is shorter than the subword prefix");
      const int new_id = id_of(a + b.substr(prefix_length), f);
      const uint64_t key = (static_cast<uint64_t>(a_id) << 32) | static_cast<uint32_t>(b_id);
      bpe->merges[key] = Bpe::Merge{rank++, new_id};
    }
  }

  void LoadNormalizer(const json& n, const std::string& field, HfTokenizer* tok) const {
    const std::string type = Type(n, field);
    using K = NormalizerStep::Kind;
    NormalizerStep step;
    if (type == "Sequence") {
      const json& list = Array(n, "normalizers", field);
      for (size_t i = 0; i < list.size(); ++i) {
        LoadNormalizer(list[i], field + ".normalizers[" + std::to_string(i) + "]", tok);
      }
      return;
    } else if (type == "NFC") {
      step.kind = K::kNfc;
    } else if (type == "NFD") {
      step.kind = K::kNfd;
    } else if (type == "NFKC") {
      step.kind = K::kNfkc;
    } else if (type == "NFKD") {
      step.kind = K::kNfkd;
    } else if (type == "Lowercase") {
      step.kind = K::kLowercase;
    } else if (type == "Replace") {
      step.kind = K::kReplace;
      step.pattern = Pattern(n, field);
      step.content = String(n, "content", field);
    } else if (type == "Prepend") {
      step.kind = K::kPrepend;
      step.content = String(n, "prepend", field);
    } else if (type == "Strip") {
      step.kind = K::kStrip;
      step.strip_left = Bool(n, "strip_left", false, field);
      step.strip_right = Bool(n, "strip_right", false, field);
      if (step.strip_left) tok->strips_leading_ = true;
    } else {
      Fail(field + ".type", "the " + type + " normalizer is not supported");
    }
    tok->normalizer_.push_back(std::move(step));
  }

  void LoadPreTokenizer(const json& p, const std::string& field,
                        std::vector<PreTokenizerStep>* steps) const {
    const std::string type = Type(p, field);
    using K = PreTokenizerStep::Kind;
    PreTokenizerStep step;
    if (type == "Sequence") {
      const json& list = Array(p, "pretokenizers", field);
      for (size_t i = 0; i < list.size(); ++i) {
        LoadPreTokenizer(list[i], field + ".pretokenizers[" + std::to_string(i) + "]", steps);
      }
      return;
    } else if (type == "Split") {
      step.kind = K::kSplit;
      step.pattern = Pattern(p, field);
      step.behavior = Behavior(p, field);
      step.invert = Bool(p, "invert", false, field);
    } else if (type == "ByteLevel") {
      step.kind = K::kByteLevel;
      step.add_prefix_space = Bool(p, "add_prefix_space", true, field);
      step.use_regex = Bool(p, "use_regex", true, field);
      if (step.use_regex) step.pattern = std::make_shared<Regex>(kByteLevelPattern);
    } else if (type == "Metaspace") {
      step.kind = K::kMetaspace;
      step.replacement = OneChar(p, "replacement", field);
      step.prepend_scheme = Prepend(p, field);
      step.split = Bool(p, "split", true, field);
    } else if (type == "Digits") {
      step.kind = K::kDigits;
      step.individual_digits = Bool(p, "individual_digits", false, field);
    } else if (type == "Punctuation") {
      step.kind = K::kPunctuation;
      step.behavior = Behavior(p, field, SplitBehavior::kIsolated);
    } else if (type == "Whitespace") {
      step.kind = K::kWhitespace;
    } else if (type == "WhitespaceSplit") {
      step.kind = K::kWhitespaceSplit;
    } else {
      Fail(field + ".type", "the " + type + " pre-tokenizer is not supported");
    }
    steps->push_back(std::move(step));
  }

  void LoadDecoder(const json& d, const std::string& field, std::vector<DecoderStep>* steps) const {
    const std::string type = Type(d, field);
    using K = DecoderStep::Kind;
    DecoderStep step;
    if (type == "Sequence") {
      const json& list = Array(d, "decoders", field);
      for (size_t i = 0; i < list.size(); ++i) {
        LoadDecoder(list[i], field + ".decoders[" + std::to_string(i) + "]", steps);
      }
      return;
    } else if (type == "ByteLevel") {
      step.kind = K::kByteLevel;
    } else if (type == "Metaspace") {
      step.kind = K::kMetaspace;
      step.replacement = OneChar(d, "replacement", field);
      step.prepend_scheme = Prepend(d, field);
    } else if (type == "ByteFallback") {
      step.kind = K::kByteFallback;
    } else if (type == "Fuse") {
      step.kind = K::kFuse;
    } else if (type == "Strip") {
      step.kind = K::kStrip;
      step.content = OneChar(d, "content", field);
      step.start = Size(d, "start", field);
      step.stop = Size(d, "stop", field);
    } else if (type == "Replace") {
      step.kind = K::kReplace;
      step.pattern = Pattern(d, field, &step.literal);
      step.content = String(d, "content", field);
    } else {
      Fail(field + ".type", "the " + type + " decoder is not supported");
    }
    steps->push_back(std::move(step));
  }

  // After ByteLevel or Fuse the chain works on one string; a step there must be able to run
  // on pieces of it as they stream in.
  void CheckDecoderChain(HfTokenizer* tok) const {
    bool joined = false;
    for (const DecoderStep& step : tok->decoder_) {
      tok->decoder_joined_.push_back(joined);
      using K = DecoderStep::Kind;
      if (joined && (step.kind == K::kByteLevel || step.kind == K::kByteFallback ||
                     (step.kind == K::kReplace && step.literal.empty()))) {
        Fail("decoder",
             "a ByteLevel, ByteFallback or regex Replace step after a joining step "
             "(ByteLevel, Fuse) is not supported");
      }
      if (step.kind == K::kByteLevel || step.kind == K::kFuse) joined = true;
    }
  }

  void LoadAddedTokens(const json& list, HfTokenizer* tok, int* max_id) const {
    if (!list.is_array()) Fail("added_tokens", "must be an array");
    int next_id = static_cast<int>(tok->bpe_.vocab.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const json& t = list[i];
      const std::string f = "added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object()) Fail(f, "must be an object");
      AddedToken added;
      added.content = String(t, "content", f);
      if (added.content.empty()) continue;  // the library ignores empty tokens
      if (!t.contains("id") || !t["id"].is_number_unsigned()) {
        Fail(f + ".id", "must be a non-negative integer");
      }
      added.special = Bool(t, "special", false, f);
      added.single_word = Bool(t, "single_word", false, f);
      added.lstrip = Bool(t, "lstrip", false, f);
      added.rstrip = Bool(t, "rstrip", false, f);
      added.normalized = Bool(t, "normalized", !added.special, f);
      // The library assigns the id (AddedVocabulary::add_tokens): an existing token's, the
      // model's for a vocabulary token, else the next free one; the file's id must agree.
      int id;
      if (auto known = tok->TokenToId(added.content)) {
        id = *known;
      } else {
        id = next_id++;
      }
      if (t["id"].get<uint64_t>() != static_cast<uint64_t>(id)) {
        Fail(f + ".id", std::to_string(t["id"].get<uint64_t>()) + " but \"" + added.content +
                            "\" gets id " + std::to_string(id));
      }
      added.id = id;
      added.decoded = added.normalized ? tok->Normalize(added.content) : added.content;
      *max_id = std::max(*max_id, id);
      if (auto it = tok->added_by_id_.find(id); it != tok->added_by_id_.end()) {
        tok->added_[it->second] = added;
        continue;
      }
      tok->added_by_id_[id] = tok->added_.size();
      tok->added_by_content_[added.content] = tok->added_.size();
      tok->added_.push_back(std::move(added));
    }
    for (size_t i = 0; i < tok->added_.size(); ++i) {
      const AddedToken& a = tok->added_[i];
      if (a.normalized) {
        tok->normalized_trie_.Insert(a.decoded, static_cast<int>(i));
      } else {
        tok->raw_trie_.Insert(a.content, static_cast<int>(i));
      }
    }
  }

  // Composes the post-processor into *items (a template around the encoded sequence).
  void LoadPostProcessor(const json& p, const std::string& field, const HfTokenizer* tok,
                         std::vector<TemplateItem>* items) const {
    const std::string type = Type(p, field);
    auto wrap = [&](std::vector<TemplateItem> outer) {
      std::vector<TemplateItem> composed;
      for (TemplateItem& item : outer) {
        if (item.is_sequence) {
          composed.insert(composed.end(), items->begin(), items->end());
        } else {
          composed.push_back(std::move(item));
        }
      }
      *items = std::move(composed);
    };
    auto checked_id = [&](int64_t id, const std::string& f) {
      if (id < 0 || id >= tok->vocab_size_) {
        Fail(f, "id " + std::to_string(id) + " is outside the vocabulary (size " +
                    std::to_string(tok->vocab_size_) + ")");
      }
      return static_cast<int>(id);
    };
    if (type == "Sequence") {
      const json& list = Array(p, "processors", field);
      for (size_t i = 0; i < list.size(); ++i) {
        LoadPostProcessor(list[i], field + ".processors[" + std::to_string(i) + "]", tok, items);
      }
    } else if (type == "ByteLevel") {
      // Offsets only: the ids are unchanged.
    } else if (type == "TemplateProcessing") {
      const json& single = Array(p, "single", field);
      const json* specials = Get(p, "special_tokens");
      std::vector<TemplateItem> outer;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string f = field + ".single[" + std::to_string(i) + "]";
        const json& piece = single[i];
        if (piece.is_object() && piece.contains("Sequence")) {
          outer.push_back(TemplateItem{true, {}});
          continue;
        }
        if (!piece.is_object() || !piece.contains("SpecialToken")) {
          Fail(f, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        }
        const std::string name = String(piece["SpecialToken"], "id", f + ".SpecialToken");
        const json* entry = specials ? Get(*specials, name.c_str()) : nullptr;
        if (entry == nullptr) Fail(f, "special token \"" + name + "\" is not in special_tokens");
        const std::string ef = field + ".special_tokens[\"" + name + "\"]";
        const json& ids = Array(*entry, "ids", ef);
        TemplateItem item;
        for (size_t k = 0; k < ids.size(); ++k) {
          if (!ids[k].is_number_integer()) Fail(ef + ".ids", "must hold integers");
          item.ids.push_back(checked_id(ids[k].get<int64_t>(), ef + ".ids"));
        }
        outer.push_back(std::move(item));
      }
      wrap(std::move(outer));
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      auto special = [&](const char* key) {
        const json* v = Get(p, key);
        if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
          Fail(field + "." + key, "must be [token, id]");
        }
        return TemplateItem{false, {checked_id((*v)[1].get<int64_t>(), field + "." + key)}};
      };
      wrap({special("cls"), TemplateItem{true, {}}, special("sep")});
    } else {
      Fail(field + ".type", "the " + type + " post-processor is not supported");
    }
  }

  std::string path_;
};

std::unique_ptr<HfTokenizer> HfTokenizer::Load(const std::string& path) {
  return HfLoader(path).Load();
}

}  // namespace llm::hf
