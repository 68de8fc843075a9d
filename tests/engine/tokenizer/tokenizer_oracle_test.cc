// Differential test: our Tokenizer against the real SentencePiece library. The ctest fixture
// `spm_oracle` (tests/tools/spm_oracle.py) writes one JSON file per tokenizer into
// OracleDir() with the library's encode(text) ids, decode(ids) texts and decodes of random
// id lists (and spm_encode ids of malformed UTF-8 byte strings); every one must match exactly, and
// the IncrementalDecoder must stream the same texts.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/tokenizer/hf_fixtures.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using test::Escape;
using test::Join;
using test::StreamDecode;

namespace fs = std::filesystem;
constexpr int kMaxReported = 8;  // mismatches printed per tokenizer

// Counts of what one tokenizer's oracle file checked, and the first mismatches.
struct Report {
  int num_strings = 0;
  int num_decodes = 0;
  int num_raw_strings = 0;
  int num_mismatches = 0;
  std::vector<std::string> details;

  void Mismatch(const std::string& what) {
    if (++num_mismatches <= kMaxReported) details.push_back(what);
  }
};

void CheckStrings(const Tokenizer& tokenizer, const nlohmann::json& strings, Report* report) {
  for (const auto& item : strings) {
    const std::string text = item["text"].get<std::string>();
    const auto expected_ids = item["ids"].get<std::vector<int>>();
    const std::string expected_text = item["decoded"].get<std::string>();
    ++report->num_strings;
    const std::vector<int> ids = tokenizer.Encode(text);
    if (ids != expected_ids) {
      report->Mismatch("encode \"" + Escape(text) + "\"\n      ours:    " + Join(ids) +
                       "\n      library: " + Join(expected_ids));
    }
    const std::string decoded = tokenizer.Decode(expected_ids);
    if (decoded != expected_text) {
      report->Mismatch("decode " + Join(expected_ids) + "\n      ours:    \"" + Escape(decoded) +
                       "\"\n      library: \"" + Escape(expected_text) + "\"");
    }
    const std::string streamed = StreamDecode(tokenizer, expected_ids);
    if (streamed != expected_text) {
      report->Mismatch("stream " + Join(expected_ids) + "\n      ours:    \"" + Escape(streamed) +
                       "\"\n      library: \"" + Escape(expected_text) + "\"");
    }
  }
}

void CheckDecodes(const Tokenizer& tokenizer, const nlohmann::json& decodes, Report* report) {
  for (const auto& item : decodes) {
    const auto ids = item["ids"].get<std::vector<int>>();
    const std::string expected = item["text"].get<std::string>();
    ++report->num_decodes;
    const std::string decoded = tokenizer.Decode(ids);
    const std::string streamed = StreamDecode(tokenizer, ids);
    if (decoded != expected || streamed != expected) {
      report->Mismatch("decode " + Join(ids) + "\n      ours:    \"" + Escape(decoded) +
                       "\"\n      streamed: \"" + Escape(streamed) + "\"\n      library: \"" +
                       Escape(expected) + "\"");
    }
  }
}

std::string FromHex(std::string_view hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return bytes;
}

// Byte strings with malformed UTF-8 (encoded by spm_encode): each bad byte is U+FFFD.
void CheckRawStrings(const Tokenizer& tokenizer, const nlohmann::json& raws, Report* report) {
  for (const auto& item : raws) {
    const std::string text = FromHex(item["hex"].get<std::string>());
    const auto expected_ids = item["ids"].get<std::vector<int>>();
    ++report->num_raw_strings;
    const std::vector<int> ids = tokenizer.Encode(text);
    if (ids != expected_ids) {
      report->Mismatch("encode bytes \"" + Escape(text) + "\"\n      ours:    " + Join(ids) +
                       "\n      library: " + Join(expected_ids));
    }
  }
}

std::vector<fs::path> OracleFiles() {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(test::OracleDir(), ec)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(TokenizerOracleTest, MatchesSentencePieceExactly) {
  const std::vector<fs::path> files = OracleFiles();
  ASSERT_GE(files.size(), 4u) << "no oracle files in " << test::OracleDir()
                              << " (the spm_oracle fixture writes them)";
  int total_strings = 0;
  int total_decodes = 0;
  int total_raw_strings = 0;
  int total_mismatches = 0;
  for (const fs::path& file : files) {
    const auto oracle = nlohmann::json::parse(test::ReadFile(file));
    const std::string model = oracle["model"].get<std::string>();
    std::unique_ptr<Tokenizer> tokenizer;
    ASSERT_NO_THROW(tokenizer = Tokenizer::FromFile(model)) << model;
    Report report;
    CheckStrings(*tokenizer, oracle["strings"], &report);
    CheckDecodes(*tokenizer, oracle["decodes"], &report);
    CheckRawStrings(*tokenizer, oracle["raw_strings"], &report);
    std::cout << "[oracle] " << oracle["name"].get<std::string>() << ": " << report.num_strings
              << " strings, " << report.num_decodes << " id lists, " << report.num_raw_strings
              << " malformed byte strings, " << report.num_mismatches << " differences\n";
    for (const auto& detail : report.details) std::cout << "    " << detail << "\n";
    total_strings += report.num_strings;
    total_decodes += report.num_decodes;
    total_raw_strings += report.num_raw_strings;
    total_mismatches += report.num_mismatches;
  }
  std::cout << "[oracle] total: " << files.size() << " tokenizers, " << total_strings
            << " strings, " << total_decodes << " id lists, " << total_raw_strings
            << " malformed byte strings, " << total_mismatches << " differences\n";
  // spm_oracle.py writes 10,000 random strings per tokenizer, 1,000 with LLM_TEST_SCALE=small.
  EXPECT_GE(total_strings, test::Scaled(10000, 1000));
  EXPECT_EQ(total_mismatches, 0);
}

}  // namespace
}  // namespace llm
