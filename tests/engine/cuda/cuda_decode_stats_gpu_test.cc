// The CUDA executor's decode-only counters (CudaExecutorStats::decode_*, kv_bytes_per_token),
// which `llm bench` turns into the decode steps' memory floor (bench/e2e_report.py), driven
// through the engine as `llm bench` drives it: three requests of different prompt lengths and
// output lengths, all added at once, on the tiny hd128 shape with dummy weights. Label gpu:
// skips with a message when no GPU is present.
//
//  - Synchronous scheduling: one prefill step for the three prompts, then decode-only steps;
//    the counts are computed by hand from the prompt and output lengths (a decode step k of a
//    sequence with a P-token prompt reads P + k keys per layer).
//  - Every mode: the counts equal those of the steps the engine scheduled (a StepObserver
//    tallies the steps whose chunks are all decodes), also under async scheduling, where a
//    sequence may run one decode step past its end.
//  - fp8 KV halves kv_bytes_per_token; a sliding-window layer reads at most its window.
//   ninja -C build cuda_decode_stats_gpu_test && (cd build && ctest -L gpu -R cuda_decode_stats)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cuda/cuda_executor.h"
#include "engine/engine.h"
#include "engine/sched/scheduler.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockSize = 16;
constexpr int64_t kWindow = 24;  // the sliding case's window (crosses sequence 1's decodes)
const std::vector<int64_t> kPromptLens = {5, 17, 40};
const std::vector<int64_t> kOutputLens = {6, 9, 12};  // max_tokens, ignore_eos

struct DecodeCounts {
  int64_t num_steps = 0, num_seq_steps = 0, num_kv_tokens_read = 0;
};

// The keys one decode sequence reads per layer, averaged over the layers as the executor
// counts them: `num_sliding` of `num_layers` layers read at most kWindow.
int64_t KeysRead(int64_t keys, int64_t num_layers, int64_t num_sliding) {
  const int64_t layer_keys =
      (num_layers - num_sliding) * keys + num_sliding * std::min(keys, kWindow);
  return (layer_keys + num_layers / 2) / num_layers;
}

// Synchronous scheduling, by hand: every prompt prefills in step 0 (which samples the first
// token), then decode step k = 1, 2, ... feeds sequence i's token k after a context of
// P_i + k - 1 tokens while k < M_i.
DecodeCounts Expected(int64_t num_layers, int64_t num_sliding) {
  DecodeCounts c;
  c.num_steps = *std::max_element(kOutputLens.begin(), kOutputLens.end()) - 1;
  for (size_t i = 0; i < kPromptLens.size(); ++i) {
    for (int64_t k = 1; k < kOutputLens[i]; ++k) {
      ++c.num_seq_steps;
      c.num_kv_tokens_read += KeysRead(kPromptLens[i] + k, num_layers, num_sliding);
    }
  }
  return c;
}

// The decode-only steps among those the engine scheduled (context = the sequence's computed
// tokens before the step).
class DecodeTally : public StepObserver {
 public:
  DecodeTally(int64_t num_layers, int64_t num_sliding)
      : num_layers_(num_layers), num_sliding_(num_sliding) {}
  void OnScheduled(const SchedulerOutput& sched) override {
    if (sched.empty()) return;
    for (const ScheduledChunk& c : sched.chunks) {
      if (!c.is_decode) return;
    }
    ++counts.num_steps;
    for (const ScheduledChunk& c : sched.chunks) {
      ++counts.num_seq_steps;
      counts.num_kv_tokens_read +=
          KeysRead(c.seq->num_computed_tokens + 1, num_layers_, num_sliding_);
    }
  }
  DecodeCounts counts;

 private:
  int64_t num_layers_, num_sliding_;
};

struct StatsCase {
  const char* name;
  bool is_async = false;
  bool kv_fp8 = false;
  bool sliding = false;  // layer 0 slides (window kWindow), layer 1 is full
};

class CudaDecodeStats : public ::testing::TestWithParam<StatsCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(CudaDecodeStats, CountsTheDecodeOnlySteps) {
  const StatsCase& c = GetParam();
  const test::TempDir tmp;
  nlohmann::json shape =
      nlohmann::json::parse(test::ReadFile(test::SourceDir() / "tests" / "data" / "tiny_models" /
                                           "hd128.json"));  // 2 layers, 2 KV heads, head_dim 128
  if (c.sliding) {
    shape["sliding_window"] = kWindow;
    shape["layer_types"] = {"sliding_attention", "full_attention"};
  }
  const fs::path config_path = tmp.path() / "config.json";
  test::WriteFile(config_path, shape.dump(2));

  CudaExecutorOptions o;
  o.dtype = DType::kBF16;
  o.kv_cache_fp8 = c.kv_fp8;
  o.block_size = kBlockSize;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 16;
  o.num_kv_blocks = 256;
  o.dummy_weights = true;
  o.log = false;
  std::unique_ptr<CudaExecutor> ex = CudaExecutor::Create(config_path.string(), o);
  CudaExecutor* raw = ex.get();
  const ModelConfig& model = raw->config();
  const int64_t num_layers = model.num_layers;
  const int64_t num_sliding = c.sliding ? 1 : 0;
  ASSERT_EQ(model.SlidingWindowOf(0), c.sliding ? kWindow : 0);
  // K and V of one token, every layer: 2 × 2 KV heads × 128 × (2 bytes, fp8 1) × 2 layers.
  EXPECT_EQ(raw->stats().kv_bytes_per_token,
            2 * model.num_kv_heads * model.head_dim * (c.kv_fp8 ? 1 : 2) * num_layers);
  EXPECT_EQ(raw->stats().kv_bytes_per_token, c.kv_fp8 ? 1024 : 2048);

  DecodeTally tally(num_layers, num_sliding);
  EngineConfig cfg;
  cfg.block_size = kBlockSize;
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 512;
  cfg.batch_invariant = false;  // as the server runs the GPU: decode steps replay graphs
  cfg.async_scheduling = c.is_async;
  Engine engine(std::move(ex), test::StoriesTokenizer(), cfg, &tally);
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (size_t i = 0; i < kPromptLens.size(); ++i) {
    Request r;
    for (int64_t k = 0; k < kPromptLens[i]; ++k) {
      r.prompt_ids.push_back(int(3 + (k * 37 + int64_t(i) * 101) % 500));
    }
    r.sampling.max_tokens = int(kOutputLens[i]);
    r.sampling.ignore_eos = true;
    r.sampling.temperature = 0;
    channels.push_back(engine.AddRequest(std::move(r)));
  }
  engine.RunUntilIdle();
  for (size_t i = 0; i < channels.size(); ++i) {
    int64_t num_generated = 0;
    RequestOutput out;
    while (channels[i]->TryPop(&out)) {
      ASSERT_TRUE(out.error.empty()) << out.error;
      num_generated += std::ssize(out.token_ids);
    }
    ASSERT_EQ(num_generated, kOutputLens[i]) << "request " << i;
  }

  const CudaExecutorStats st = raw->stats();
  std::printf(
      "[decode stats] %s: %lld steps, %lld decode-only (%lld sequence steps, %lld keys read), "
      "device %.3f ms of which decode %.3f ms, kv_bytes_per_token %lld\n",
      c.name, (long long)st.steps, (long long)st.decode_steps, (long long)st.decode_seq_steps,
      (long long)st.decode_kv_tokens_read, st.device_ms, st.decode_device_ms,
      (long long)st.kv_bytes_per_token);
  // What the engine scheduled, every mode.
  EXPECT_EQ(st.decode_steps, tally.counts.num_steps);
  EXPECT_EQ(st.decode_seq_steps, tally.counts.num_seq_steps);
  EXPECT_EQ(st.decode_kv_tokens_read, tally.counts.num_kv_tokens_read);
  const DecodeCounts want = Expected(num_layers, num_sliding);
  if (!c.is_async) {
    // By hand: 11 decode steps of 3, 3, 3, 3, 3, 2, 2, 2, 1, 1, 1 sequences after one prefill.
    EXPECT_EQ(st.steps, want.num_steps + 1);
    EXPECT_EQ(st.decode_steps, want.num_steps);
    EXPECT_EQ(st.decode_seq_steps, want.num_seq_steps);
    EXPECT_EQ(st.decode_kv_tokens_read, want.num_kv_tokens_read);
    if (!c.sliding) {
      // 5 × 5 + 15, 8 × 17 + 36, 11 × 40 + 66: sum over k of (P + k).
      EXPECT_EQ(st.decode_kv_tokens_read, 718);
    }
  } else {
    // Async: a sequence may take one decode step past its last token (never emitted).
    EXPECT_GE(st.decode_steps, want.num_steps);
    EXPECT_LE(st.decode_steps, want.num_steps + 1);
    EXPECT_GE(st.decode_kv_tokens_read, want.num_kv_tokens_read);
  }
  EXPECT_GT(st.decode_device_ms, 0);
  EXPECT_LT(st.decode_device_ms, st.device_ms) << "the prefill step is not a decode-only step";

  raw->ResetStats();
  const CudaExecutorStats reset = raw->stats();
  EXPECT_EQ(reset.decode_steps, 0);
  EXPECT_EQ(reset.decode_seq_steps, 0);
  EXPECT_EQ(reset.decode_kv_tokens_read, 0);
  EXPECT_EQ(reset.decode_device_ms, 0.0);
  EXPECT_EQ(reset.kv_bytes_per_token, st.kv_bytes_per_token);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaDecodeStats,
                         ::testing::Values(StatsCase{"sync"}, StatsCase{"async", true},
                                           StatsCase{"fp8_kv", false, true},
                                           StatsCase{"sliding", false, false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace llm
