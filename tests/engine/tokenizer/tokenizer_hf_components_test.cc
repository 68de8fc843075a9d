// Differential test of every tokenizer.json component the real tokenizers (tokenizer_hf_oracle_
// test.cc) leave out, against Hugging Face's tokenizers library itself (npm `tokenizers`, run
// by tests/tools/hf_tokenizer_oracle.mjs, one process per group of files): synthetic
// tokenizer.json files, each a small BPE vocabulary (characters or the byte-level alphabet,
// merges learned from a few words) around the component under test. For each file a few
// hundred texts (random ones and ones made of the file's own pieces) must give the library's
// ids with and without special tokens; decoding (our ids and random id lists) its text with and
// without skipping special tokens; and the streaming decoder the whole Decode. A file the
// library refuses, we must refuse. Skips, saying why, when npm could not install the packages.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using nlohmann::json;

constexpr int kNumRandomTexts = 120;
constexpr int kNumPieceTexts = 160;
constexpr int kNumRandomIdLists = 120;
constexpr int kMaxReported = 8;

// One synthetic tokenizer.json and the strings its texts are made of.
struct Case {
  std::string name;
  json file;
  std::vector<std::string> pieces;
};

// Words the merges are learned from and the texts are made of: ASCII, contractions, accents,
// case pairs, CJK, digits, punctuation inside words.
const std::vector<std::string>& Words() {
  static const std::vector<std::string> words = {
      "hello", "world", "the",   "tokenizer", "lower",  "lowest", "newer", "wider",
      "don't", "café",  "naïve", "Straße",    "日本語", "東京",   "1234",  "2024",
      "e.g.",  "x_y",   "co-op", "HELLO",     "Hello",  "ΣΊΣΥΦΟΣ"};
  return words;
}

// One token per character: printable ASCII, space, newline, tab, the metaspace, and the
// non-ASCII characters of Words() and a few more (the rest of Unicode is unknown).
std::vector<std::string> CharAlphabet() {
  std::vector<std::string> alphabet = {" ", "\n", "\t", "\xE2\x96\x81"};
  for (char c = '!'; c <= '~'; ++c) alphabet.emplace_back(1, c);
  for (const char* c : {"é", "ï", "ß", "ü", "日", "本", "語", "東", "京", "Σ", "Ί",
                        "Υ", "Φ", "Ο", "σ", "ί",  "υ",  "φ",  "ο",  "ς",  "😀", "ﬁ"}) {
    alphabet.emplace_back(c);
  }
  return alphabet;
}

const std::string kMeta = "\xE2\x96\x81";  // ▁

// The words as the model sees them after a pre-tokenizer: plain, after Metaspace (a leading
// ▁, spaces as ▁) or after ByteLevel (byte-level characters, "Ġ" for a space).
enum class Surface { kPlain, kMetaspace, kByteLevel };

std::vector<std::string> ModelWords(Surface surface) {
  std::vector<std::string> out;
  for (const std::string& w : Words()) {
    switch (surface) {
      case Surface::kPlain:
        out.push_back(w);
        out.push_back(" " + w);
        break;
      case Surface::kMetaspace:
        out.push_back(kMeta + w);
        out.push_back(w);
        break;
      case Surface::kByteLevel:
        out.push_back(test::ByteLevelString(" " + w));
        out.push_back(test::ByteLevelString(w));
        break;
    }
  }
  return out;
}

// Model options by name: "unk" (<unk>), "fuse", "bytes" (byte_fallback), "prefix" (##),
// "suffix" (</w>), "ignore" (ignore_merges), "pairs" (merges as pairs), "dropout0", "dropout2".
test::SyntheticBpeOptions Options(const std::string& flags) {
  test::SyntheticBpeOptions o;
  std::istringstream in(flags);
  for (std::string flag; in >> flag;) {
    if (flag == "unk") o.unk_token = "<unk>";
    if (flag == "fuse") o.fuse_unk = true;
    if (flag == "bytes") o.byte_fallback = true;
    if (flag == "prefix") o.continuing_subword_prefix = "##";
    if (flag == "suffix") o.end_of_word_suffix = "</w>";
    if (flag == "ignore") o.ignore_merges = true;
    if (flag == "pairs") o.merges_as_pairs = true;
    if (flag == "dropout0") o.dropout = 0.0;
    if (flag == "dropout2") o.dropout = 2.0;
  }
  return o;
}

json CharBpe(Surface surface, const std::string& options = "unk", int num_merges = 80) {
  return test::SyntheticBpeTokenizer(CharAlphabet(), ModelWords(surface), num_merges,
                                     Options(options));
}

json ByteBpe(int num_merges = 120) {
  return test::SyntheticBpeTokenizer(test::ByteLevelAlphabet(), ModelWords(Surface::kByteLevel),
                                     num_merges);
}

// Appends added tokens with the ids the library gives them (the model's id for a vocabulary
// token, else the next one after the vocabulary).
void AddTokens(json* file, const std::vector<json>& tokens) {
  int next = static_cast<int>((*file)["model"]["vocab"].size());
  for (const json& t : (*file)["added_tokens"]) next = std::max(next, t["id"].get<int>() + 1);
  for (json t : tokens) {
    const std::string content = t["content"];
    const json& vocab = (*file)["model"]["vocab"];
    t["id"] = vocab.contains(content) ? vocab[content].get<int>() : next++;
    (*file)["added_tokens"].push_back(t);
  }
}

json Special(const std::string& content) { return test::AddedTokenJson(0, content, true); }

int IdOf(const json& file, const std::string& token) {
  for (const json& t : file["added_tokens"]) {
    if (t["content"] == token) return t["id"];
  }
  return file["model"]["vocab"][token];
}

// <s> and </s> as special added tokens.
void AddBosEos(json* file) { AddTokens(file, {Special("<s>"), Special("</s>")}); }

json Pattern(const std::string& kind, const std::string& value) { return {{kind, value}}; }

json SplitPre(const json& pattern, const std::string& behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

json ByteLevel(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

json Metaspace(const std::string& scheme, bool split, const std::string& replacement = kMeta) {
  return {{"type", "Metaspace"},
          {"replacement", replacement},
          {"prepend_scheme", scheme},
          {"split", split}};
}

json MetaspaceDecoder(const std::string& scheme, const std::string& replacement = kMeta) {
  return {{"type", "Metaspace"}, {"replacement", replacement}, {"prepend_scheme", scheme}};
}

json Seq(const char* key, std::vector<json> items) { return {{"type", "Sequence"}, {key, items}}; }

json ReplaceStep(const json& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", pattern}, {"content", content}};
}

// Strip with stop > 0 is not compared: strip.rs panics on a token of fewer than `stop`
// characters, all of them `content` (and where start and stop overlap), which ends the oracle.
json StripDecoder(const std::string& content, int start, int stop) {
  return {{"type", "Strip"}, {"content", content}, {"start", start}, {"stop", stop}};
}

// Llama 2's decoder: ▁ -> space, byte tokens to bytes, one string, one leading space off.
json Llama2Decoder() {
  return Seq("decoders", {ReplaceStep(Pattern("String", kMeta), " "),
                          {{"type", "ByteFallback"}},
                          {{"type", "Fuse"}},
                          StripDecoder(" ", 1, 0)});
}

json TemplateProcessor(const std::vector<std::string>& single, const json& file) {
  json pieces = json::array(), specials = json::object();
  for (const std::string& p : single) {
    if (p == "$A") {
      pieces.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    } else {
      pieces.push_back({{"SpecialToken", {{"id", p}, {"type_id", 0}}}});
      specials[p] = {{"id", p}, {"ids", {IdOf(file, p)}}, {"tokens", {p}}};
    }
  }
  json pair = json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}});
  return {{"type", "TemplateProcessing"},
          {"single", pieces},
          {"pair", pair},
          {"special_tokens", specials}};
}

std::vector<std::string> PiecesOf(std::vector<std::string> extra = {}) {
  std::vector<std::string> pieces = Words();
  pieces.insert(pieces.end(), extra.begin(), extra.end());
  return pieces;
}

std::vector<Case> PreTokenizerCases() {
  std::vector<Case> cases;
  const char* behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                             "Contiguous"};
  for (const char* behavior : behaviors) {
    for (const bool invert : {false, true}) {
      const std::string suffix = std::string(behavior) + (invert ? "_inverted" : "");
      for (const auto& [kind, pattern] :
           std::vector<std::pair<std::string, std::string>>{{"String", " "},
                                                            {"String", "l"},
                                                            {"Regex", R"(\s+|[0-9]+|(?i:he))"},
                                                            {"Regex", "l*"}}) {
        json f = CharBpe(Surface::kPlain);
        f["pre_tokenizer"] = SplitPre(Pattern(kind, pattern), behavior, invert);
        const std::string name =
            std::string("split_") +
            (kind == "String" ? (pattern == " " ? "space" : "l")
                              : (pattern == "l*" ? "empty_matches" : "regex")) +
            "_";
        cases.push_back({name + suffix, f, PiecesOf()});
      }
    }
  }
  for (const bool add_prefix_space : {false, true}) {
    for (const bool use_regex : {false, true}) {
      json f = ByteBpe();
      f["pre_tokenizer"] = ByteLevel(add_prefix_space, use_regex);
      f["decoder"] = ByteLevel(add_prefix_space, use_regex);
      f["post_processor"] = ByteLevel(add_prefix_space, use_regex);
      cases.push_back({std::string("byte_level") + (add_prefix_space ? "_prefix" : "") +
                           (use_regex ? "_regex" : ""),
                       f, PiecesOf()});
    }
  }
  {
    json f = ByteBpe();
    f["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", 0}};
    cases.push_back({"byte_level_trim_offsets_not_bool", f, PiecesOf()});
    f["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
    cases.push_back({"byte_level_no_trim_offsets", f, PiecesOf()});
  }
  for (const char* scheme : {"always", "first", "never"}) {
    for (const bool split : {false, true}) {
      json f = CharBpe(Surface::kMetaspace);
      AddBosEos(&f);
      f["pre_tokenizer"] = Metaspace(scheme, split);
      f["decoder"] = MetaspaceDecoder(scheme);
      cases.push_back(
          {std::string("metaspace_") + scheme + (split ? "_split" : ""), f, PiecesOf({"<s>"})});
    }
    // "first" tells pieces at the start of the text from the others.
    json f = CharBpe(Surface::kMetaspace);
    f["pre_tokenizer"] = Seq("pretokenizers", {{{"type", "Punctuation"}, {"behavior", "Isolated"}},
                                               Metaspace(scheme, true)});
    f["decoder"] = MetaspaceDecoder(scheme);
    cases.push_back({std::string("punctuation_then_metaspace_") + scheme, f, PiecesOf()});
  }
  for (const bool add_prefix_space : {false, true}) {  // the legacy field, no prepend_scheme
    json f = CharBpe(Surface::kMetaspace);
    json m = {
        {"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", add_prefix_space}};
    f["pre_tokenizer"] = m;
    f["decoder"] = m;
    cases.push_back({std::string("metaspace_legacy_") + (add_prefix_space ? "prefix" : "no_prefix"),
                     f, PiecesOf()});
  }
  {
    json f = CharBpe(Surface::kPlain);
    f["pre_tokenizer"] = Metaspace("always", true, "_");
    f["decoder"] = MetaspaceDecoder("always", "_");
    cases.push_back({"metaspace_underscore", f, PiecesOf({"_", "__"})});
    f["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", kMeta},
                          {"add_prefix_space", false},
                          {"prepend_scheme", "first"}};
    cases.push_back({"metaspace_contradicting_add_prefix_space", f, PiecesOf()});
  }
  for (const bool individual : {false, true}) {
    json f = CharBpe(Surface::kPlain);
    f["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", individual}};
    cases.push_back({std::string("digits") + (individual ? "_individual" : ""), f, PiecesOf()});
  }
  for (const char* behavior : behaviors) {
    json f = CharBpe(Surface::kPlain);
    f["pre_tokenizer"] = {{"type", "Punctuation"}, {"behavior", behavior}};
    cases.push_back({std::string("punctuation_") + behavior, f, PiecesOf()});
  }
  for (const char* pattern : {"String", "Regex"}) {  // an empty pattern matches everywhere
    json f = CharBpe(Surface::kPlain);
    f["pre_tokenizer"] = SplitPre(Pattern(pattern, ""), "Isolated", false);
    cases.push_back({std::string("split_empty_") + pattern, f, PiecesOf()});
  }
  {
    json f = CharBpe(Surface::kPlain);
    f["pre_tokenizer"] = {{"type", "Punctuation"}};
    cases.push_back({"punctuation_default", f, PiecesOf()});
    f["pre_tokenizer"] = {{"type", "Whitespace"}};
    cases.push_back({"whitespace", f, PiecesOf()});
    f["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
    cases.push_back({"whitespace_split", f, PiecesOf()});
    f["pre_tokenizer"] = Seq("pretokenizers", {{{"type", "WhitespaceSplit"}},
                                               {{"type", "Punctuation"}, {"behavior", "Removed"}},
                                               {{"type", "Digits"}, {"individual_digits", true}}});
    cases.push_back({"sequence_whitespace_punctuation_digits", f, PiecesOf()});
    f["pre_tokenizer"] = Seq("pretokenizers", {{{"type", "Whitespace"}}, Metaspace("first", true)});
    f["decoder"] = MetaspaceDecoder("first");
    cases.push_back({"sequence_whitespace_metaspace", f, PiecesOf()});
  }
  {
    // Metaspace "first" after steps that give several characters the origin 0 (a prepended
    // prefix, a decomposed or lowercased first character, a byte-level prefix space): a piece
    // split off there still counts as first.
    const json marks = SplitPre(Pattern("Regex", R"(\p{M}|\x{2581})"), "Isolated", false);
    auto origins_case = [&](const std::string& name, const json& normalizer, const json& pre) {
      json f = CharBpe(Surface::kMetaspace);
      AddBosEos(&f);
      f["normalizer"] = normalizer;
      f["pre_tokenizer"] = Seq("pretokenizers", {pre, Metaspace("first", true)});
      f["decoder"] = MetaspaceDecoder("first");
      cases.push_back({name, f, PiecesOf({"<s>", "é", "e\u0301", "İ", "ǅ", " "})});
    };
    origins_case("first_after_prepend", {{"type", "Prepend"}, {"prepend", kMeta}}, marks);
    origins_case("first_after_nfd", {{"type", "NFD"}}, marks);
    origins_case("first_after_nfkc", {{"type", "NFKC"}}, marks);
    origins_case("first_after_lowercase", {{"type", "Lowercase"}}, marks);
    origins_case("first_after_byte_level", nullptr, ByteLevel(true, true));
    origins_case("first_after_metaspace", nullptr, Metaspace("always", false));
  }
  {
    json f = ByteBpe();
    f["pre_tokenizer"] = Seq(
        "pretokenizers",
        {SplitPre(Pattern("Regex", R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S))"),
                  "Isolated", false),
         {{"type", "Digits"}, {"individual_digits", true}},
         ByteLevel(false, false)});
    f["decoder"] = ByteLevel(false, false);
    cases.push_back({"sequence_split_digits_byte_level", f, PiecesOf()});
  }
  return cases;
}

std::vector<Case> NormalizerCases() {
  std::vector<Case> cases;
  // Each with Metaspace "always" and "first" after it ("first" asks whether a piece still
  // starts at the text's original offset 0 after normalization), or alone.
  auto with = [&](const std::string& name, const json& normalizer, bool metaspace = true) {
    for (const char* scheme : {"always", "first"}) {
      json f = CharBpe(metaspace ? Surface::kMetaspace : Surface::kPlain);
      AddBosEos(&f);
      f["normalizer"] = normalizer;
      if (metaspace) {
        f["pre_tokenizer"] = Metaspace(scheme, true);
        f["decoder"] = MetaspaceDecoder(scheme);
      }
      cases.push_back({name + (metaspace ? std::string("_") + scheme : ""), f,
                       PiecesOf({"ﬁ", "Å", "Å", "ﬀ", "①", "ǅ", "<s>", "he", "hhe"})});
      if (!metaspace) break;
    }
  };
  for (const char* form : {"NFC", "NFD", "NFKC", "NFKD"}) with(form, {{"type", form}});
  with("lowercase", {{"type", "Lowercase"}});
  with("replace_string", ReplaceStep(Pattern("String", "  "), " "));
  with("replace_string_to_empty", ReplaceStep(Pattern("String", "l"), ""));
  with("replace_regex", ReplaceStep(Pattern("Regex", R"(\s+)"), " "));
  with("replace_regex_classes", ReplaceStep(Pattern("Regex", R"([\p{P}\d]+)"), "#"));
  with("replace_regex_empty_matches", ReplaceStep(Pattern("Regex", "x*"), "-"));
  with("replace_regex_empty", ReplaceStep(Pattern("Regex", ""), "-"));
  with("replace_string_empty", ReplaceStep(Pattern("String", ""), "-"));
  with("replace_leading_pair", ReplaceStep(Pattern("String", "he"), "X"));
  with("replace_leading_to_empty", ReplaceStep(Pattern("Regex", "^h+"), ""));
  with("replace_leading_grow", ReplaceStep(Pattern("Regex", "^."), "<>"));
  with("replace_line_ends", ReplaceStep(Pattern("Regex", ".$"), "<>"));
  with("replace_text_anchors", ReplaceStep(Pattern("Regex", R"(\A.|.\z|.\Z)"), "<>"));
  with("replace_then_strip",
       Seq("normalizers", {ReplaceStep(Pattern("String", "h"), " "),
                           {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}}));
  with("prepend", {{"type", "Prepend"}, {"prepend", kMeta}}, false);
  with("strip_left", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}});
  with("strip_right", {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}});
  with("strip_both", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}});
  with("strip_none", {{"type", "Strip"}, {"strip_left", false}, {"strip_right", false}});
  with("strip_missing_right", {{"type", "Strip"}, {"strip_left", true}});
  // Llama 2's normalizer (no pre-tokenizer): ▁ before the text, spaces as ▁.
  with("sequence_prepend_replace",
       Seq("normalizers",
           {{{"type", "Prepend"}, {"prepend", kMeta}}, ReplaceStep(Pattern("String", " "), kMeta)}),
       false);
  with("sequence_nfkd_lowercase_strip",
       Seq("normalizers", {{{"type", "NFKD"}},
                           {{"type", "Lowercase"}},
                           {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}}));
  with("sequence_empty", Seq("normalizers", {}));
  return cases;
}

std::vector<Case> ModelCases() {
  std::vector<Case> cases;
  auto with = [&](const std::string& name, const std::string& options, const json& pre_tokenizer,
                  const json& decoder = nullptr) {
    json f = CharBpe(Surface::kMetaspace, options);
    f["pre_tokenizer"] = pre_tokenizer;
    f["decoder"] = decoder;
    cases.push_back({name, f, PiecesOf()});
  };
  const json meta = Metaspace("always", true);
  const json meta_decoder = MetaspaceDecoder("always");
  with("merges_strings", "unk", meta, meta_decoder);
  with("merges_pairs", "unk pairs", meta, meta_decoder);
  with("ignore_merges", "unk ignore", meta, meta_decoder);
  with("no_unk_token", "", meta, meta_decoder);
  with("fuse_unk", "unk fuse", meta, meta_decoder);
  with("byte_fallback", "bytes", meta, Llama2Decoder());
  with("byte_fallback_unk", "unk bytes fuse", meta, Llama2Decoder());
  with("dropout_zero", "unk dropout0", meta, meta_decoder);
  with("dropout_two", "unk dropout2", meta, meta_decoder);
  const json ws = {{"type", "WhitespaceSplit"}};
  with("continuing_subword_prefix", "unk prefix", ws);
  with("end_of_word_suffix", "unk suffix", ws);
  with("prefix_and_suffix", "unk prefix suffix", ws);
  with("prefix_byte_fallback", "prefix bytes fuse", ws, Llama2Decoder());
  {
    // No pre-tokenizer: whole texts, spaces included, are one word.
    json f = CharBpe(Surface::kPlain, "unk fuse");
    cases.push_back({"no_pre_tokenizer", f, PiecesOf()});
    // Ids in another order than the tokens, with gaps.
    json vocab = json::object();
    for (auto& [token, id] : f["model"]["vocab"].items()) vocab[token] = id.get<int>() * 3 + 7;
    f["model"]["vocab"] = vocab;
    f["model"]["unk_token"] = "<unk>";
    cases.push_back({"sparse_ids", f, PiecesOf()});
  }
  return cases;
}

std::vector<Case> PostProcessorCases() {
  std::vector<Case> cases;
  auto base = [] {
    json f = CharBpe(Surface::kMetaspace);
    AddBosEos(&f);
    f["pre_tokenizer"] = Metaspace("first", true);
    f["decoder"] = MetaspaceDecoder("first");
    return f;
  };
  auto with = [&](const std::string& name, std::function<json(const json&)> processor) {
    json f = base();
    f["post_processor"] = processor(f);
    cases.push_back({name, f, PiecesOf({"<s>", "</s>"})});
  };
  with("template_before", [](const json& f) { return TemplateProcessor({"<s>", "$A"}, f); });
  with("template_after", [](const json& f) { return TemplateProcessor({"$A", "</s>"}, f); });
  with("template_both", [](const json& f) {
    return TemplateProcessor({"<s>", "<s>", "$A", "</s>"}, f);
  });
  with("template_sequence_twice", [](const json& f) {
    return TemplateProcessor({"<s>", "$A", "</s>", "$A"}, f);
  });
  with("template_no_sequence", [](const json& f) { return TemplateProcessor({"<s>"}, f); });
  with("template_multi_id_special", [](const json& f) {
    json t = TemplateProcessor({"<s>", "$A"}, f);
    t["special_tokens"]["<s>"]["ids"] = {IdOf(f, "<s>"), IdOf(f, "</s>"), 5};
    t["special_tokens"]["<s>"]["tokens"] = {"<s>", "</s>", "x"};
    return t;
  });
  with("byte_level", [](const json&) { return ByteLevel(true, true); });
  with("roberta", [](const json& f) {
    return json{{"type", "RobertaProcessing"},
                {"sep", {"</s>", IdOf(f, "</s>")}},
                {"cls", {"<s>", IdOf(f, "<s>")}},
                {"trim_offsets", true},
                {"add_prefix_space", true}};
  });
  with("bert", [](const json& f) {
    return json{{"type", "BertProcessing"},
                {"sep", {"</s>", IdOf(f, "</s>")}},
                {"cls", {"<s>", IdOf(f, "<s>")}}};
  });
  with("sequence_byte_level_template", [](const json& f) {
    return Seq("processors", {ByteLevel(false, true), TemplateProcessor({"<s>", "$A", "</s>"}, f)});
  });
  with("sequence_bert_in_template", [](const json& f) {
    return Seq("processors", {{{"type", "BertProcessing"},
                               {"sep", {"</s>", IdOf(f, "</s>")}},
                               {"cls", {"<s>", IdOf(f, "<s>")}}},
                              TemplateProcessor({"</s>", "$A", "<s>"}, f)});
  });
  with("sequence_empty", [](const json&) { return Seq("processors", {}); });
  return cases;
}

std::vector<Case> DecoderCases() {
  std::vector<Case> cases;
  auto with = [&](const std::string& name, const json& decoder, bool byte_fallback = true) {
    json f = CharBpe(Surface::kMetaspace, byte_fallback ? "unk bytes" : "unk");
    AddBosEos(&f);
    f["pre_tokenizer"] = Metaspace("always", true);
    f["decoder"] = decoder;
    cases.push_back({name, f, PiecesOf({"<s>", "</s>"})});
  };
  with("none", nullptr);
  with("metaspace_always", MetaspaceDecoder("always"));
  with("metaspace_never", MetaspaceDecoder("never"));
  with("byte_fallback", {{"type", "ByteFallback"}});
  with("fuse", {{"type", "Fuse"}});
  with("strip_space_1_0", StripDecoder(" ", 1, 0));
  with("strip_meta_2_0", StripDecoder(kMeta, 2, 0));
  with("strip_l_3_0", StripDecoder("l", 3, 0));
  with("replace_string", ReplaceStep(Pattern("String", kMeta), " "));
  with("replace_string_multi", ReplaceStep(Pattern("String", "ll"), "L"));
  with("replace_regex", ReplaceStep(Pattern("Regex", "[lo]+"), "_"));
  with("replace_regex_empty_matches", ReplaceStep(Pattern("Regex", "l*"), "_"));
  with("replace_string_empty", ReplaceStep(Pattern("String", ""), "_"));
  with("llama2", Llama2Decoder());
  with("llama2_without_byte_fallback_tokens", Llama2Decoder(), false);
  with("sequence_byte_fallback_metaspace",
       Seq("decoders", {{{"type", "ByteFallback"}}, MetaspaceDecoder("first")}));
  with("sequence_metaspace_fuse_strip",
       Seq("decoders", {MetaspaceDecoder("always"), {{"type", "Fuse"}}, StripDecoder(" ", 2, 0)}));
  with(
      "sequence_fuse_strip",
      Seq("decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}, StripDecoder(kMeta, 3, 0)}));
  with("sequence_fuse_replace_multi",
       Seq("decoders",
           {{{"type", "Fuse"}}, ReplaceStep(Pattern("String", "l" + kMeta + "l"), "<L>")}));
  with("sequence_fuse_metaspace",
       Seq("decoders", {{{"type", "Fuse"}}, MetaspaceDecoder("always")}));
  with("sequence_replace_regex_fuse",
       Seq("decoders", {ReplaceStep(Pattern("Regex", "\\p{Lu}"), "^"), {{"type", "Fuse"}}}));
  with("sequence_empty", Seq("decoders", {}));
  {
    json f = ByteBpe();
    f["pre_tokenizer"] = ByteLevel(false, true);
    AddBosEos(&f);
    f["decoder"] = Seq("decoders", {ByteLevel(false, true), StripDecoder(" ", 2, 0),
                                    ReplaceStep(Pattern("String", "lo"), "0")});
    cases.push_back({"sequence_byte_level_strip_replace", f, PiecesOf({"<s>"})});
    f["decoder"] = Seq("decoders", {ReplaceStep(Pattern("String", "Ġ"), "_"), ByteLevel(true, true),
                                    MetaspaceDecoder("always", "_")});
    cases.push_back({"sequence_replace_byte_level_metaspace", f, PiecesOf({"<s>"})});
  }
  return cases;
}

std::vector<Case> AddedTokenCases() {
  std::vector<Case> cases;
  auto with = [&](const std::string& name, const json& normalizer,
                  const std::vector<json>& tokens) {
    json f = CharBpe(Surface::kMetaspace);
    f["normalizer"] = normalizer;
    f["pre_tokenizer"] = Metaspace("first", true);
    f["decoder"] = MetaspaceDecoder("first");
    AddTokens(&f, tokens);
    std::vector<std::string> pieces = PiecesOf();
    for (const json& t : tokens) {
      const std::string c = t["content"];
      pieces.insert(pieces.end(), {c, " " + c, c + " ", "  " + c + "  "});
    }
    cases.push_back({name, f, pieces});
  };
  using test::AddedTokenJson;
  const json lower = {{"type", "Lowercase"}};
  // AddedTokenJson(id, content, special, normalized, lstrip, rstrip, single_word); ids set later.
  with("special", nullptr, {Special("<s>"), Special("</s>"), Special("<|im_start|>")});
  with("special_lstrip_rstrip", nullptr,
       {AddedTokenJson(0, "[MASK]", true, false, true, true),
        AddedTokenJson(0, "<L>", true, false, true),
        AddedTokenJson(0, "<R>", true, false, false, true)});
  with("single_word", nullptr,
       {AddedTokenJson(0, "tok", false, false, false, false, true),
        AddedTokenJson(0, "<sw>", true, false, false, false, true),
        AddedTokenJson(0, "wor", false, true, true, false, true)});
  with("normalized_lowercase", lower,
       {AddedTokenJson(0, "Hello", false, true), AddedTokenJson(0, "WORLD", false, false),
        AddedTokenJson(0, "<X>", true, true), AddedTokenJson(0, "<Y>", true, false)});
  with("in_vocabulary", nullptr,
       {AddedTokenJson(0, "the", false, false), AddedTokenJson(0, "l", true, false),
        AddedTokenJson(0, kMeta + "world", false, true)});
  with("overlapping", nullptr,
       {Special("<a>"), Special("<a><b>"), AddedTokenJson(0, "a>", false, true),
        AddedTokenJson(0, "hell", false, true), AddedTokenJson(0, "hello world", false, false)});
  with(
      "normalized_strip", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
      {AddedTokenJson(0, " pad ", false, true), AddedTokenJson(0, "<t>", true, false, true, true)});
  with("normalized_nfkc", {{"type", "NFKC"}},
       {AddedTokenJson(0, "ﬁne", false, true), AddedTokenJson(0, "①", true, true),
        AddedTokenJson(0, "①②", false, false)});
  {
    // The same content twice: the second entry's flags win, its id is the first's.
    json f = CharBpe(Surface::kMetaspace);
    f["pre_tokenizer"] = Metaspace("always", true);
    f["decoder"] = MetaspaceDecoder("always");
    AddTokens(&f, {Special("<d>")});
    f["added_tokens"].push_back(AddedTokenJson(f["added_tokens"][0]["id"], "<d>", false, true));
    cases.push_back({"duplicate_content", f, PiecesOf({"<d>"})});
    // An empty content is skipped (no id).
    f = CharBpe(Surface::kMetaspace);
    f["added_tokens"].push_back(AddedTokenJson(0, "", true));
    AddTokens(&f, {Special("<e>")});
    f["added_tokens"][1]["id"] = f["model"]["vocab"].size();
    cases.push_back({"empty_content", f, PiecesOf({"<e>"})});
  }
  return cases;
}

std::string Escape(std::string_view text) {
  std::ostringstream out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out << c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out << "\\x" << kHex[c >> 4] << kHex[c & 15];
    }
  }
  return out.str();
}

std::string Join(const std::vector<int>& ids) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  out << "]";
  return out.str();
}

std::string StreamDecode(const Tokenizer& tokenizer, const std::vector<int>& ids, bool skip) {
  IncrementalDecoder decoder(tokenizer, {}, skip);
  std::string text;
  for (int id : ids) text += decoder.Push(id);
  return text + decoder.Flush();
}

// A text of the file's pieces, with spaces, digits, punctuation and case changes between.
std::string PieceText(std::mt19937& rng, const std::vector<std::string>& pieces) {
  static const std::vector<std::string> kGlue = {" ",  " ", "  ", "\n",  "\t", "",      "",  ".",
                                                 ",",  "!", "?",  "'",   "-",  "(",     ")", "0",
                                                 "42", "7", "_",  kMeta, "é",  "\u3000"};
  std::string text;
  const int n = std::uniform_int_distribution<int>(1, 10)(rng);
  for (int i = 0; i < n; ++i) {
    if (rng() % 3 == 0) {
      text += kGlue[rng() % kGlue.size()];
    } else {
      std::string piece = pieces[rng() % pieces.size()];
      if (rng() % 6 == 0 && !piece.empty() && piece[0] >= 'a' && piece[0] <= 'z') piece[0] -= 32;
      text += piece;
    }
  }
  return text;
}

std::vector<std::string> Texts(std::mt19937& rng, const Case& c) {
  std::vector<std::string> texts = {"",      " ",          "  ",      "\n",           "a",
                                    " a",    "a ",         "  hello", "hello  ",      "hello world",
                                    "1234",  "x\u0301",    "😀",       "\xE2\x96\x81", "<0x41>",
                                    "<unk>", "don't stop", "ﬁ①"};
  for (int i = 0; i < kNumRandomTexts; ++i) texts.push_back(test::RandomText(rng, c.pieces));
  for (int i = 0; i < kNumPieceTexts; ++i) texts.push_back(PieceText(rng, c.pieces));
  return texts;
}

// What one file is checked with and what we make of it.
struct FileRun {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string load_error;
  std::vector<std::string> texts;
  std::vector<std::vector<int>> ids, ids_special, decodes;
};

class HfComponents : public ::testing::TestWithParam<std::string> {};

std::vector<Case> CasesOf(const std::string& group) {
  if (group == "PreTokenizers") return PreTokenizerCases();
  if (group == "Normalizers") return NormalizerCases();
  if (group == "Model") return ModelCases();
  if (group == "PostProcessors") return PostProcessorCases();
  if (group == "Decoders") return DecoderCases();
  return AddedTokenCases();
}

TEST_P(HfComponents, SyntheticFilesMatchTheLibrary) {
  std::string why;
  if (test::HfNpmDir(&why).empty()) GTEST_SKIP() << why;
  test::TempDir dir;
  const std::vector<Case> cases = CasesOf(GetParam());
  std::vector<FileRun> runs(cases.size());
  json request = {{"tokenizers", json::array()}};
  std::mt19937 rng(std::hash<std::string>{}(GetParam()) & 0xFFFF);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::filesystem::path folder = dir.path() / c.name;
    std::filesystem::create_directories(folder);
    const std::string path = (folder / "tokenizer.json").string();
    test::WriteFile(path, c.file.dump(1));
    FileRun& run = runs[i];
    run.texts = Texts(rng, c);
    try {
      run.tokenizer = Tokenizer::FromFile(path);
    } catch (const Error& e) {
      run.load_error = e.what();
    }
    if (run.tokenizer) {
      const Tokenizer& t = *run.tokenizer;
      for (const std::string& text : run.texts) {
        run.ids.push_back(t.Encode(text));
        run.ids_special.push_back(t.EncodePrompt(text));
      }
      run.decodes = run.ids_special;
      std::vector<int> specials, bytes;
      for (int id = 0; id < t.vocab_size(); ++id) {
        if (t.IsControl(id)) specials.push_back(id);
        if (t.IsByte(id)) bytes.push_back(id);
      }
      for (int k = 0; k < kNumRandomIdLists; ++k) {
        std::vector<int> ids(1 + rng() % 12);
        for (int& id : ids) {
          const int kind = rng() % 4;
          id = kind == 0 && !specials.empty() ? specials[rng() % specials.size()]
               : kind == 1 && !bytes.empty()  ? bytes[rng() % bytes.size()]
                                              : static_cast<int>(rng() % (t.vocab_size() + 3));
        }
        run.decodes.push_back(ids);
      }
    }
    request["tokenizers"].push_back(
        {{"tokenizer", path},
         {"texts", run.tokenizer ? run.texts : std::vector<std::string>{}},
         {"decode", run.decodes}});
  }
  const json response = test::RunNodeOracle("hf_tokenizer_oracle.mjs", request);

  int total = 0;
  std::string all;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const FileRun& run = runs[i];
    const json& lib = response["results"][i];
    int mismatches = 0;
    std::vector<std::string> details;
    auto report = [&](const std::string& what) {
      if (++mismatches <= kMaxReported) details.push_back(what);
    };
    if (lib.contains("error")) {
      if (run.tokenizer)
        report("the library refuses the file (" + lib["error"].get<std::string>() +
               ") but we load it");
    } else if (!run.tokenizer) {
      report("we refuse the file (" + run.load_error + ") but the library loads it");
    } else {
      if (lib.contains("errors")) report("the library failed: " + lib["errors"].dump());
      for (size_t k = 0; k < run.texts.size(); ++k) {
        const json& want = lib["ids"][k];
        const json& want_special = lib["ids_special"][k];
        if (want.is_null() || run.ids[k] != want.get<std::vector<int>>()) {
          report("encode \"" + Escape(run.texts[k]) + "\": ours " + Join(run.ids[k]) + " library " +
                 want.dump());
        }
        if (want_special.is_null() || run.ids_special[k] != want_special.get<std::vector<int>>()) {
          report("encode with specials \"" + Escape(run.texts[k]) + "\": ours " +
                 Join(run.ids_special[k]) + " library " + want_special.dump());
        }
      }
      for (size_t k = 0; k < run.decodes.size(); ++k) {
        for (const bool skip : {false, true}) {
          const json& want = lib[skip ? "text_skip" : "text"][k];
          const std::string whole = run.tokenizer->Decode(run.decodes[k], skip);
          const std::string streamed = StreamDecode(*run.tokenizer, run.decodes[k], skip);
          const std::string mode = skip ? " (skipping specials)" : "";
          if (want.is_null() || whole != want.get<std::string>()) {
            report("decode" + mode + " " + Join(run.decodes[k]) + ": ours \"" + Escape(whole) +
                   "\" library " +
                   (want.is_null() ? "null" : "\"" + Escape(want.get<std::string>()) + "\""));
          }
          if (streamed != whole) {
            report("streamed decode" + mode + " " + Join(run.decodes[k]) + ": \"" +
                   Escape(streamed) + "\" but whole \"" + Escape(whole) + "\"");
          }
        }
      }
    }
    total += mismatches;
    if (mismatches > 0) {
      all += "\n" + c.name + ": " + std::to_string(mismatches) + " differences";
      for (const std::string& d : details) all += "\n  " + d;
    }
    std::cout << GetParam() << "/" << c.name << ": "
              << (lib.contains("error") ? "refused by the library, "
                                        : std::to_string(run.texts.size()) + " texts, " +
                                              std::to_string(run.decodes.size()) + " id lists, ")
              << mismatches << " differences\n";
  }
  EXPECT_EQ(total, 0) << all;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, HfComponents,
                         ::testing::Values("PreTokenizers", "Normalizers", "Model",
                                           "PostProcessors", "Decoders", "AddedTokens"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace llm
