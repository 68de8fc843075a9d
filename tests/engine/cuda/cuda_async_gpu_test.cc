// Asynchronous scheduling on the CUDA backend (CudaExecutor::Launch / Wait, the device-side
// token feed of engine/cuda/cuda_executor.h): the engine with --async-scheduling gives the
// same tokens as without it, on stories260K (naive attention) and on the tiny random models
// hd128 / hd64 (the tuned kernels), with CUDA graphs and eagerly. The batches of both modes
// are the same, so the bf16 logits are too: greedy and seeded tokens must match exactly.
// Label gpu: skips with a message when no GPU is present.
//   ninja -C build cuda_async_gpu_test && (cd build && ctest -L gpu -R cuda_async)
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/cuda/cuda_executor.h"
#include "engine/engine.h"
#include "engine/loader/make_model.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockSize = 16;

class CudaAsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

// As in cuda_executor_gpu_test.cc: tests/data/tiny_models/<name>.json, seed 7.
std::string ModelDir(const std::string& name) {
  if (name == "stories260K") return test::StoriesDir();
  static test::TempDir dir;
  const fs::path out = dir.path() / name;
  if (!fs::exists(out / "model.safetensors")) {
    MakeModelOptions o;
    o.config_path =
        (test::SourceDir() / "tests" / "data" / "tiny_models" / (name + ".json")).string();
    o.out_dir = out.string();
    o.tokenizer_path = test::StoriesDir() + "/tokenizer.model";
    o.seed = 7;
    o.dtype = DType::kF32;
    MakeRandomModel(o);
  }
  return out.string();
}

CudaExecutorOptions Options(bool graphs, bool packed = false) {
  CudaExecutorOptions o;
  o.packed_step_inputs = packed;
  o.dtype = DType::kBF16;
  o.block_size = kBlockSize;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 16;
  o.num_kv_blocks = 256;
  o.cuda_graphs = graphs;
  o.log = false;
  return o;
}

struct EngineRun {
  std::vector<std::vector<int>> tokens;  // per request (n = 1)
  std::vector<std::vector<float>> logprobs;
  CudaExecutorStats stats;
  EngineStats engine;
};

// 12 requests of mixed prompt lengths and lengths: greedy, seeded, one with penalties (the
// synchronous fallback), one with top logprobs; all added at once.
std::vector<Request> Requests() {
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    for (int k = 0; k < 3 + 7 * i; ++k) r.prompt_ids.push_back(3 + (k * 37 + i * 11) % 500);
    r.sampling.max_tokens = 8 + 3 * i;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 3 == 1 ? 0.8 : 0.0;
    r.sampling.top_p = i % 3 == 1 ? 0.9 : 1.0;
    r.sampling.seed = static_cast<uint64_t>(100 + i);
    r.sampling.logprobs = i == 4 ? 3 : 0;
    if (i == 7) r.sampling.repetition_penalty = 1.2;
    out.push_back(std::move(r));
  }
  return out;
}

EngineRun RunEngine(const std::string& model, bool graphs, bool is_async, bool packed = false) {
  std::unique_ptr<CudaExecutor> ex = CudaExecutor::Create(ModelDir(model), Options(graphs, packed));
  CudaExecutor* raw = ex.get();
  EngineConfig cfg;
  cfg.block_size = kBlockSize;
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 512;
  cfg.batch_invariant = false;  // as the server runs the GPU: decode steps replay graphs
  cfg.async_scheduling = is_async;
  Engine engine(std::move(ex), test::StoriesTokenizer(), cfg);
  const std::vector<Request> requests = Requests();
  std::vector<std::shared_ptr<OutputChannel>> channels;
  for (const Request& r : requests) channels.push_back(engine.AddRequest(r));
  engine.RunUntilIdle();
  EngineRun run;
  run.tokens.resize(requests.size());
  run.logprobs.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    RequestOutput out;
    while (channels[i]->TryPop(&out)) {
      EXPECT_TRUE(out.error.empty()) << out.error;
      run.tokens[i].insert(run.tokens[i].end(), out.token_ids.begin(), out.token_ids.end());
      for (const OutputLogprob& lp : out.logprobs) run.logprobs[i].push_back(lp.logprob);
    }
  }
  run.stats = raw->stats();
  run.engine = engine.Stats();
  return run;
}

TEST_F(CudaAsyncTest, AsyncGivesTheSameTokensAsSync) {
  for (const char* model : {"stories260K", "hd128", "hd64"}) {
    for (const bool graphs : {true, false}) {
      const std::string what = std::string(model) + (graphs ? ", graphs" : ", eager");
      const EngineRun sync = RunEngine(model, graphs, false);
      const EngineRun async = RunEngine(model, graphs, true);
      // The step inputs in one packed copy + scatter (--packed-step-inputs), sync and async:
      // the same inputs on the device, so the same bits.
      const EngineRun packed_sync = RunEngine(model, graphs, false, true);
      const EngineRun packed = RunEngine(model, graphs, true, true);
      ASSERT_EQ(sync.tokens.size(), async.tokens.size());
      for (size_t i = 0; i < sync.tokens.size(); ++i) {
        EXPECT_EQ(async.tokens[i], sync.tokens[i]) << what << ", request " << i;
        EXPECT_EQ(async.logprobs[i], sync.logprobs[i]) << what << ", request " << i;
        EXPECT_EQ(packed.tokens[i], sync.tokens[i]) << what << ", packed, request " << i;
        EXPECT_EQ(packed.logprobs[i], sync.logprobs[i]) << what << ", packed, request " << i;
        EXPECT_EQ(packed_sync.tokens[i], sync.tokens[i]) << what << ", packed sync, request " << i;
        EXPECT_EQ(packed_sync.logprobs[i], sync.logprobs[i])
            << what << ", packed sync, request " << i;
        EXPECT_EQ(std::ssize(async.tokens[i]), 8 + 3 * int64_t(i)) << what;
      }
      EXPECT_EQ(async.stats.steps, sync.stats.steps) << what << ": the same batches";
      EXPECT_EQ(async.stats.packed_uploads, 0) << what;
      EXPECT_GE(packed.stats.packed_uploads, packed.stats.steps) << what << ": the packed path";
      EXPECT_GE(packed_sync.stats.packed_uploads, packed_sync.stats.steps) << what;
      if (graphs) {
        EXPECT_GT(async.stats.graph_steps, 0) << what;
      }
      EXPECT_GT(async.stats.device_ms, 0) << what;
      EXPECT_EQ(async.engine.num_free_kv_blocks, async.engine.num_kv_blocks) << what;
      std::printf(
          "[cuda async] %s: %lld steps (%lld graphs); device %.1f ms, executor host "
          "%.1f ms (sync: device %.1f ms, host %.1f ms)\n",
          what.c_str(), (long long)async.stats.steps, (long long)async.stats.graph_steps,
          async.stats.device_ms, async.stats.wall_ms, sync.stats.device_ms, sync.stats.wall_ms);
    }
  }
}

// The executor alone: step B's decode token is fed from step A's sampled id on the device
// (B launched before A is waited for); B's logits then equal those of a step given the id.
TEST_F(CudaAsyncTest, FedTokenEqualsTheTokenGivenOnTheHost) {
  for (const bool graphs : {true, false}) {
    for (const bool packed : {false, true}) {
      auto ex = CudaExecutor::Create(test::StoriesDir(), Options(graphs, packed));
      auto ref = CudaExecutor::Create(test::StoriesDir(), Options(graphs));
      SamplingParams greedy;
      greedy.temperature = 0;
      Sampler s1(greedy), s2(greedy), r1(greedy), r2(greedy);
      const std::vector<int> prompt = {1, 403, 407, 261, 378, 5, 9};
      const std::vector<int32_t> table = {0, 1};
      std::vector<int64_t> slots(prompt.size());
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t(i);
      ForwardBatch a;
      a.AddSequence(prompt, 0, table, slots, true, false);
      const int64_t pos = std::ssize(prompt);
      const std::vector<int64_t> next_slot = {pos};
      ForwardBatch b;
      const std::vector<int> unknown = {0};
      b.AddSequence(unknown, pos, table, next_slot, true, true);
      b.FeedLastTokenFromPreviousStep(0);
      const SampleTask ta[] = {{0, &s1}}, tb[] = {{0, &s2}};
      const StepHandle ha = ex->Launch(a, ta);
      const StepHandle hb = ex->Launch(b, tb);
      const std::vector<SampleResult> ra = ex->Wait(ha);
      const std::vector<SampleResult> rb = ex->Wait(hb);
      // The reference: synchronous, the token given on the host.
      const SampleTask qa[] = {{0, &r1}};
      const std::vector<SampleResult> sa = ref->ForwardAndSample(a, qa);
      ForwardBatch given;
      const std::vector<int> known = {sa[0].token};
      given.AddSequence(known, pos, table, next_slot, true, true);
      const SampleTask qb[] = {{0, &r2}};
      const std::vector<SampleResult> sb = ref->ForwardAndSample(given, qb);
      EXPECT_EQ(ra[0].token, sa[0].token) << graphs << packed;
      EXPECT_EQ(rb[0].token, sb[0].token) << graphs << packed;
      EXPECT_NE(sa[0].token, 0) << "the fed id is not the placeholder 0 by accident";
    }
  }
}

}  // namespace
}  // namespace llm
