// Reading tokenizer.json into HfTokenizer's components. Every error names the file and the
// field ("tokenizer.json: pre_tokenizer.pretokenizers[1].behavior: ..."); a component the
// pipeline does not implement is refused by name, never skipped.
#include <simdjson.h>

#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/tokenizer/hf_fields.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace llm::hf {

using nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

class HfLoader : public FieldReader {
 public:
  explicit HfLoader(std::string path) : FieldReader(std::move(path)) {}

  std::unique_ptr<HfTokenizer> Load() {
    const json root = Parse();
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
    // Metaspace "first" asks whether a piece starts at the text's offset 0; a normalizer or an
    // earlier text-changing step (ByteLevel, Metaspace) can move that, so origins are tracked.
    bool moves_characters = !tok->normalizer_.empty();
    for (const PreTokenizerStep& step : tok->pre_tokenizer_) {
      using K = PreTokenizerStep::Kind;
      if (step.kind == K::kMetaspace && step.prepend_scheme == PrependScheme::kFirst) {
        tok->track_origins_ = tok->track_origins_ || moves_characters;
      }
      moves_characters =
          moves_characters || step.kind == K::kByteLevel || step.kind == K::kMetaspace;
    }
    if (const json* d = Get(root, "decoder")) {
      tok->has_decoder_ = true;
      LoadDecoder(*d, "decoder", &tok->decoder_);
      CheckDecoderChain(tok.get());
    }
    int max_id = static_cast<int>(tok->bpe_.id_to_token.size()) - 1;
    if (root.contains("added_tokens")) LoadAddedTokens(root["added_tokens"], tok.get(), &max_id);
    tok->vocab_size_ = max_id + 1;
    if (const json* p = Get(root, "post_processor")) {
      std::vector<TemplateItem> items = {TemplateItem{true, {}}};
      LoadPostProcessor(*p, "post_processor", tok.get(), &items);
      const bool only_sequence = items.size() == 1 && items[0].is_sequence;
      if (!only_sequence) tok->post_single_ = std::move(items);
    }
    return tok;
  }

 private:
  // simdjson reads the file (a 33 MB tokenizer.json in tens of milliseconds, where a
  // nlohmann::json DOM takes about a second); everything but the model's vocab and merges,
  // which LoadModel walks in simdjson's DOM, is handed to nlohmann::json for the checks below.
  json Parse() {
    auto loaded = simdjson::padded_string::load(path_);
    if (loaded.error()) Fail("", "cannot read the file");
    file_ = std::move(loaded.value());
    simdjson::dom::element doc;
    if (const auto error = parser_.parse(file_).get(doc)) {
      Fail("", std::string("not well-formed JSON: ") + simdjson::error_message(error));
    }
    simdjson::dom::object object;
    if (doc.get_object().get(object)) Fail("", "not a JSON object");
    auto to_json = [](simdjson::dom::element e) { return json::parse(simdjson::minify(e)); };
    json root = json::object();
    for (const auto field : object) {
      const std::string key(field.key);
      if (key != "model" || !field.value.is_object()) {
        root[key] = to_json(field.value);
        continue;
      }
      json model = json::object();
      simdjson::dom::object model_object;
      if (field.value.get_object().get(model_object)) Fail("model", "must be an object");
      for (const auto m : model_object) {
        if (m.key == "vocab") {
          vocab_ = m.value;
          model["vocab"] = true;  // present; read from vocab_
        } else if (m.key == "merges") {
          merges_ = m.value;
          model["merges"] = true;
        } else {
          model[std::string(m.key)] = to_json(m.value);
        }
      }
      root[key] = std::move(model);
    }
    return root;
  }

  void LoadModel(const json& m, const std::string& field, Bpe* bpe) const {
    if (!m.is_object()) Fail(field, "must be an object");
    const std::string type = Get(m, "type") ? String(m, "type", field) : "BPE";
    if (type != "BPE") Fail(field + ".type", "the " + type + " model is not supported (BPE is)");
    // Dropout is a training-time randomization: inference ignores it (the library with
    // dropout > 0 skips merges at random). Its range is checked as the library checks it.
    if (const json* d = Get(m, "dropout");
        d != nullptr && (!d->is_number() || d->get<double>() < 0 || d->get<double>() > 1)) {
      Fail(field + ".dropout", "must be a number in [0, 1] or null");
    }
    bpe->unk_token = OptionalString(m, "unk_token", field);
    bpe->continuing_subword_prefix = OptionalString(m, "continuing_subword_prefix", field);
    bpe->end_of_word_suffix = OptionalString(m, "end_of_word_suffix", field);
    bpe->fuse_unk = Bool(m, "fuse_unk", false, field);
    bpe->byte_fallback = Bool(m, "byte_fallback", false, field);
    bpe->ignore_merges = Bool(m, "ignore_merges", false, field);
    simdjson::dom::object vocab;
    if (Get(m, "vocab") == nullptr || vocab_.get_object().get(vocab)) {
      Fail(field + ".vocab", "must be an object");
    }
    bpe->vocab.Reserve(vocab.size(), vocab.size() * 8);
    int max_id = -1;
    for (const auto entry : vocab) {
      int64_t id = -1;
      if (entry.value.get_int64().get(id) || id < 0 || id >= (1 << 30)) {
        Fail(field + ".vocab[\"" + std::string(entry.key) + "\"]",
             "the id must be an integer in [0, 2^30)");
      }
      bpe->vocab.Insert(entry.key, static_cast<int>(id));
      max_id = std::max(max_id, static_cast<int>(id));
    }
    // Ids index dense tables (id -> token, the model's vocab_size): gaps are fine, a few ids
    // spread up to 2^30 (gigabytes of table for a kilobyte file) are refused.
    const int64_t num_tokens = static_cast<int64_t>(vocab.size());
    if (max_id >= num_tokens + (1 << 20)) {
      Fail(field + ".vocab", "the largest id, " + std::to_string(max_id) +
                                 ", leaves more than 2^20 ids unused (" +
                                 std::to_string(num_tokens) + " tokens)");
    }
    bpe->id_to_token.assign(max_id + 1, std::string_view());
    bpe->vocab.ForEach([&](std::string_view token, int id) { bpe->id_to_token[id] = token; });
    if (bpe->unk_token) {
      bpe->unk_id = bpe->vocab.Find(*bpe->unk_token);
      if (bpe->unk_id < 0) {
        Fail(field + ".unk_token", "\"" + *bpe->unk_token + "\" is not in the vocabulary");
      }
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      bpe->byte_ids[b] = bpe->vocab.Find(name);
    }
    simdjson::dom::array merges;
    if (Get(m, "merges") == nullptr || merges_.get_array().get(merges)) {
      Fail(field + ".merges", "must be an array");
    }
    const size_t prefix_length =
        bpe->continuing_subword_prefix ? bpe->continuing_subword_prefix->size() : 0;
    bpe->merges.Reserve(merges.size());
    // The merges' texts first, then their ids looked up on every core (millions of lookups
    // for a big vocabulary), then the table in rank order.
    struct Pair {
      std::string_view a, b;
      size_t index;  // in the file (for errors)
    };
    std::vector<Pair> pairs;
    pairs.reserve(merges.size());
    size_t index = 0;
    // One form for the whole list (the library reads either Vec<String> or Vec<(String, String)>).
    const bool as_strings = merges.size() > 0 && merges.at(0).is_string();
    for (const simdjson::dom::element merge : merges) {
      const size_t i = index++;
      const auto where = [&] { return field + ".merges[" + std::to_string(i) + "]"; };
      std::string_view a, b, line;
      simdjson::dom::array pair;
      if (merge.is_string() != as_strings) {
        Fail(where(), "merges must be all \"a b\" strings or all [\"a\", \"b\"] pairs");
      }
      if (!merge.get_string().get(line)) {
        if (line.starts_with("#version")) continue;
        const size_t space = line.find(' ');
        if (space == std::string_view::npos ||
            line.find(' ', space + 1) != std::string_view::npos) {
          Fail(where(), "must be two tokens separated by one space");
        }
        a = line.substr(0, space);
        b = line.substr(space + 1);
      } else if (merge.get_array().get(pair) || pair.size() != 2 ||
                 pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b)) {
        Fail(where(), "must be \"a b\" or [\"a\", \"b\"]");
      }
      pairs.push_back(Pair{a, b, i});
    }
    struct Ids {
      int a, b, merged;  // -1: not in the vocabulary; -2: b shorter than the subword prefix
    };
    std::vector<Ids> ids(pairs.size());
    const int64_t n = static_cast<int64_t>(pairs.size());
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; ++k) {
      const Pair& p = pairs[k];
      Ids& out = ids[k];
      out.a = bpe->vocab.Find(p.a);
      out.b = bpe->vocab.Find(p.b);
      if (p.b.size() < prefix_length) {
        out.merged = -2;
        continue;
      }
      std::string merged;
      merged.reserve(p.a.size() + p.b.size());
      merged.append(p.a).append(p.b.substr(prefix_length));
      out.merged = bpe->vocab.Find(merged);
    }
    for (size_t k = 0; k < pairs.size(); ++k) {
      const Ids& m = ids[k];
      if (m.a >= 0 && m.b >= 0 && m.merged >= 0) {
        bpe->merges.Insert(m.a, m.b, Bpe::Merge{static_cast<uint32_t>(k), m.merged});
        continue;
      }
      const Pair& p = pairs[k];
      const std::string where = field + ".merges[" + std::to_string(p.index) + "]";
      const std::string_view missing = m.a < 0 ? p.a : m.b < 0 ? p.b : std::string_view();
      if (!missing.empty() || m.merged == -1) {
        const std::string text = !missing.empty()
                                     ? std::string(missing)
                                     : std::string(p.a) + std::string(p.b.substr(prefix_length));
        Fail(where, "\"" + text + "\" is not in the vocabulary");
      }
      Fail(where, "\"" + std::string(p.b) + "\" is shorter than the subword prefix");
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
      step.strip_left = RequiredBool(n, "strip_left", field);
      step.strip_right = RequiredBool(n, "strip_right", field);
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
      step.invert = RequiredBool(p, "invert", field);
    } else if (type == "ByteLevel") {
      step.kind = K::kByteLevel;
      step.add_prefix_space = ByteLevelFlags(p, field, &step.use_regex);
      if (step.use_regex) step.pattern = std::make_shared<Regex>(kByteLevelPattern);
    } else if (type == "Metaspace") {
      step.kind = K::kMetaspace;
      step.replacement = OneChar(p, "replacement", field);
      step.prepend_scheme = Prepend(p, field);
      step.split = Bool(p, "split", true, field);
    } else if (type == "Digits") {
      step.kind = K::kDigits;
      step.individual_digits = RequiredBool(p, "individual_digits", field);
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
      ByteLevelFlags(d, field);
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
             "a ByteLevel, ByteFallback or Replace (of a regex or of \"\") step after a "
             "joining step (ByteLevel, Fuse) is not supported");
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
      if (!t.contains("id") || !t["id"].is_number_unsigned()) {
        Fail(f + ".id", "must be a non-negative integer");
      }
      added.special = RequiredBool(t, "special", f);
      added.single_word = RequiredBool(t, "single_word", f);
      added.lstrip = RequiredBool(t, "lstrip", f);
      added.rstrip = RequiredBool(t, "rstrip", f);
      added.normalized = RequiredBool(t, "normalized", f);
      if (added.content.empty()) continue;  // the library skips empty tokens (no id)
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
      // What decoding yields: the normalized form the library caches per id when it differs
      // from the content; a later entry of the same content without one keeps the earlier's
      // (add_tokens never clears the cache).
      const auto existing = tok->added_by_id_.find(id);
      added.decoded = added.normalized ? tok->Normalize(added.content) : added.content;
      if (added.normalized && added.decoded.empty()) {
        Fail(f + ".normalized",
             "\"" + added.content + "\" normalizes to an empty string (it would match everywhere)");
      }
      if (added.decoded == added.content && existing != tok->added_by_id_.end()) {
        added.decoded = tok->added_[existing->second].decoded;
      }
      // Decoding skips a token whose text was ever added as special (the library's set of
      // special contents only grows).
      if (added.special) tok->special_contents_.insert(added.content);
      *max_id = std::max(*max_id, id);
      if (existing != tok->added_by_id_.end()) {
        tok->added_[existing->second] = added;
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
      ByteLevelFlags(p, field);  // offsets only: the ids are unchanged
    } else if (type == "TemplateProcessing") {
      // single, pair and special_tokens are all required; every special token a template
      // names must be defined (the library panics on encoding otherwise), and `single` has
      // only sequence A (B indexes a second encoding a single text does not have).
      const json* specials = Get(p, "special_tokens");
      if (specials == nullptr || !specials->is_object()) {
        Fail(field + ".special_tokens", "must be an object");
      }
      std::vector<TemplateItem> outer;
      for (const char* key : {"single", "pair"}) {
        const json& pieces = Array(p, key, field);
        for (size_t i = 0; i < pieces.size(); ++i) {
          const std::string f = field + "." + key + "[" + std::to_string(i) + "]";
          const json& piece = pieces[i];
          const bool is_sequence = piece.is_object() && piece.size() == 1 &&
                                   piece.contains("Sequence") && piece["Sequence"].is_object();
          const bool is_special = piece.is_object() && piece.size() == 1 &&
                                  piece.contains("SpecialToken") &&
                                  piece["SpecialToken"].is_object();
          if (!is_sequence && !is_special) {
            Fail(f, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
          }
          const json& body = piece[is_sequence ? "Sequence" : "SpecialToken"];
          const std::string bf = f + (is_sequence ? ".Sequence" : ".SpecialToken");
          Size(body, "type_id", bf);
          const std::string name = String(body, "id", bf);
          const bool is_single = std::string(key) == "single";
          if (is_sequence) {
            if (name != "A" && name != "B") Fail(bf + ".id", "must be \"A\" or \"B\"");
            if (is_single && name == "B") Fail(bf + ".id", "a single template has only A");
            if (is_single) outer.push_back(TemplateItem{true, {}});
            continue;
          }
          const json* entry = Get(*specials, name.c_str());
          if (entry == nullptr) Fail(f, "special token \"" + name + "\" is not in special_tokens");
          const std::string ef = field + ".special_tokens[\"" + name + "\"]";
          const json& ids = Array(*entry, "ids", ef);
          Array(*entry, "tokens", ef);
          TemplateItem item;
          for (size_t k = 0; k < ids.size(); ++k) {
            if (!ids[k].is_number_integer()) Fail(ef + ".ids", "must hold integers");
            item.ids.push_back(checked_id(ids[k].get<int64_t>(), ef + ".ids"));
          }
          if (is_single) outer.push_back(std::move(item));
        }
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

  simdjson::padded_string file_;
  simdjson::dom::parser parser_;
  simdjson::dom::element vocab_, merges_;  // model.vocab and model.merges, when present
};

std::unique_ptr<HfTokenizer> HfTokenizer::Load(const std::string& path) {
  return HfLoader(path).Load();
}

}  // namespace llm::hf
