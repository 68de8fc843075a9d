// The CPU model against Hugging Face transformers on the real stories260K checkpoint:
// logits of every position (relative error <= 1e-4) and the 64-token greedy continuation.
// Reference data: tests/data/stories260k_reference.json, made by
// tests/tools/make_hf_reference.py on the GPU machine (transformers fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/generator.h"
#include "engine/cpu/sequence_runner.h"
#include "engine/error.h"
#include "engine/loader/safetensors.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace llm {
namespace {

using nlohmann::json;

std::string ModelDir() { return test::StoriesDir(); }

const json& Reference() {
  static const json ref = json::parse(
      test::ReadFile(test::SourceDir() / "tests" / "data" / "stories260k_reference.json"));
  return ref;
}

// max |a - b| / max |b| over one row of logits.
double RelativeError(std::span<const float> got, const std::vector<float>& want) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_FALSE(std::isnan(got[i]));
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  return max_diff / max_ref;
}

class Stories260K : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = &test::StoriesModel();
    tokenizer_ = &test::StoriesTokenizer();
  }
  static const CpuModel* model_;
  static const Tokenizer* tokenizer_;
};
const CpuModel* Stories260K::model_ = nullptr;
const Tokenizer* Stories260K::tokenizer_ = nullptr;

TEST_F(Stories260K, PromptTokenizesLikeSentencePiece) {
  for (const json& c : Reference()["cases"]) {
    EXPECT_EQ(tokenizer_->EncodePrompt(c["prompt"].get<std::string>()),
              c["prompt_ids"].get<std::vector<int>>());
  }
}

// One forward over prompt + continuation: every position's logits.
TEST_F(Stories260K, AllPositionLogitsMatchTransformers) {
  for (const json& c : Reference()["cases"]) {
    std::vector<int> ids = c["prompt_ids"].get<std::vector<int>>();
    for (int id : c["greedy_ids"]) ids.push_back(id);
    const auto ref = c["logits"].get<std::vector<std::vector<float>>>();
    ASSERT_EQ(ref.size(), ids.size());
    SequenceRunner runner(*model_, static_cast<int64_t>(ids.size()));
    const std::vector<float> logits = runner.Feed(ids, /*all_logits=*/true);
    const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      worst = std::max(worst, RelativeError({logits.data() + t * vocab, vocab}, ref[t]));
    }
    EXPECT_LE(worst, 1e-4) << c["prompt"];
    std::printf("[ref] '%s': %zu positions, max relative logit error %.2e\n",
                c["prompt"].get<std::string>().c_str(), ids.size(), worst);
  }
}

// Prefill then one token at a time (the decode path), greedy: HF's 64 tokens exactly, with
// the logits of every step checked too.
TEST_F(Stories260K, GreedyDecodeMatchesTransformers) {
  for (const json& c : Reference()["cases"]) {
    const std::vector<int> prompt = c["prompt_ids"].get<std::vector<int>>();
    const std::vector<int> want = c["greedy_ids"].get<std::vector<int>>();
    const auto ref = c["logits"].get<std::vector<std::vector<float>>>();
    SequenceRunner runner(*model_, static_cast<int64_t>(prompt.size() + want.size()));
    std::vector<float> logits = runner.Feed(prompt);
    std::vector<int> got;
    for (size_t step = 0; step < want.size(); ++step) {
      EXPECT_LE(RelativeError(logits, ref[prompt.size() - 1 + step]), 1e-4) << "step " << step;
      got.push_back(Argmax(logits));
      const int next[1] = {got.back()};
      if (step + 1 < want.size()) logits = runner.Feed(next);
    }
    EXPECT_EQ(got, want) << c["prompt"];
  }
}

// Chunked prefill over the paged cache: the same sequence fed in uneven chunks (each chunk
// attends over the cached context plus itself) with several block sizes gives the same
// logits as transformers at every position.
TEST_F(Stories260K, ChunkedPrefillAcrossBlockSizesMatchesTransformers) {
  const json& c = Reference()["cases"][1];
  std::vector<int> ids = c["prompt_ids"].get<std::vector<int>>();
  for (int id : c["greedy_ids"]) ids.push_back(id);
  const auto ref = c["logits"].get<std::vector<std::vector<float>>>();
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  for (int64_t block_size : {1, 8, 16, 32}) {
    SequenceRunner runner(*model_, static_cast<int64_t>(ids.size()), block_size);
    size_t pos = 0;
    double worst = 0;
    for (size_t chunk : {7u, 1u, 20u, 3u, 1000u}) {
      const size_t n = std::min(chunk, ids.size() - pos);
      if (n == 0) break;
      const std::vector<float> logits =
          runner.Feed(std::span<const int>(ids).subspan(pos, n), /*all_logits=*/true);
      for (size_t t = 0; t < n; ++t) {
        worst = std::max(worst, RelativeError({logits.data() + t * vocab, vocab}, ref[pos + t]));
      }
      pos += n;
    }
    EXPECT_EQ(pos, ids.size());
    EXPECT_LE(worst, 1e-4) << "block size " << block_size;
  }
}

// The user path: Generate() with greedy sampling streams the same tokens and text.
TEST_F(Stories260K, GenerateStreamsTheGreedyText) {
  const json& c = Reference()["cases"][0];
  GenerateOptions options;
  options.max_tokens = 64;
  options.sampling.temperature = 0;
  options.ignore_eos = true;
  std::string streamed;
  GenerateResult r = Generate(*model_, *tokenizer_, c["prompt"].get<std::string>(), options,
                              [&](std::string_view d) { streamed += d; });
  EXPECT_EQ(r.output_ids, c["greedy_ids"].get<std::vector<int>>());
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, c["greedy_text"].get<std::string>());
  EXPECT_EQ(r.finish_reason, "length");
}

// bf16 weights (half the bytes): same greedy start, logits within bf16 tolerance.
TEST(Stories260KBf16, LogitsCloseAndGreedyPrefixEqual) {
  LoadOptions options;
  options.weight_dtype = DType::kBF16;
  auto model = CpuModel::Load(ModelDir(), options);
  const json& c = Reference()["cases"][0];
  std::vector<int> ids = c["prompt_ids"].get<std::vector<int>>();
  SequenceRunner runner(*model, 64);
  std::vector<float> logits = runner.Feed(ids);
  const auto ref = c["logits"].get<std::vector<std::vector<float>>>();
  EXPECT_LE(RelativeError(logits, ref[ids.size() - 1]), 3e-2);
  const std::vector<int> want = c["greedy_ids"].get<std::vector<int>>();
  std::vector<int> got;
  for (int step = 0; step < 8; ++step) {
    got.push_back(Argmax(logits));
    const int next[1] = {got.back()};
    logits = runner.Feed(next);
  }
  EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + 8));
}

// FP8 weights (--quantization fp8: the linear layers as e4m3 with per-row scales, a quarter of
// the f32 bytes). stories260K is a hard case for 3 mantissa bits (hidden size 64: little
// averaging); the measured error is the bounds' basis: 4.5e-2 of max|logit| at the last
// prompt position (bf16 weights: < 3e-2), 16 of 16 greedy tokens equal (23 of 64 before the
// first divergence), measured 2026-11-30 on the dev VM.
TEST(Stories260KFp8, LogitsCloseToTheReference) {
  LoadOptions options;
  options.fp8_weights = true;
  auto model = CpuModel::Load(ModelDir(), options);
  EXPECT_TRUE(model->fp8_weights());
  EXPECT_NE(model->WeightsDescription().find("F8_E4M3"), std::string::npos);
  // A quarter of the linear layers' f32 bytes (+ one scale per row); lm_head (tied) stays.
  auto f32 = CpuModel::Load(ModelDir());
  EXPECT_LT(model->weight_bytes_per_token(), f32->weight_bytes_per_token());
  const json& c = Reference()["cases"][0];
  const std::vector<int> ids = c["prompt_ids"].get<std::vector<int>>();
  const auto ref = c["logits"].get<std::vector<std::vector<float>>>();
  SequenceRunner runner(*model, 64);
  const std::vector<float> logits = runner.Feed(ids);
  const double err = RelativeError(logits, ref[ids.size() - 1]);
  // Greedy continuation against the f32 reference's: tokens equal before the first divergence.
  const std::vector<int> want = c["greedy_ids"].get<std::vector<int>>();
  std::vector<float> l = logits;
  size_t agree = 0;
  for (; agree < 16; ++agree) {
    if (Argmax(l) != want[agree]) break;
    const int next[1] = {want[agree]};
    l = runner.Feed(next);
  }
  std::printf(
      "  stories260K fp8 weights: last-position logits %.3e of max|ref|; greedy %zu of "
      "the first 16 tokens before the first divergence\n",
      err, agree);
  EXPECT_LE(err, 8e-2);
  EXPECT_GE(agree, 4u);
}

// int8 weights (--quantization int8: per-row int8 codes on the CPU's integer dot products,
// activations quantized per block of 32): the last prompt position's logits against the f32
// reference, and the greedy continuation teacher-forced on the reference's 64 tokens (how many
// agree, and how many before the first divergence), both reported; bounds from the measured
// values (2026-12-04, dev VM) with a margin, tighter than fp8's.
TEST(Stories260KInt8, LogitsCloseAndGreedyAgreesWithF32) {
  LoadOptions options;
  options.int8_weights = true;
  auto model = CpuModel::Load(ModelDir(), options);
  EXPECT_TRUE(model->int8_weights());
  EXPECT_NE(model->WeightsDescription().find("I8"), std::string::npos);
  auto f32 = CpuModel::Load(ModelDir());
  EXPECT_LT(model->weight_bytes_per_token(), f32->weight_bytes_per_token());
  const json& c = Reference()["cases"][0];
  const std::vector<int> ids = c["prompt_ids"].get<std::vector<int>>();
  const auto ref = c["logits"].get<std::vector<std::vector<float>>>();
  SequenceRunner runner(*model, 128);
  std::vector<float> l = runner.Feed(ids);
  const double err = RelativeError(l, ref[ids.size() - 1]);
  const std::vector<int> want = c["greedy_ids"].get<std::vector<int>>();
  size_t agree = 0, before = 0;
  bool diverged = false;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = Argmax(l) == want[i];
    agree += same;
    diverged = diverged || !same;
    before += !diverged;
    const int next[1] = {want[i]};
    l = runner.Feed(next);
  }
  std::printf(
      "  stories260K int8 weights: last-position logits %.3e of max|ref|; greedy %zu of %zu "
      "tokens equal (teacher-forced), %zu before the first divergence\n",
      err, agree, want.size(), before);
  EXPECT_LE(err, 4e-2);
  EXPECT_GE(agree * 10, want.size() * 9);
}

// A weight that cannot be scaled is a start-up error naming the file and the tensor.
TEST(Stories260KFp8, NonFiniteWeightNamesTheTensor) {
  test::TempDir dir;
  std::filesystem::copy_file(std::filesystem::path(ModelDir()) / "config.json",
                             dir.path() / "config.json");
  auto ckpt = Checkpoint::Open(ModelDir());
  std::vector<TensorData> tensors;
  const std::string bad = "model.layers.1.mlp.up_proj.weight";
  for (const std::string& name : ckpt->names()) {
    const TensorView& t = ckpt->Get(name);
    TensorData d{name, t.dtype, t.shape, std::vector<std::byte>(t.data, t.data + t.num_bytes)};
    if (name == bad) {
      ASSERT_EQ(t.dtype, DType::kF32);
      const float inf = INFINITY;
      std::memcpy(d.bytes.data() + 4 * 17, &inf, 4);
    }
    tensors.push_back(std::move(d));
  }
  WriteSafetensors((dir.path() / "model.safetensors").string(), tensors);
  LoadOptions options;
  options.fp8_weights = true;
  try {
    CpuModel::Load(dir.path().string(), options);
    FAIL() << "expected llm::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(CpuModel::Load(dir.path().string()));  // unquantized, it loads
}

TEST(ModelLoad, MissingFolderIsAClearError) {
  try {
    CpuModel::Load("/nonexistent/model");
    FAIL() << "expected llm::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model"), std::string::npos) << e.what();
  }
}

TEST(ModelLoad, WrongShapeNamesTheTensor) {
  test::TempDir dir;
  // stories260K with a config that claims a bigger MLP: every mlp tensor mismatches.
  json config = json::parse(test::ReadFile(std::filesystem::path(ModelDir()) / "config.json"));
  config["intermediate_size"] = 173;
  test::WriteFile(dir.path() / "config.json", config.dump());
  std::filesystem::copy_file(std::filesystem::path(ModelDir()) / "model.safetensors",
                             dir.path() / "model.safetensors");
  try {
    CpuModel::Load(dir.path().string());
    FAIL() << "expected llm::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("mlp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  }
}

TEST_F(Stories260K, ContextOverflowIsAnError) {
  SequenceRunner runner(*model_, 4, /*block_size=*/2);
  const std::vector<int> ids = {1, 2, 3, 4, 5};
  EXPECT_THROW(runner.Feed(ids), Error);
  const std::vector<int> bad = {1, 100000};
  SequenceRunner runner2(*model_, 4);
  EXPECT_THROW(runner2.Feed(bad), Error);
}

}  // namespace
}  // namespace llm
