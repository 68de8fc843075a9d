#include "tests/engine/tokenizer/hf_synthetic.h"

#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/test_util.h"

namespace llm::test {

namespace {

constexpr int kNumRandomTexts = 120;
constexpr int kNumPieceTexts = 160;
constexpr int kNumRandomIdLists = 120;
constexpr int kMaxReported = 8;

std::vector<std::string> SplitChars(std::string_view text) {
  std::vector<std::string> chars;
  for (size_t pos = 0; pos < text.size();) {
    const auto lead = static_cast<unsigned char>(text[pos]);
    const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    chars.emplace_back(text.substr(pos, n));
    pos += n;
  }
  return chars;
}

}  // namespace

nlohmann::json SyntheticBpeTokenizer(const std::vector<std::string>& alphabet,
                                     const std::vector<std::string>& words, int num_merges,
                                     const SyntheticBpeOptions& options) {
  const std::string prefix = options.continuing_subword_prefix.value_or("");
  const std::string suffix = options.end_of_word_suffix.value_or("");
  std::vector<std::string> tokens;
  std::map<std::string, int> ids;
  auto add = [&](const std::string& token) {
    if (ids.emplace(token, static_cast<int>(tokens.size())).second) tokens.push_back(token);
  };
  if (options.unk_token) add(*options.unk_token);
  if (options.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      add(name);
    }
  }
  for (const std::string& c : alphabet) {
    add(c);
    if (!prefix.empty()) add(prefix + c);
    if (!suffix.empty()) add(c + suffix);
    if (!prefix.empty() && !suffix.empty()) add(prefix + c + suffix);
  }
  // Each word as its symbols: the first character bare, the others after the subword prefix,
  // the last one before the word suffix.
  std::vector<std::vector<std::string>> symbols;
  for (const std::string& word : words) {
    const std::vector<std::string> chars = SplitChars(word);
    std::vector<std::string> s;
    for (size_t i = 0; i < chars.size(); ++i) {
      s.push_back((i > 0 ? prefix : "") + chars[i] + (i + 1 == chars.size() ? suffix : ""));
      add(s.back());
    }
    symbols.push_back(std::move(s));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& s : symbols) {
      for (size_t i = 0; i + 1 < s.size(); ++i) ++counts[{s[i], s[i + 1]}];
    }
    if (counts.empty()) break;
    auto best = counts.begin();  // the most frequent pair, the smallest among equals
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [a, b] = best->first;
    const std::string merged = a + b.substr(prefix.size());
    add(merged);
    merges.emplace_back(a, b);
    for (auto& s : symbols) {
      std::vector<std::string> out;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
    }
  }
  // "a b" cannot hold a piece with a space: such a vocabulary writes pairs.
  bool as_pairs = options.merges_as_pairs;
  for (const auto& [a, b] : merges) {
    as_pairs = as_pairs || a.find(' ') != std::string::npos || b.find(' ') != std::string::npos;
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    merge_list.push_back(as_pairs ? nlohmann::json::array({a, b}) : nlohmann::json(a + " " + b));
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  auto optional = [](const std::optional<std::string>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model",
           {{"type", "BPE"},
            {"dropout", options.dropout},
            {"unk_token", optional(options.unk_token)},
            {"continuing_subword_prefix", optional(options.continuing_subword_prefix)},
            {"end_of_word_suffix", optional(options.end_of_word_suffix)},
            {"fuse_unk", options.fuse_unk},
            {"byte_fallback", options.byte_fallback},
            {"ignore_merges", options.ignore_merges},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

std::vector<std::string> ByteLevelAlphabet() {
  std::vector<std::string> chars(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unicode::AppendChar(printable ? b : 256 + n++, &chars[b]);
  }
  return chars;
}

std::string ByteLevelString(std::string_view text) {
  static const std::vector<std::string> alphabet = ByteLevelAlphabet();
  std::string out;
  for (char c : text) out += alphabet[static_cast<unsigned char>(c)];
  return out;
}

nlohmann::json AddedTokenJson(int id, const std::string& content, bool special, bool normalized,
                              bool lstrip, bool rstrip, bool single_word) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

// Words the merges are learned from and the texts are made of: ASCII, contractions, accents,
// case pairs, CJK, digits, punctuation inside words.
const std::vector<std::string>& SyntheticWords() {
  static const std::vector<std::string> words = {
      "hello", "world", "the",   "tokenizer", "lower",  "lowest", "newer", "wider",
      "don't", "café",  "naïve", "Straße",    "日本語", "東京",   "1234",  "2024",
      "e.g.",  "x_y",   "co-op", "HELLO",     "Hello",  "ΣΊΣΥΦΟΣ"};
  return words;
}

// One token per character: printable ASCII, space, newline, tab, the metaspace, and the
// non-ASCII characters of SyntheticWords() and a few more (the rest of Unicode is unknown).
std::vector<std::string> CharAlphabet() {
  std::vector<std::string> alphabet = {" ", "\n", "\t", "\xE2\x96\x81"};
  for (char c = '!'; c <= '~'; ++c) alphabet.emplace_back(1, c);
  for (const char* c : {"é", "ï", "ß", "ü", "日", "本", "語", "東", "京", "Σ", "Ί",
                        "Υ", "Φ", "Ο", "σ", "ί",  "υ",  "φ",  "ο",  "ς",  "😀", "ﬁ"}) {
    alphabet.emplace_back(c);
  }
  return alphabet;
}

std::vector<std::string> ModelWords(Surface surface) {
  std::vector<std::string> out;
  for (const std::string& w : SyntheticWords()) {
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
        out.push_back(ByteLevelString(" " + w));
        out.push_back(ByteLevelString(w));
        break;
    }
  }
  return out;
}

SyntheticBpeOptions BpeOptions(const std::string& flags) {
  SyntheticBpeOptions o;
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

json CharBpe(Surface surface, const std::string& options, int num_merges) {
  return SyntheticBpeTokenizer(CharAlphabet(), ModelWords(surface), num_merges,
                               BpeOptions(options));
}

json ByteBpe(int num_merges) {
  return SyntheticBpeTokenizer(ByteLevelAlphabet(), ModelWords(Surface::kByteLevel), num_merges);
}

void AddTokens(json* file, const std::vector<json>& tokens) {
  int next = static_cast<int>((*file)["model"]["vocab"].size());
  for (const json& t : (*file)["added_tokens"]) next = std::max(next, t["id"].get<int>() + 1);
  for (json t : tokens) {
    const std::string content = t["content"];
    const json& vocab = (*file)["model"]["vocab"];
    t["id"] = vocab.contains(content) ? vocab[content].get<int>() : -1;
    for (const json& earlier : (*file)["added_tokens"]) {  // the same content: the same id
      if (earlier["content"] == content) t["id"] = earlier["id"];
    }
    if (t["id"] == -1) t["id"] = next++;
    (*file)["added_tokens"].push_back(t);
  }
}

json SpecialToken(const std::string& content) { return AddedTokenJson(0, content, true); }

int IdOf(const json& file, const std::string& token) {
  for (const json& t : file["added_tokens"]) {
    if (t["content"] == token) return t["id"];
  }
  return file["model"]["vocab"][token];
}

void AddBosEos(json* file) { AddTokens(file, {SpecialToken("<s>"), SpecialToken("</s>")}); }

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

json Metaspace(const std::string& scheme, bool split, const std::string& replacement) {
  return {{"type", "Metaspace"},
          {"replacement", replacement},
          {"prepend_scheme", scheme},
          {"split", split}};
}

json MetaspaceDecoder(const std::string& scheme, const std::string& replacement) {
  return {{"type", "Metaspace"}, {"replacement", replacement}, {"prepend_scheme", scheme}};
}

json Seq(const char* key, std::vector<json> items) { return {{"type", "Sequence"}, {key, items}}; }

json ReplaceStep(const json& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", pattern}, {"content", content}};
}

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

std::vector<std::string> PiecesOf(std::vector<std::string> extra) {
  std::vector<std::string> pieces = SyntheticWords();
  pieces.insert(pieces.end(), extra.begin(), extra.end());
  return pieces;
}

namespace {

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

std::vector<std::string> Texts(std::mt19937& rng, const SyntheticCase& c) {
  std::vector<std::string> texts = {"",      " ",          "  ",      "\n",           "a",
                                    " a",    "a ",         "  hello", "hello  ",      "hello world",
                                    "1234",  "x\u0301",    "😀",       "\xE2\x96\x81", "<0x41>",
                                    "<unk>", "don't stop", "ﬁ①"};
  for (int i = 0; i < kNumRandomTexts; ++i) texts.push_back(RandomText(rng, c.pieces));
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

}  // namespace

LibraryComparison CompareWithLibrary(const std::vector<SyntheticCase>& cases,
                                     const std::filesystem::path& dir, uint32_t seed) {
  std::vector<FileRun> runs(cases.size());
  json request = {{"tokenizers", json::array()}};
  std::mt19937 rng(seed);
  for (size_t i = 0; i < cases.size(); ++i) {
    const SyntheticCase& c = cases[i];
    const std::filesystem::path folder = dir / c.name;
    std::filesystem::create_directories(folder);
    const std::string path = (folder / "tokenizer.json").string();
    WriteFile(path, c.file.dump(1));
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
  const json response = RunNodeOracle("hf_tokenizer_oracle.mjs", request);

  LibraryComparison result;
  for (size_t i = 0; i < cases.size(); ++i) {
    const SyntheticCase& c = cases[i];
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
    result.num_differences += mismatches;
    if (mismatches > 0) {
      result.details += "\n" + c.name + ": " + std::to_string(mismatches) + " differences";
      for (const std::string& d : details) result.details += "\n  " + d;
    }
    result.summary +=
        c.name + ": " +
        (lib.contains("error") ? "refused by the library, "
                               : std::to_string(run.texts.size()) + " texts, " +
                                     std::to_string(run.decodes.size()) + " id lists, ") +
        std::to_string(mismatches) + " differences\n";
  }
  return result;
}

}  // namespace llm::test
