// Unit tests of llm::Tokenizer and llm::IncrementalDecoder on the shared tokenizers:
// load errors, known encodings (stories260K, Mistral's encodings.json), piece/id lookups,
// encoding speed, and the streaming decoder's invariants at every split point.
// (One executable on purpose: `ninja tokenizer_test tokenizer_oracle_test` builds them all.)
#include "engine/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/error.h"
#include "sentencepiece_model.pb.h"
#include "tests/test_util.h"

namespace llm {
namespace {

std::filesystem::path MistralModel() {
  return test::SharedDir() / "models/tokenizers/mistral-7b-v0.1/tokenizer.model";
}
std::filesystem::path StoriesDir() { return test::SharedDir() / "models/stories260K"; }

// The llm::Error message of `load`, or "" when it does not throw llm::Error.
template <typename Load>
std::string LoadError(Load load) {
  try {
    load();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(TokenizerLoadTest, MissingFileNamesThePath) {
  const std::string path = "/nonexistent/dir/tokenizer.model";
  EXPECT_NE(LoadError([&] { Tokenizer::FromFile(path); }).find(path), std::string::npos);
  test::TempDir dir;
  EXPECT_NE(LoadError([&] { Tokenizer::Load(dir.path().string()); }).find("tokenizer.model"),
            std::string::npos);
}

TEST(TokenizerLoadTest, GarbageTruncatedAndEmptyFilesAreErrors) {
  test::TempDir dir;
  const std::string model = test::ReadFile(MistralModel());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"garbage.model", std::string("\xff\xfe\x00garbage bytes \x01\x02\x03", 20)},
      {"text.model", "this is not a protobuf at all, just text\n"},
      {"truncated.model", model.substr(0, model.size() / 2)},
      {"truncated_tiny.model", model.substr(0, 7)},
      {"empty.model", ""},
  };
  for (const auto& [name, bytes] : cases) {
    const std::string path = (dir.path() / name).string();
    test::WriteFile(path, bytes);
    const std::string message = LoadError([&] { Tokenizer::FromFile(path); });
    EXPECT_NE(message.find(path), std::string::npos) << name << ": \"" << message << "\"";
  }
}

// Models that parse but that we must refuse, each with the words its error should contain.
TEST(TokenizerLoadTest, UnsupportedModelsAreErrors) {
  test::TempDir dir;
  sentencepiece::ModelProto base;
  ASSERT_TRUE(base.ParseFromString(test::ReadFile(StoriesDir() / "tokenizer.model")));
  using Edit = std::function<void(sentencepiece::ModelProto&)>;
  const std::vector<std::pair<std::string, Edit>> cases = {
      {"normalizer",
       [](auto& m) { m.mutable_normalizer_spec()->set_precompiled_charsmap("\x01\x02\x03"); }},
      {"model type",
       [](auto& m) { m.mutable_trainer_spec()->set_model_type(sentencepiece::TrainerSpec::WORD); }},
      {"defined twice", [](auto& m) { m.mutable_pieces(300)->set_piece(m.pieces(301).piece()); }},
      {"unknown piece",
       [](auto& m) {
         m.mutable_pieces(0)->set_type(sentencepiece::ModelProto::SentencePiece::NORMAL);
       }},
      {"byte piece", [](auto& m) { m.mutable_trainer_spec()->set_byte_fallback(false); }},
      {"empty", [](auto& m) { m.mutable_pieces(400)->set_piece(""); }},
  };
  for (const auto& [words, edit] : cases) {
    sentencepiece::ModelProto model = base;
    edit(model);
    const std::string path = (dir.path() / "edited.model").string();
    test::WriteFile(path, model.SerializeAsString());
    const std::string message = LoadError([&] { Tokenizer::FromFile(path); });
    EXPECT_NE(message.find(path), std::string::npos) << words << ": " << message;
    EXPECT_NE(message.find(words), std::string::npos) << words << ": " << message;
  }
}

// Randomly damaged models either load or throw llm::Error; whatever loads encodes and
// decodes without crashing.
TEST(TokenizerLoadTest, DamagedModelsNeverCrash) {
  test::TempDir dir;
  const std::string model = test::ReadFile(StoriesDir() / "tokenizer.model");
  const std::string path = (dir.path() / "damaged.model").string();
  std::mt19937 rng(7);
  int num_loaded = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = model;
    for (int flips = 1 + trial % 8; flips > 0; --flips) bytes[rng() % bytes.size()] = rng();
    test::WriteFile(path, bytes);
    std::unique_ptr<Tokenizer> tokenizer;
    try {
      tokenizer = Tokenizer::FromFile(path);
    } catch (const Error&) {
      continue;
    }
    ++num_loaded;
    const auto ids = tokenizer->Encode(" Once upon a time, \xF0\x9F\xA6\x99 \xff <s>  ");
    std::vector<int> all_ids(tokenizer->vocab_size());
    for (int i = 0; i < tokenizer->vocab_size(); ++i) all_ids[i] = i;
    tokenizer->Decode(ids);
    tokenizer->Decode(all_ids);
  }
  std::cout << "[damaged] " << num_loaded << " of 300 damaged models loaded\n";
}

TEST(TokenizerLoadTest, BadTokenizerConfigIsAnError) {
  test::TempDir dir;
  test::WriteFile(dir.path() / "tokenizer.model", test::ReadFile(StoriesDir() / "tokenizer.model"));
  const auto config = dir.path() / "tokenizer_config.json";
  for (const std::string bad : {"{not json", "[1, 2]", R"({"add_bos_token": "yes"})"}) {
    test::WriteFile(config, bad);
    const std::string message = LoadError([&] { Tokenizer::Load(dir.path().string()); });
    EXPECT_NE(message.find(config.string()), std::string::npos) << bad << ": " << message;
  }
  test::WriteFile(config, R"({"add_bos_token": false, "add_eos_token": true})");
  const auto tokenizer = Tokenizer::Load(dir.path().string());
  EXPECT_FALSE(tokenizer->add_bos_token());
  EXPECT_TRUE(tokenizer->add_eos_token());
  EXPECT_EQ(tokenizer->EncodePrompt("Once upon a time"), (std::vector<int>{403, 407, 261, 378, 2}));
}

TEST(TokenizerTest, Stories260K) {
  const auto tokenizer = Tokenizer::Load(StoriesDir().string());
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  EXPECT_EQ(tokenizer->Encode("Once upon a time"), (std::vector<int>{403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->EncodePrompt("Once upon a time"), (std::vector<int>{1, 403, 407, 261, 378}));
  EXPECT_TRUE(tokenizer->add_bos_token());
  EXPECT_FALSE(tokenizer->add_eos_token());
  EXPECT_EQ(tokenizer->Decode(std::vector<int>{1, 403, 407, 261, 378, 2}), "Once upon a time");
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_EQ(tokenizer->unk_id(), 0);
  EXPECT_EQ(tokenizer->pad_id(), -1);
}

TEST(TokenizerTest, MistralPiecesAndIds) {
  const auto tokenizer = Tokenizer::FromFile(MistralModel().string());
  EXPECT_EQ(tokenizer->vocab_size(), 32000);
  EXPECT_EQ(tokenizer->IdToPiece(0), "<unk>");
  EXPECT_EQ(tokenizer->IdToPiece(1), "<s>");
  EXPECT_EQ(tokenizer->IdToPiece(2), "</s>");
  EXPECT_EQ(tokenizer->IdToPiece(3), "<0x00>");
  EXPECT_EQ(tokenizer->IdToPiece(258), "<0xFF>");
  EXPECT_EQ(tokenizer->IdToPiece(259), "\xE2\x96\x81\xE2\x96\x81");  // "▁▁"
  EXPECT_EQ(tokenizer->IdToPiece(-1), "");
  EXPECT_EQ(tokenizer->IdToPiece(32000), "");
  EXPECT_EQ(tokenizer->PieceToId("<0x0A>"), 13);
  EXPECT_EQ(tokenizer->PieceToId("</s>"), 2);
  EXPECT_EQ(tokenizer->PieceToId("no such piece"), 0);
  EXPECT_TRUE(tokenizer->IsControl(1));
  EXPECT_TRUE(tokenizer->IsControl(2));
  EXPECT_FALSE(tokenizer->IsControl(0));
  EXPECT_TRUE(tokenizer->IsByte(3));
  EXPECT_FALSE(tokenizer->IsByte(259));
  EXPECT_EQ(tokenizer->unk_id(), 0);
  EXPECT_EQ(tokenizer->pad_id(), -1);
  // Out-of-range ids decode to nothing (the library would refuse the call).
  EXPECT_EQ(tokenizer->Decode(std::vector<int>{-5, 32000, 1}), "");
}

TEST(TokenizerTest, MistralReferenceEncodings) {
  const auto tokenizer = Tokenizer::FromFile(MistralModel().string());
  const auto refs = nlohmann::json::parse(
      test::ReadFile(test::SharedDir() / "models/tokenizers/mistral-7b-v0.1/encodings.json"));
  ASSERT_EQ(refs["cases"].size(), 41u);
  for (const auto& item : refs["cases"]) {
    const std::string name = item["name"].get<std::string>();
    const auto ids = item["ids"].get<std::vector<int>>();
    EXPECT_EQ(tokenizer->Encode(item["text"].get<std::string>()), ids) << name;
    EXPECT_EQ(tokenizer->Decode(ids), item["decoded"].get<std::string>()) << name;
    std::vector<int> pieces_ids;
    for (const auto& piece : item["pieces"]) {
      pieces_ids.push_back(tokenizer->PieceToId(piece.get<std::string>()));
    }
    EXPECT_EQ(pieces_ids, ids) << name;
  }
}

TEST(TokenizerTest, EncodesLongParagraph) {
  const auto tokenizer = Tokenizer::FromFile(MistralModel().string());
  std::string paragraph;
  while (paragraph.size() < 5000) {
    paragraph += "The quick brown fox jumps over the lazy dog, café naïve 東京 42. ";
  }
  paragraph.resize(5000);
  double best_ms = 1e9;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const auto ids = tokenizer->Encode(paragraph);
    const std::chrono::duration<double, std::milli> elapsed =
        std::chrono::steady_clock::now() - start;
    best_ms = std::min(best_ms, elapsed.count());
    ASSERT_GT(ids.size(), 1000u);
  }
  // Speed is reported, not asserted (timings belong in benchmarks; CI machines are shared).
  std::cout << "[perf] 5000-character paragraph: " << best_ms << " ms\n";
}

// ---- IncrementalDecoder: for many id sequences and every split point into (context,
// pushed), the Push() outputs plus Flush() equal Decode(context + pushed) minus
// Decode(context), and no output ever ends inside a UTF-8 character.

std::unique_ptr<Tokenizer> Mistral() { return Tokenizer::FromFile(MistralModel().string()); }

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
  for (const auto& tokenizer : {Mistral(), Tokenizer::Load(StoriesDir().string())}) {
    for (int sequence = 0; sequence < 1500; ++sequence) {
      num_compared += CheckAllSplits(*tokenizer, RandomIds(*tokenizer, rng));
    }
  }
  std::cout << "[stream] compared " << num_compared << " split points\n";
  EXPECT_GT(num_compared, 10000);
}

}  // namespace
}  // namespace llm
