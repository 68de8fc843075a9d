// Loading tokenizer.json: a malformed file is a start-up llm::Error whose message names the
// file and the field at fault, and the library (npm `tokenizers`, one process for all files)
// refuses the same files, except the few we refuse on purpose (an unk_token outside the
// vocabulary, an added token whose id disagrees, a template naming an undefined special token
// or an id outside the vocabulary: the library loads those and fails or panics later; ids
// leaving more than 2^20 unused: our id tables are dense). Also: Tokenizer::Load prefers
// tokenizer.json to tokenizer.model in one folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/engine/tokenizer/hf_synthetic.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using nlohmann::json;

// A valid file: characters a-e and the merges ab, abc, de; <unk>, <s> and </s>.
json BaseFile() {
  test::SyntheticBpeOptions options;
  options.unk_token = "<unk>";
  json f = test::SyntheticBpeTokenizer({"a", "b", "c", "d", "e"}, {"abc", "abc", "de"}, 3, options);
  const int size = static_cast<int>(f["model"]["vocab"].size());
  f["added_tokens"] = {test::AddedTokenJson(size, "<s>", true),
                       test::AddedTokenJson(size + 1, "</s>", true)};
  return f;
}

json Template(const std::string& special, int id) {
  return {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", special}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {id}}, {"tokens", {"<s>"}}}}}}};
}

struct Malformed {
  std::string name;
  std::string text;                // the file's bytes
  std::vector<std::string> parts;  // what the message must name, besides the path
  bool library_refuses = true;     // false: we refuse what the library loads (see above)
};

// `edit` applied to BaseFile().
Malformed Edited(const std::string& name, const std::function<void(json&)>& edit,
                 std::vector<std::string> parts, bool library_refuses = true) {
  json f = BaseFile();
  edit(f);
  return {name, f.dump(1), std::move(parts), library_refuses};
}

std::vector<Malformed> MalformedFiles() {
  const json ok = BaseFile();
  std::string truncated = ok.dump();
  truncated.resize(truncated.size() / 2);
  return {
      {"bad_json", truncated, {"JSON"}},
      {"not_an_object", "[1, 2, 3]", {"not a JSON object"}},
      {"empty", "", {"JSON"}},
      Edited("no_model", [](json& f) { f.erase("model"); }, {"model", "missing"}),
      Edited("unknown_model", [](json& f) { f["model"]["type"] = "Unigram"; },
             {"model.type", "Unigram"}),
      Edited("unknown_normalizer",
             [](json& f) {
               f["normalizer"] = {{"type", "Nope"}};
             },
             {"normalizer.type", "Nope"}),
      Edited("unknown_nested_normalizer",
             [](json& f) {
               f["normalizer"] = {{"type", "Sequence"},
                                  {"normalizers", {{{"type", "NFC"}}, {{"type", "Nope"}}}}};
             },
             {"normalizer.normalizers[1].type", "Nope"}),
      Edited("unknown_pre_tokenizer",
             [](json& f) {
               f["pre_tokenizer"] = {{"type", "Nope"}};
             },
             {"pre_tokenizer.type", "Nope"}),
      Edited("unknown_decoder",
             [](json& f) {
               f["decoder"] = {{"type", "Nope"}};
             },
             {"decoder.type", "Nope"}),
      Edited("unknown_post_processor",
             [](json& f) {
               f["post_processor"] = {{"type", "Nope"}};
             },
             {"post_processor.type", "Nope"}),
      Edited("merge_missing_piece", [](json& f) { f["model"]["merges"][0] = "a x"; },
             {"model.merges[0]", "\"x\" is not in the vocabulary"}),
      Edited("merge_result_missing", [](json& f) { f["model"]["merges"].push_back("b c"); },
             {"model.merges[3]", "\"bc\" is not in the vocabulary"}),
      Edited("merge_three_pieces", [](json& f) { f["model"]["merges"][1] = "a b c"; },
             {"model.merges[1]", "two tokens"}),
      Edited("merge_one_piece", [](json& f) { f["model"]["merges"][1] = "ab"; },
             {"model.merges[1]", "two tokens"}),
      Edited("merge_pair_of_three",
             [](json& f) {
               f["model"]["merges"] = {{"a", "b", "c"}};
             },
             {"model.merges[0]"}),
      Edited("merges_mixed",
             [](json& f) {
               f["model"]["merges"] = {"a b", json::array({"ab", "c"})};
             },
             {"model.merges[1]", "all"}),
      Edited("vocab_id_negative", [](json& f) { f["model"]["vocab"]["a"] = -1; },
             {"model.vocab[\"a\"]", "integer"}),
      Edited("vocab_id_too_large", [](json& f) { f["model"]["vocab"]["a"] = 4294967296; },
             {"model.vocab[\"a\"]", "integer"}),
      Edited(
          "vocab_id_far_beyond_the_tokens", [](json& f) { f["model"]["vocab"]["<unk>"] = 1 << 29; },
          {"model.vocab", "536870912", "unused"}, /*library_refuses=*/false),
      Edited("vocab_id_not_integer", [](json& f) { f["model"]["vocab"]["a"] = 1.5; },
             {"model.vocab[\"a\"]", "integer"}),
      Edited("vocab_id_string", [](json& f) { f["model"]["vocab"]["a"] = "1"; },
             {"model.vocab[\"a\"]", "integer"}),
      Edited("no_vocab", [](json& f) { f["model"].erase("vocab"); }, {"model.vocab"}),
      Edited("no_merges", [](json& f) { f["model"].erase("merges"); }, {"model.merges"}),
      Edited("dropout_out_of_range", [](json& f) { f["model"]["dropout"] = 1.5; },
             {"model.dropout"}),
      Edited(
          "unk_token_missing", [](json& f) { f["model"]["unk_token"] = "<nope>"; },
          {"model.unk_token", "<nope>"}, /*library_refuses=*/false),
      Edited(
          "template_id_outside_vocabulary",
          [](json& f) { f["post_processor"] = Template("<s>", 9999); },
          {"post_processor.special_tokens[\"<s>\"].ids", "9999", "outside the vocabulary"},
          /*library_refuses=*/false),
      Edited(
          "template_unknown_special", [](json& f) { f["post_processor"] = Template("<cls>", 0); },
          {"post_processor.single[0]", "<cls>"}, /*library_refuses=*/false),
      Edited("template_without_pair",
             [](json& f) {
               f["post_processor"] = Template("<s>", 0);
               f["post_processor"].erase("pair");
             },
             {"post_processor.pair"}),
      Edited(
          "bert_id_outside_vocabulary",
          [](json& f) {
            f["post_processor"] = {
                {"type", "BertProcessing"}, {"sep", {"</s>", 1}}, {"cls", {"<s>", 123456}}};
          },
          {"post_processor.cls", "123456"}, /*library_refuses=*/false),
      Edited("bad_split_regex",
             [](json& f) {
               f["pre_tokenizer"] = {{"type", "Split"},
                                     {"pattern", {{"Regex", "(a|b"}}},
                                     {"behavior", "Isolated"},
                                     {"invert", false}};
             },
             {"pre_tokenizer.pattern", "(a|b"}),
      Edited("bad_replace_regex",
             [](json& f) {
               f["normalizer"] = {
                   {"type", "Replace"}, {"pattern", {{"Regex", "[a-"}}}, {"content", ""}};
             },
             {"normalizer.pattern", "[a-"}),
      Edited("pattern_both_kinds",
             [](json& f) {
               f["normalizer"] = {{"type", "Replace"},
                                  {"pattern", {{"Regex", "a"}, {"String", "b"}}},
                                  {"content", ""}};
             },
             {"normalizer.pattern"}),
      Edited("split_without_invert",
             [](json& f) {
               f["pre_tokenizer"] = {
                   {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}};
             },
             {"pre_tokenizer.invert"}),
      Edited("split_unknown_behavior",
             [](json& f) {
               f["pre_tokenizer"] = {{"type", "Split"},
                                     {"pattern", {{"String", " "}}},
                                     {"behavior", "Sideways"},
                                     {"invert", false}};
             },
             {"pre_tokenizer.behavior", "Sideways"}),
      Edited("byte_level_without_trim_offsets",
             [](json& f) {
               f["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
             },
             {"decoder.trim_offsets"}),
      Edited("metaspace_two_characters",
             [](json& f) {
               f["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
             },
             {"pre_tokenizer.replacement", "one character"}),
      Edited("metaspace_prefix_contradiction",
             [](json& f) {
               f["pre_tokenizer"] = {
                   {"type", "Metaspace"}, {"replacement", "_"}, {"add_prefix_space", false}};
             },
             {"pre_tokenizer.add_prefix_space"}),
      Edited("strip_decoder_negative",
             [](json& f) {
               f["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}};
             },
             {"decoder.start"}),
      Edited(
          "added_token_id_disagrees", [](json& f) { f["added_tokens"][1]["id"] = 40; },
          {"added_tokens[1].id", "40", "</s>"}, /*library_refuses=*/false),
      Edited(
          "added_token_vocabulary_id_disagrees",
          [](json& f) { f["added_tokens"].push_back(test::AddedTokenJson(0, "b", false)); },
          {"added_tokens[2].id", "\"b\""}, /*library_refuses=*/false),
      Edited("added_token_without_special", [](json& f) { f["added_tokens"][0].erase("special"); },
             {"added_tokens[0].special"}),
      Edited("added_token_without_id", [](json& f) { f["added_tokens"][0].erase("id"); },
             {"added_tokens[0].id"}),
      Edited("added_tokens_null", [](json& f) { f["added_tokens"] = nullptr; }, {"added_tokens"}),
      Edited("version_2", [](json& f) { f["version"] = "2.0"; }, {"version", "2.0"}),
  };
}

TEST(HfTokenizerLoadTest, MalformedFilesNameTheFileAndTheField) {
  test::TempDir dir;
  std::string why;
  const bool has_library = !test::HfNpmDir(&why).empty();
  json request = {{"tokenizers", json::array()}};
  const std::vector<Malformed> files = MalformedFiles();
  for (const Malformed& m : files) {
    const std::filesystem::path folder = dir.path() / m.name;
    std::filesystem::create_directories(folder);
    const std::string path = (folder / "tokenizer.json").string();
    test::WriteFile(path, m.text);
    std::vector<std::string> parts = m.parts;
    parts.push_back(path);
    SCOPED_TRACE(m.name);
    test::ExpectError([&] { Tokenizer::FromFile(path); }, parts);
    test::ExpectError([&] { Tokenizer::Load(folder.string()); }, parts);
    request["tokenizers"].push_back({{"tokenizer", path}});
  }
  if (!has_library) GTEST_SKIP() << "the library's verdicts are not checked: " << why;
  const json response = test::RunNodeOracle("hf_tokenizer_oracle.mjs", request);
  for (size_t i = 0; i < files.size(); ++i) {
    const json& result = response["results"][i];
    EXPECT_EQ(result.contains("error"), files[i].library_refuses)
        << files[i].name << ": the library "
        << (result.contains("error") ? "refuses it: " + result["error"].get<std::string>()
                                     : std::string("loads it"));
  }
}

TEST(HfTokenizerLoadTest, TheBaseFileLoads) {
  test::TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  test::WriteFile(path, BaseFile().dump());
  const auto tokenizer = Tokenizer::FromFile(path);
  EXPECT_TRUE(tokenizer->is_hugging_face());
  const std::vector<int> ids = tokenizer->Encode("abcde<s>");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tokenizer->IdToPiece(ids[0]), "abc");
  EXPECT_EQ(tokenizer->IdToPiece(ids[1]), "de");
  EXPECT_TRUE(tokenizer->IsControl(ids[2]));
}

TEST(HfTokenizerLoadTest, AFolderWithBothFilesUsesTokenizerJson) {
  test::TempDir dir;
  std::filesystem::copy_file(test::SharedDir() / "models/stories260K/tokenizer.model",
                             dir.path() / "tokenizer.model");
  const auto spm = Tokenizer::Load(dir.path().string());
  EXPECT_FALSE(spm->is_hugging_face());
  test::WriteFile(dir.path() / "tokenizer.json", BaseFile().dump());
  const auto both = Tokenizer::Load(dir.path().string());
  EXPECT_TRUE(both->is_hugging_face());
  EXPECT_EQ(both->vocab_size(),
            Tokenizer::FromFile((dir.path() / "tokenizer.json").string())->vocab_size());
  EXPECT_EQ(both->Decode(both->Encode("abcde")), "abc de");  // no decoder: tokens joined by " "
  // A broken tokenizer.json is an error, not a fall back to tokenizer.model.
  test::WriteFile(dir.path() / "tokenizer.json", "{");
  test::ExpectError([&] { Tokenizer::Load(dir.path().string()); },
                    {(dir.path() / "tokenizer.json").string()});
}

}  // namespace
}  // namespace llm
