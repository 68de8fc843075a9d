// Safetensors reading, writing and sharded checkpoints, including one crafted bad file per
// validation rule and a mutation fuzz run (no crash, only llm::Error).
#include "engine/loader/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/error.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::ReadFile;
using test::TempDir;
using test::WriteFile;

using test::ExpectError;

// u64 little-endian length + header text + `data_bytes` zero bytes.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

std::string RawFile(const json& header, size_t data_bytes) {
  return RawFile(header.dump(), data_bytes);
}

std::vector<std::byte> Bytes(size_t n, int seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return out;
}

TEST(SafetensorsTest, RoundTripAllDtypes) {
  TempDir dir;
  const std::string path = (dir.path() / "t.safetensors").string();
  std::vector<TensorData> tensors = {
      {"w.f32", DType::kF32, {3, 5}, Bytes(3 * 5 * 4, 1)},
      {"w.f16", DType::kF16, {7}, Bytes(7 * 2, 2)},
      {"w.bf16", DType::kBF16, {2, 3, 2}, Bytes(12 * 2, 3)},
      {"empty", DType::kF32, {0, 4}, {}},
      {"scalar", DType::kBF16, {}, Bytes(2, 4)},
  };
  WriteSafetensors(path, tensors, {{"note", "hi"}});
  auto file = SafetensorsFile::Open(path);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (const TensorData& t : tensors) {
    const TensorView* v = file->Find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    EXPECT_EQ(v->file, path);
    ASSERT_EQ(v->num_bytes, t.bytes.size());
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), v->num_bytes), 0);
    }
  }
  EXPECT_EQ(file->Find("w.f32")->num_elements(), 15);
  EXPECT_EQ(file->Find("scalar")->num_elements(), 1);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "hi");
  EXPECT_EQ(file->Find("nope"), nullptr);
}

TEST(SafetensorsTest, HeaderPaddedWithSpacesAndTensorsSortedByName) {
  TempDir dir;
  const std::string path = (dir.path() / "t.safetensors").string();
  WriteSafetensors(path,
                   {{"b", DType::kF32, {1}, Bytes(4, 1)}, {"a", DType::kF16, {1}, Bytes(2, 2)}});
  std::string raw = ReadFile(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  std::string header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // only spaces after '}'
  json j = json::parse(header);
  EXPECT_EQ(j["a"]["data_offsets"], json({0, 2}));
  EXPECT_EQ(j["b"]["data_offsets"], json({2, 6}));
  EXPECT_EQ(raw.size(), 8 + n + 6);
}

TEST(SafetensorsTest, StreamingWriterKeepsDeclarationOrderAndChecks) {
  TempDir dir;
  const std::string path = (dir.path() / "s.safetensors").string();
  {
    SafetensorsWriter w(path, {{"z", DType::kF32, {2}}, {"a", DType::kBF16, {3}}});
    auto z = Bytes(8, 5), a = Bytes(6, 6);
    ExpectError([&] { w.Write("a", a.data(), a.size()); }, {path, "'a'", "expected 'z'"});
    ExpectError([&] { w.Write("z", z.data(), 7); }, {path, "'z'", "7 bytes"});
    w.Write("z", z.data(), z.size());
    ExpectError([&] { w.Close(); }, {path, "'a'"});
    w.Write("a", a.data(), a.size());
    ExpectError([&] { w.Write("x", a.data(), a.size()); }, {path, "'x'"});
    w.Close();
  }
  auto file = SafetensorsFile::Open(path);
  const TensorView* z = file->Find("z");
  const TensorView* a = file->Find("a");
  ASSERT_TRUE(z && a);
  EXPECT_LT(z->data, a->data);  // declaration order, not name order
  EXPECT_EQ(std::memcmp(a->data, Bytes(6, 6).data(), 6), 0);
}

TEST(SafetensorsTest, UnfinishedWriterRemovesItsFile) {
  TempDir dir;
  const std::string path = (dir.path() / "s.safetensors").string();
  { SafetensorsWriter w(path, {{"z", DType::kF32, {2}}}); }
  EXPECT_FALSE(fs::exists(path));
  ExpectError(
      [&] {
        SafetensorsWriter w(path, {{"z", DType::kF32, {2}}, {"z", DType::kF32, {1}}});
      },
      {path, "'z'"});
  ExpectError([&] { SafetensorsWriter w(path, {{"n", DType::kF32, {-1}}}); }, {path, "'n'"});
}

TEST(SafetensorsTest, OpensStories260K) {
  const std::string path = (test::SharedDir() / "models/stories260K/model.safetensors").string();
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file->tensors().size(), 1u + 9 * 5 + 1);
  const TensorView* emb = file->Find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->num_bytes, 512u * 64 * 4);
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

// Offsets past 4 GiB (a 16 GB checkpoint): a sparse file, so no real disk is used.
TEST(SafetensorsTest, SixtyFourBitOffsets) {
  TempDir dir;
  const std::string path = (dir.path() / "big.safetensors").string();
  const uint64_t big = uint64_t{5} << 30;  // 5 Gi BF16 elements = 10 GiB
  json h = {
      {"big",
       {{"dtype", "BF16"}, {"shape", {5, uint64_t{1} << 30}}, {"data_offsets", {0, 2 * big}}}},
      {"tail", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {2 * big, 2 * big + 4}}}}};
  std::string raw = RawFile(h, 0);
  const uint64_t header_end = raw.size();
  WriteFile(path, raw);
  fs::resize_file(path, header_end + 2 * big + 4);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(header_end + 2 * big));
    f.write("\x01\x02\x03\x04", 4);
  }
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file->Find("big")->num_bytes, 2 * big);
  EXPECT_EQ(file->Find("big")->num_elements(), static_cast<int64_t>(big));
  const TensorView* tail = file->Find("tail");
  ASSERT_NE(tail, nullptr);
  EXPECT_EQ(tail->data - file->Find("big")->data, static_cast<ptrdiff_t>(2 * big));
  EXPECT_EQ(std::to_integer<int>(tail->data[3]), 4);
}

// ---- one crafted bad file per validation rule -----------------------------------------

class SafetensorsBadFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    WriteFile(path_, bytes);
    return path_;
  }
  void Expect(const std::string& bytes, const std::vector<std::string>& parts) {
    Write(bytes);
    std::vector<std::string> all = parts;
    all.push_back(path_);
    ExpectError([&] { SafetensorsFile::Open(path_); }, all);
  }
  static json Entry(const std::string& dtype, json shape, json offsets) {
    return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}};
  }
  TempDir dir_;
  std::string path_ = (dir_.path() / "bad.safetensors").string();
};

TEST_F(SafetensorsBadFileTest, MissingFile) {
  ExpectError([&] { SafetensorsFile::Open(path_); }, {path_});
}

TEST_F(SafetensorsBadFileTest, TruncatedFile) { Expect("abc", {"truncated"}); }

TEST_F(SafetensorsBadFileTest, HeaderLengthBeyondFile) {
  std::string raw = RawFile(json{{"w", Entry("F32", {1}, {0, 4})}}, 4);
  raw[7] = '\x7f';  // length ~ 9e18
  Expect(raw, {"header length"});
}

TEST_F(SafetensorsBadFileTest, HeaderLengthAbove100MB) {
  // A sparse 120 MB file whose header claims 110 MB: within the file, above the limit.
  std::string raw = RawFile(std::string("{}"), 0);
  uint64_t n = 110'000'000;
  for (int i = 0; i < 8; ++i) raw[i] = static_cast<char>(n >> (8 * i));
  Write(raw);
  fs::resize_file(path_, 120'000'000);
  ExpectError([&] { SafetensorsFile::Open(path_); }, {path_, "100 MB"});
}

TEST_F(SafetensorsBadFileTest, HeaderNotJson) {
  Expect(RawFile(std::string("{\"w\": [1,"), 8), {"JSON"});
}

TEST_F(SafetensorsBadFileTest, HeaderJsonArray) {
  Expect(RawFile(json::array({1, 2}), 8), {"not a JSON object"});
}

TEST_F(SafetensorsBadFileTest, UnknownDtypeI64) {
  Expect(RawFile(json{{"ids", Entry("I64", {2}, {0, 16})}}, 16), {"'ids'", "I64"});
}

TEST_F(SafetensorsBadFileTest, UnknownDtypeF8) {
  Expect(RawFile(json{{"q", Entry("F8_E4M3", {2}, {0, 2})}}, 2), {"'q'", "F8_E4M3"});
}

TEST_F(SafetensorsBadFileTest, NegativeShape) {
  Expect(RawFile(json{{"w", Entry("F32", {2, -1}, {0, 8})}}, 8), {"'w'", "negative"});
}

TEST_F(SafetensorsBadFileTest, ShapeOverflow) {
  json shape = {uint64_t{1} << 32, uint64_t{1} << 32};  // 2^64 elements
  Expect(RawFile(json{{"w", Entry("F32", shape, {0, 8})}}, 8), {"'w'", "overflow"});
}

TEST_F(SafetensorsBadFileTest, ShapeNotIntegers) {
  Expect(RawFile(json{{"w", Entry("F32", {1.5}, {0, 4})}}, 4), {"'w'", "shape"});
}

TEST_F(SafetensorsBadFileTest, OffsetsBeyondEnd) {
  Expect(RawFile(json{{"w", Entry("F32", {4}, {0, 16})}}, 12), {"'w'", "beyond"});
}

TEST_F(SafetensorsBadFileTest, OffsetsReversed) {
  Expect(RawFile(json{{"w", Entry("F32", {0}, {8, 4})}}, 12), {"'w'", "data_offsets"});
}

TEST_F(SafetensorsBadFileTest, OverlappingTensors) {
  json h = {{"a", Entry("F32", {4}, {0, 16})}, {"b", Entry("F32", {2}, {8, 16})}};
  Expect(RawFile(h, 16), {"'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsBadFileTest, ByteLengthMismatch) {
  Expect(RawFile(json{{"w", Entry("BF16", {3}, {0, 8})}}, 8), {"'w'", "8 bytes", "needs 6"});
}

TEST_F(SafetensorsBadFileTest, MetadataNotStrings) {
  Expect(RawFile(json{{"__metadata__", {{"n", 1}}}}, 0), {"__metadata__", "'n'"});
}

TEST_F(SafetensorsBadFileTest, DeeplyNestedShape) {
  // A million nested lists must not recurse the stack away (parsing or error message).
  const size_t depth = 1'000'000;
  std::string header = "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4], \"shape\": ";
  header += std::string(depth, '[') + std::string(depth, ']') + "}}";
  Expect(RawFile(header, 4), {"'w'", "shape"});
}

TEST_F(SafetensorsBadFileTest, EntryNotObject) { Expect(RawFile(json{{"w", 3}}, 0), {"'w'"}); }

// ---- Checkpoint: single file and sharded ------------------------------------------------

class CheckpointTest : public ::testing::Test {
 protected:
  // Two shards: a, b in shard 1; c in shard 2; an index listing them.
  void WriteSharded(const json& weight_map) {
    WriteSafetensors(
        Path("model-00001-of-00002.safetensors"),
        {{"a", DType::kF32, {2, 2}, Bytes(16, 1)}, {"b", DType::kF16, {3}, Bytes(6, 2)}});
    WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                     {{"c", DType::kBF16, {172, 64}, Bytes(172 * 64 * 2, 3)}});
    WriteFile(Path("model.safetensors.index.json"),
              json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  }
  static json GoodMap() {
    return {{"a", "model-00001-of-00002.safetensors"},
            {"b", "model-00001-of-00002.safetensors"},
            {"c", "model-00002-of-00002.safetensors"}};
  }
  std::string Path(const std::string& name) const { return (dir_.path() / name).string(); }
  std::string Dir() const { return dir_.path().string(); }
  TempDir dir_;
};

TEST_F(CheckpointTest, SingleFile) {
  WriteSafetensors(Path("model.safetensors"), {{"x", DType::kF32, {1}, Bytes(4, 1)}});
  auto ckpt = Checkpoint::Open(Dir());
  EXPECT_EQ(ckpt->names(), std::vector<std::string>{"x"});
  EXPECT_EQ(ckpt->Get("x").file, Path("model.safetensors"));
  ExpectError([&] { ckpt->Get("y"); }, {Dir(), "'y'", "missing"});
}

TEST_F(CheckpointTest, ShardedWithIndex) {
  WriteSharded(GoodMap());
  auto ckpt = Checkpoint::Open(Dir());
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ckpt->Get("a").file, Path("model-00001-of-00002.safetensors"));
  EXPECT_EQ(ckpt->Get("c").file, Path("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ckpt->GetWithShape("c", {172, 64}).dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(ckpt->Get("b").data, Bytes(6, 2).data(), 6), 0);
  ExpectError(
      [&] {
        ckpt->GetWithShape("c", {172, 65});
      },
      {Path("model-00002-of-00002.safetensors"),
       "tensor 'c' has shape [172, 64], expected [172, 65]"});
  ExpectError([&] { ckpt->GetWithShape("d", {1}); }, {Dir(), "'d'"});
}

TEST_F(CheckpointTest, SingleFileWinsOverIndex) {
  WriteSharded(GoodMap());
  WriteSafetensors(Path("model.safetensors"), {{"x", DType::kF32, {1}, Bytes(4, 1)}});
  EXPECT_EQ(Checkpoint::Open(Dir())->names(), std::vector<std::string>{"x"});
}

TEST_F(CheckpointTest, NoCheckpointFiles) {
  ExpectError([&] { Checkpoint::Open(Dir()); }, {Dir(), "model.safetensors"});
}

TEST_F(CheckpointTest, MissingShard) {
  json map = GoodMap();
  map["d"] = "model-00003-of-00002.safetensors";
  WriteSharded(map);
  ExpectError([&] { Checkpoint::Open(Dir()); },
              {"model-00003-of-00002.safetensors", "does not exist"});
}

TEST_F(CheckpointTest, TensorListedButAbsentFromShard) {
  json map = GoodMap();
  map["ghost"] = "model-00002-of-00002.safetensors";
  WriteSharded(map);
  ExpectError([&] { Checkpoint::Open(Dir()); },
              {Path("model-00002-of-00002.safetensors"), "'ghost'", "absent"});
}

TEST_F(CheckpointTest, TensorInWrongShard) {
  json map = GoodMap();
  map["c"] = "model-00001-of-00002.safetensors";  // c really lives in shard 2
  WriteSharded(map);
  ExpectError([&] { Checkpoint::Open(Dir()); }, {Path("model-00001-of-00002.safetensors"), "'c'"});
}

TEST_F(CheckpointTest, DuplicateTensorAcrossShards) {
  WriteSharded(GoodMap());
  WriteSafetensors(
      Path("model-00002-of-00002.safetensors"),
      {{"a", DType::kF32, {2, 2}, Bytes(16, 1)}, {"c", DType::kBF16, {1}, Bytes(2, 3)}});
  ExpectError([&] { Checkpoint::Open(Dir()); }, {"'a'", Path("model-00001-of-00002.safetensors"),
                                                 Path("model-00002-of-00002.safetensors")});
}

TEST_F(CheckpointTest, BadIndex) {
  WriteFile(Path("model.safetensors.index.json"), "{\"weight_map\": [1]}");
  ExpectError([&] { Checkpoint::Open(Dir()); },
              {Path("model.safetensors.index.json"), "weight_map"});
  WriteFile(Path("model.safetensors.index.json"), "{\"weight_map\": {\"a\": \"../x\"}}");
  ExpectError([&] { Checkpoint::Open(Dir()); }, {"'a'", "../x"});
  WriteFile(Path("model.safetensors.index.json"), "not json");
  ExpectError([&] { Checkpoint::Open(Dir()); }, {Path("model.safetensors.index.json"), "JSON"});
}

// ---- mutation fuzzing ------------------------------------------------------------------

TEST(SafetensorsFuzzTest, RandomMutationsNeverCrash) {
  TempDir dir;
  const std::string good = (dir.path() / "good.safetensors").string();
  WriteSafetensors(good, {{"a", DType::kF32, {2, 3}, Bytes(24, 1)},
                          {"b", DType::kF16, {4}, Bytes(8, 2)},
                          {"c", DType::kBF16, {1}, Bytes(2, 3)}});
  const std::string original = ReadFile(good);
  const std::string path = (dir.path() / "fuzz.safetensors").string();
  std::mt19937 rng(1234);
  int opened = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = original;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[pos] = static_cast<char>(rng());
          break;  // random byte
        case 1:
          bytes[pos] = "0123456789-[]{},:\" e."[rng() % 21];
          break;  // JSON-ish byte
        case 2:
          bytes.resize(pos);
          break;  // truncate
        default:
          bytes[pos] ^= static_cast<char>(1 << (rng() % 8));
          break;  // bit flip
      }
      if (bytes.empty()) bytes.push_back(0x01);
    }
    WriteFile(path, bytes);
    try {
      auto file = SafetensorsFile::Open(path);
      size_t sum = 0;  // touch every byte of every tensor: all must lie inside the mapping
      for (const auto& [name, view] : file->tensors()) {
        for (size_t i = 0; i < view.num_bytes; ++i) sum += std::to_integer<size_t>(view.data[i]);
      }
      EXPECT_GE(sum, 0u);
      ++opened;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << ": non-llm::Error " << e.what();
    }
  }
  EXPECT_GT(opened, 0);  // some mutations (e.g. in tensor data) must still open
}

}  // namespace
}  // namespace llm
