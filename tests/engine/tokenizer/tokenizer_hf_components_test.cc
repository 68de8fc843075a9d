// Differential test of every tokenizer.json component the real tokenizers (tokenizer_hf_oracle_
// test.cc) leave out, against Hugging Face's tokenizers library itself (npm `tokenizers`, run
// by tests/tools/hf_tokenizer_oracle.mjs, one process per group of files): synthetic
// tokenizer.json files (tests/engine/tokenizer/hf_synthetic.h), each a small BPE vocabulary
// (characters or the byte-level alphabet, merges learned from a few words) around the component
// under test. For each file a few hundred texts (random ones and ones made of the file's own
// pieces) must give the library's ids with and without special tokens; decoding (our ids and
// random id lists) its text with and without skipping special tokens; and the streaming
// decoder the whole Decode. A file the library refuses, we must refuse. Skips, saying why, when
// npm could not install the packages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>

#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/engine/tokenizer/hf_synthetic.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using test::AddBosEos;
using test::AddedTokenJson;
using test::AddTokens;
using test::ByteBpe;
using test::ByteLevel;
using test::CharBpe;
using test::IdOf;
using test::kMeta;
using test::Llama2Decoder;
using test::Metaspace;
using test::MetaspaceDecoder;
using test::Pattern;
using test::PiecesOf;
using test::ReplaceStep;
using test::Seq;
using test::SpecialToken;
using test::SplitPre;
using test::StripDecoder;
using test::Surface;
using test::SyntheticCase;
using test::TemplateProcessor;
using json = nlohmann::json;

std::vector<SyntheticCase> PreTokenizerCases() {
  std::vector<SyntheticCase> cases;
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

std::vector<SyntheticCase> NormalizerCases() {
  std::vector<SyntheticCase> cases;
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

std::vector<SyntheticCase> ModelCases() {
  std::vector<SyntheticCase> cases;
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
  for (const bool ignore : {false, true}) {
    // Whole words in the vocabulary that no merge builds: ignore_merges takes them as one token.
    json f = CharBpe(Surface::kMetaspace, ignore ? "unk ignore" : "unk");
    for (const char* word : {"xyzzy", "\xE2\x96\x81xyzzy", "\xE2\x96\x81qq", "helloworld"}) {
      f["model"]["vocab"][word] = f["model"]["vocab"].size();
    }
    f["pre_tokenizer"] = meta;
    f["decoder"] = meta_decoder;
    cases.push_back({std::string("unmerged_words") + (ignore ? "_ignore_merges" : ""), f,
                     PiecesOf({"xyzzy", "qq", "helloworld"})});
  }
  {
    // Byte fallback without the continuation bytes' tokens: a character falls back to bytes
    // or, missing one, to <unk> (fused), in the order the library adds them.
    json f = CharBpe(Surface::kMetaspace, "unk bytes fuse");
    for (int b = 0x80; b < 0xC0; b += 3) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      f["model"]["vocab"].erase(name);
    }
    json vocab = json::object();  // ids without the holes
    std::vector<std::pair<int, std::string>> order;
    for (auto& [token, id] : f["model"]["vocab"].items()) order.emplace_back(id, token);
    std::sort(order.begin(), order.end());
    for (const auto& [id, token] : order) vocab[token] = vocab.size();
    f["model"]["vocab"] = vocab;
    f["pre_tokenizer"] = meta;
    f["decoder"] = Llama2Decoder();
    cases.push_back({"byte_fallback_partial", f, PiecesOf({"é", "ß", "日本", "😀"})});
  }
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

std::vector<SyntheticCase> PostProcessorCases() {
  std::vector<SyntheticCase> cases;
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

std::vector<SyntheticCase> DecoderCases() {
  std::vector<SyntheticCase> cases;
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

std::vector<SyntheticCase> AddedTokenCases() {
  std::vector<SyntheticCase> cases;
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
  const json lower = {{"type", "Lowercase"}};
  // AddedTokenJson(id, content, special, normalized, lstrip, rstrip, single_word); ids set later.
  with("special", nullptr,
       {SpecialToken("<s>"), SpecialToken("</s>"), SpecialToken("<|im_start|>")});
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
       {SpecialToken("<a>"), SpecialToken("<a><b>"), AddedTokenJson(0, "a>", false, true),
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
    AddTokens(&f, {SpecialToken("<d>")});
    f["added_tokens"].push_back(AddedTokenJson(f["added_tokens"][0]["id"], "<d>", false, true));
    cases.push_back({"duplicate_content", f, PiecesOf({"<d>"})});
    // An empty content is skipped (no id).
    f = CharBpe(Surface::kMetaspace);
    f["added_tokens"].push_back(AddedTokenJson(0, "", true));
    AddTokens(&f, {SpecialToken("<e>")});
    f["added_tokens"][1]["id"] = f["model"]["vocab"].size();
    cases.push_back({"empty_content", f, PiecesOf({"<e>"})});
  }
  return cases;
}

// Random pipelines: each file a random sequence of normalizers, of pre-tokenizers and of
// decoders, random added tokens and a random post-processor, over a random vocabulary. The
// decoder chains are the ones we support (no ByteLevel, ByteFallback or regex Replace after a
// joining step) and Strip never strips at the end (the library panics there).
std::vector<SyntheticCase> RandomPipelineCases() {
  std::mt19937 rng(20261201);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  auto coin = [&] { return rng() % 2 == 0; };
  const char* behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                             "Contiguous"};
  const char* schemes[] = {"always", "first", "never"};
  const std::vector<json> patterns = {Pattern("String", " "),
                                      Pattern("String", kMeta),
                                      Pattern("Regex", R"(\s+)"),
                                      Pattern("Regex", R"(\p{N}+)"),
                                      Pattern("Regex", R"('s|'t| ?\p{L}+)"),
                                      Pattern("Regex", "^.|.$")};
  auto normalizer = [&]() -> json {
    switch (pick(10)) {
      case 0:
        return {{"type", "NFC"}};
      case 1:
        return {{"type", "NFD"}};
      case 2:
        return {{"type", "NFKC"}};
      case 3:
        return {{"type", "NFKD"}};
      case 4:
        return {{"type", "Lowercase"}};
      case 5:
        return ReplaceStep(Pattern("String", " "), kMeta);
      case 6:
        return ReplaceStep(Pattern("Regex", R"(\s+|\d)"), " ");
      case 7:
        return {{"type", "Prepend"}, {"prepend", kMeta}};
      case 8:
        return {{"type", "Strip"}, {"strip_left", coin()}, {"strip_right", coin()}};
      default:
        return ReplaceStep(patterns[pick(patterns.size())], "<>");
    }
  };
  auto pre_tokenizer = [&]() -> json {
    switch (pick(7)) {
      case 0:
        return SplitPre(patterns[pick(patterns.size())], behaviors[pick(5)], coin());
      case 1:
        return Metaspace(schemes[pick(3)], coin());
      case 2:
        return {{"type", "Digits"}, {"individual_digits", coin()}};
      case 3:
        return {{"type", "Punctuation"}, {"behavior", behaviors[pick(5)]}};
      case 4:
        return {{"type", coin() ? "Whitespace" : "WhitespaceSplit"}};
      default:
        return ByteLevel(coin(), coin());
    }
  };
  std::vector<SyntheticCase> cases;
  for (int n = 0; n < 40; ++n) {
    const char* options[] = {"unk", "unk fuse", "bytes", "unk bytes fuse", "unk ignore", ""};
    json f = n % 5 == 4 ? ByteBpe()
                        : CharBpe(coin() ? Surface::kMetaspace : Surface::kPlain, options[pick(6)]);
    std::vector<json> added;
    const char* contents[] = {"<s>", "</s>", "[MASK]", "hello", "<|x|>", "ll", "Ab"};
    for (int k = pick(5); k > 0; --k) {
      added.push_back(AddedTokenJson(0, contents[pick(7)], coin(), coin(), coin(), coin(), coin()));
    }
    AddBosEos(&f);
    AddTokens(&f, added);
    if (coin()) {
      std::vector<json> steps;
      for (int k = 1 + pick(3); k > 0; --k) steps.push_back(normalizer());
      f["normalizer"] = steps.size() == 1 ? steps[0] : Seq("normalizers", steps);
    }
    if (pick(5) > 0) {
      std::vector<json> steps;
      for (int k = 1 + pick(3); k > 0; --k) steps.push_back(pre_tokenizer());
      f["pre_tokenizer"] = steps.size() == 1 ? steps[0] : Seq("pretokenizers", steps);
    }
    switch (pick(4)) {
      case 0:
        f["post_processor"] = TemplateProcessor({"<s>", "$A", "</s>"}, f);
        break;
      case 1:
        f["post_processor"] = ByteLevel(coin(), true);
        break;
      case 2:
        f["post_processor"] =
            Seq("processors", {ByteLevel(false, true), TemplateProcessor({"$A", "</s>", "$A"}, f)});
        break;
      default:
        break;
    }
    if (pick(5) > 0) {
      std::vector<json> steps;
      bool joined = false;
      for (int k = 1 + pick(4); k > 0; --k) {
        const int kind = pick(7);
        if (joined && (kind == 1 || kind == 5 || kind == 6)) continue;
        joined = joined || kind == 2 || kind == 6;
        steps.push_back(kind == 0   ? MetaspaceDecoder(schemes[pick(3)])
                        : kind == 1 ? json{{"type", "ByteFallback"}}
                        : kind == 2 ? json{{"type", "Fuse"}}
                        : kind == 3 ? StripDecoder(coin() ? " " : kMeta, pick(3), 0)
                        : kind == 4 ? ReplaceStep(Pattern("String", coin() ? kMeta : "l"), " ")
                        : kind == 5 ? ReplaceStep(Pattern("Regex", "[lo]+"), "_")
                                    : ByteLevel(false, true));
      }
      if (!steps.empty()) f["decoder"] = steps.size() == 1 ? steps[0] : Seq("decoders", steps);
    }
    std::vector<std::string> pieces = PiecesOf({"<s>", "</s>"});
    for (const json& t : added) pieces.push_back(t["content"]);
    cases.push_back({"random_" + std::to_string(n), f, pieces});
  }
  return cases;
}

std::vector<SyntheticCase> CasesOf(const std::string& group) {
  if (group == "RandomPipelines") return RandomPipelineCases();
  if (group == "PreTokenizers") return PreTokenizerCases();
  if (group == "Normalizers") return NormalizerCases();
  if (group == "Model") return ModelCases();
  if (group == "PostProcessors") return PostProcessorCases();
  if (group == "Decoders") return DecoderCases();
  return AddedTokenCases();
}

class HfComponents : public ::testing::TestWithParam<std::string> {};

TEST_P(HfComponents, SyntheticFilesMatchTheLibrary) {
  std::string why;
  if (test::HfNpmDir(&why).empty()) GTEST_SKIP() << why;
  test::TempDir dir;
  const test::LibraryComparison result = test::CompareWithLibrary(
      CasesOf(GetParam()), dir.path(), std::hash<std::string>{}(GetParam()) & 0xFFFF);
  std::cout << result.summary;
  EXPECT_EQ(result.num_differences, 0) << result.details;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, HfComponents,
                         ::testing::Values("PreTokenizers", "Normalizers", "Model",
                                           "PostProcessors", "Decoders", "AddedTokens",
                                           "RandomPipelines"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace llm
