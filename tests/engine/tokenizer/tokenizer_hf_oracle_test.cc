// Differential test: our tokenizer.json implementation against Hugging Face's tokenizers
// library itself (npm `tokenizers`, run in its own process by tests/tools/
// hf_tokenizer_oracle.mjs) on the real tokenizer files of Llama 3, Qwen3, Gemma 3 and
// DeepSeek-V3: 10,000 random strings each (tests/engine/tokenizer/hf_fixtures.cc) must give
// the library's ids with and without special tokens, and decoding (the library's ids and
// random id lists) its text with and without skipping special tokens; the streaming decoder
// must give the same text. Skips, saying why, when npm could not install the packages.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using test::Escape;
using test::Join;
using test::StreamDecode;

constexpr int kNumTexts = 10000;
constexpr int kNumRandomIdLists = 3000;
constexpr int kMaxReported = 6;

// Fixed strings that have tripped tokenizers up, before the random ones.
std::vector<std::string> EdgeCases() {
  return {"",
          " ",
          "  ",
          "\n",
          "\r\n",
          " \r\n ",
          "'S",
          "'LL",
          "'s",
          "HE'LL",
          "I'M",
          "don'T",
          "a'",
          "'",
          "''",
          "'''s",
          "hello  world",
          "hello   ",
          "   hello",
          "\t\tx",
          "1234567",
          "12 345 6789",
          "٣٤٥",
          "x\u0301",
          "\u0301",
          "😀😀",
          "👨‍👩‍👧",
          "日本語",
          "ab\u00a0cd",
          "a\u3000b",
          "<|eot_id|>",
          "<|im_start|>user\nhi<|im_end|>",
          "<start_of_turn>user",
          "<|begin_of_text|><|begin_of_text|>",
          "x<think>y</think>z",
          "<｜User｜>hi",
          "<unk>",
          "<pad>",
          "<0x41>",
          "\xE2\x96\x81hello",
          "▁▁",
          "ĠHello",
          "Ċ"};
}

class HfTokenizerOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerOracle, RandomTextMatchesTheLibrary) {
  std::string why;
  if (test::HfNpmDir(&why).empty()) GTEST_SKIP() << why;
  const std::string path = (test::LenmlModelDir(GetParam()) / "tokenizer.json").string();
  std::unique_ptr<Tokenizer> tokenizer;
  ASSERT_NO_THROW(tokenizer = Tokenizer::FromFile(path)) << path;

  std::vector<std::string> specials;
  std::vector<int> special_ids;
  for (int id = 0; id < tokenizer->vocab_size(); ++id) {
    if (tokenizer->IsControl(id)) special_ids.push_back(id);
  }
  for (size_t i = 0; i < special_ids.size(); i += 1 + special_ids.size() / 40) {
    specials.emplace_back(tokenizer->IdToPiece(special_ids[i]));
  }
  for (const char* s : {"<|eot_id|>", "<|im_start|>", "<|im_end|>", "<start_of_turn>",
                        "<end_of_turn>", "<think>", "</think>", "<｜User｜>", "<tool_call>"}) {
    specials.emplace_back(s);
  }
  std::mt19937 rng(std::hash<std::string>{}(GetParam()) & 0xFFFF);
  std::vector<std::string> texts = EdgeCases();
  while (texts.size() < kNumTexts) texts.push_back(test::RandomText(rng, specials));

  std::vector<std::vector<int>> ours, ours_special;
  for (const std::string& t : texts) {
    ours.push_back(tokenizer->Encode(t));
    ours_special.push_back(tokenizer->EncodePrompt(t));
  }
  // Decoded: our ids of each text, and random id lists (specials, bytes, any token).
  std::vector<std::vector<int>> decodes = ours_special;
  std::uniform_int_distribution<int> any_id(0, tokenizer->vocab_size() - 1);
  for (int i = 0; i < kNumRandomIdLists; ++i) {
    std::vector<int> ids(1 + rng() % 16);
    for (int& id : ids) {
      const int kind = rng() % 4;
      id = kind == 0 && !special_ids.empty() ? special_ids[rng() % special_ids.size()]
           : kind == 1 ? static_cast<int>(rng() % 512)  // byte-level and byte-fallback pieces
                       : any_id(rng);
    }
    decodes.push_back(ids);
  }
  const nlohmann::json response = test::RunNodeOracle(
      "hf_tokenizer_oracle.mjs", {{"tokenizer", path}, {"texts", texts}, {"decode", decodes}});

  int mismatches = 0;
  std::vector<std::string> details;
  auto report = [&](const std::string& what) {
    if (++mismatches <= kMaxReported) details.push_back(what);
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto lib = response["ids"][i].get<std::vector<int>>();
    const auto lib_special = response["ids_special"][i].get<std::vector<int>>();
    if (ours[i] != lib) {
      report("encode \"" + Escape(texts[i]) + "\": ours " + Join(ours[i]) + " library " +
             Join(lib));
    }
    if (ours_special[i] != lib_special) {
      report("encode with specials \"" + Escape(texts[i]) + "\": ours " + Join(ours_special[i]) +
             " library " + Join(lib_special));
    }
  }
  for (size_t i = 0; i < decodes.size(); ++i) {
    for (const bool skip : {false, true}) {
      const std::string lib = response[skip ? "text_skip" : "text"][i].get<std::string>();
      const std::string whole = tokenizer->Decode(decodes[i], skip);
      const std::string streamed = StreamDecode(*tokenizer, decodes[i], skip);
      const std::string mode = skip ? " (skipping specials)" : "";
      if (whole != lib) {
        report("decode" + mode + " " + Join(decodes[i]) + ": ours \"" + Escape(whole) +
               "\" library \"" + Escape(lib) + "\"");
      }
      if (streamed != whole) {
        report("streamed decode" + mode + " " + Join(decodes[i]) + ": \"" + Escape(streamed) +
               "\" but whole \"" + Escape(whole) + "\"");
      }
    }
  }
  std::string all;
  for (const std::string& d : details) all += "\n  " + d;
  EXPECT_EQ(mismatches, 0) << GetParam() << ": " << mismatches << " differences from the library"
                           << all;
  std::cout << GetParam() << ": " << texts.size() << " texts, " << decodes.size()
            << " id lists x 2 decodes, " << mismatches << " differences\n";
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, HfTokenizerOracle,
                         ::testing::Values("llama3", "qwen3", "gemma3", "deepseek_v3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace llm
