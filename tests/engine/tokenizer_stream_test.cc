// IncrementalDecoder: for many id sequences and every split point into (context, pushed),
// the concatenated Push() outputs plus Flush() equal Decode(context + pushed) minus
// Decode(context), and no output ever ends inside a UTF-8 character.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "tests/test_util.h"

namespace llm {
namespace {

std::unique_ptr<Tokenizer> Mistral() {
  return Tokenizer::FromFile(
      (test::SharedDir() / "models/tokenizers/mistral-7b-v0.1/tokenizer.model").string());
}

// Strict UTF-8 check: complete characters only, no overlongs or surrogates.
bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
    if (length == 0 || i + length > text.size()) return false;
    uint32_t cp = length == 1 ? c : c & (0x7F >> length);
    for (size_t k = 1; k < length; ++k) {
      const auto t = static_cast<unsigned char>(text[i + k]);
      if ((t & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    i += length;
  }
  return true;
}

// Random ids biased towards what makes streaming hard: byte pieces of whole and cut UTF-8
// characters, control ids, the unknown id and "▁" pieces.
std::vector<int> RandomIds(const Tokenizer& tokenizer, std::mt19937& rng) {
  auto byte_id = [&](int byte) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    return tokenizer.PieceToId(std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">");
  };
  const std::vector<std::string> chars = {"A", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                                          "\xE2\x80\x8D"};
  std::vector<int> ids;
  const int length = std::uniform_int_distribution<int>(1, 14)(rng);
  for (int i = 0; i < length; ++i) {
    const int roll = std::uniform_int_distribution<int>(0, 99)(rng);
    if (roll < 40) {
      std::string bytes = chars[rng() % chars.size()];
      if (roll < 8) bytes.resize(1 + rng() % bytes.size());  // cut short
      for (unsigned char b : bytes) ids.push_back(byte_id(b));
    } else if (roll < 50) {
      ids.push_back(rng() % 3);  // <unk>, <s>, </s>
    } else if (roll < 65) {
      ids.push_back(tokenizer.PieceToId(rng() % 2 ? "\xE2\x96\x81" : "\xE2\x96\x81\xE2\x96\x81"));
    } else {
      ids.push_back(rng() % tokenizer.vocab_size());
    }
  }
  return ids;
}

// Checks one sequence at every split point; returns how many splits were compared.
int CheckAllSplits(const Tokenizer& tokenizer, const std::vector<int>& ids) {
  const std::string full = tokenizer.Decode(ids);
  int num_compared = 0;
  for (size_t split = 0; split <= ids.size(); ++split) {
    const std::span<const int> context(ids.data(), split);
    const std::string context_text = tokenizer.Decode(context);
    IncrementalDecoder decoder(tokenizer, context);
    std::string streamed;
    for (size_t i = split; i < ids.size(); ++i) {
      const std::string piece = decoder.Push(ids[i]);
      EXPECT_TRUE(IsValidUtf8(piece)) << "split " << split << " id " << ids[i];
      streamed += piece;
    }
    const std::string rest = decoder.Flush();
    EXPECT_TRUE(IsValidUtf8(rest));
    streamed += rest;
    // A context that ends inside a byte sequence has no text of its own that Decode(all)
    // repeats (its cut character is U+FFFD alone, a whole character with what follows).
    if (!full.starts_with(context_text)) {
      EXPECT_GT(split, 0u);
      EXPECT_TRUE(tokenizer.IsByte(ids[split - 1])) << "split " << split;
      continue;
    }
    EXPECT_EQ(streamed, full.substr(context_text.size())) << "split " << split;
    ++num_compared;
  }
  return num_compared;
}

TEST(IncrementalDecoderTest, EmojiFromFourBytePiecesComesOutWhole) {
  const auto tokenizer = Mistral();
  const std::vector<int> ids = tokenizer->Encode("\xF0\x9F\xA6\x99");  // 🦙: no piece of its own
  ASSERT_EQ(ids.size(), 5u);  // "▁" then four byte pieces
  for (size_t i = 1; i < ids.size(); ++i) ASSERT_TRUE(tokenizer->IsByte(ids[i]));
  IncrementalDecoder decoder(*tokenizer);
  EXPECT_EQ(decoder.Push(ids[0]), "");  // the dummy-prefix space is dropped at the start
  EXPECT_EQ(decoder.Push(ids[1]), "");
  EXPECT_EQ(decoder.Push(ids[2]), "");
  EXPECT_EQ(decoder.Push(ids[3]), "");
  EXPECT_EQ(decoder.Push(ids[4]), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoderTest, CutAndInvalidBytesBecomeReplacementCharacters) {
  const auto tokenizer = Mistral();
  const int f0 = tokenizer->PieceToId("<0xF0>");
  const int x9f = tokenizer->PieceToId("<0x9F>");
  const int a = tokenizer->PieceToId("<0x41>");
  IncrementalDecoder decoder(*tokenizer);
  EXPECT_EQ(decoder.Push(f0), "");
  EXPECT_EQ(decoder.Push(x9f), "");
  EXPECT_EQ(decoder.Push(a),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "A");  // F0 9F cannot take 'A'
  EXPECT_EQ(decoder.Push(f0), "");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer->Decode(std::vector<int>{f0, x9f, a, f0}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "A\xEF\xBF\xBD");
}

TEST(IncrementalDecoderTest, ContinuationKeepsItsLeadingSpace) {
  const auto tokenizer = Mistral();
  const std::vector<int> ids = tokenizer->Encode("Hello there");
  ASSERT_EQ(ids.size(), 2u);
  const std::vector<int> context = {tokenizer->bos_id(), ids[0]};
  IncrementalDecoder continued(*tokenizer, context);
  EXPECT_EQ(continued.Push(ids[1]), " there");
  IncrementalDecoder fresh(*tokenizer);
  EXPECT_EQ(fresh.Push(ids[1]), "there");
  IncrementalDecoder after_bos(*tokenizer, std::vector<int>{tokenizer->bos_id()});
  EXPECT_EQ(after_bos.Push(ids[1]), "there");
}

TEST(IncrementalDecoderTest, EverySplitPointOfEncodedText) {
  const auto tokenizer = Mistral();
  const std::vector<std::string> texts = {
      "Hello world", "  two leading spaces",
      "emoji \xF0\x9F\x98\x80 and family "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7!",
      "flag \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 tab\tnewline\n\r\nend ",
      "\xE6\x9D\xB1\xE4\xBA\xAC caf\xC3\xA9 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \x01\x7f"};
  int num_compared = 0;
  for (const std::string& text : texts) {
    std::vector<int> ids = tokenizer->EncodePrompt(text);
    num_compared += CheckAllSplits(*tokenizer, ids);
    ids.push_back(tokenizer->eos_id());
    num_compared += CheckAllSplits(*tokenizer, ids);
  }
  EXPECT_GT(num_compared, 100);
}

TEST(IncrementalDecoderTest, EverySplitPointOfRandomIds) {
  std::mt19937 rng(1234);
  int num_compared = 0;
  for (const auto& tokenizer :
       {Mistral(), Tokenizer::Load((test::SharedDir() / "models/stories260K").string())}) {
    for (int sequence = 0; sequence < 1500; ++sequence) {
      num_compared += CheckAllSplits(*tokenizer, RandomIds(*tokenizer, rng));
    }
  }
  std::cout << "[stream] compared " << num_compared << " split points\n";
  EXPECT_GT(num_compared, 10000);
}

}  // namespace
}  // namespace llm
