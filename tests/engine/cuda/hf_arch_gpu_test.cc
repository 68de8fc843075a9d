// Today's architectures on the CUDA backend against Hugging Face transformers itself
// (../shared/models/hf-arch: tiny checkpoints written by transformers, with its fp32 logits
// and greedy continuations; PROVENANCE.md there). Label gpu: skips without a GPU.
//
//  - Logits of every prompt position (a prefill chunk, then decode steps replayed as CUDA
//    graphs; small steps on the GEMV kernels or on cuBLASLt), bf16 and fp16: within twice the
//    model's own bf16-vs-fp32 difference (reference.json's bf16_vs_fp32_max_abs) of
//    transformers' fp32 logits.
//  - The greedy continuation, teacher-forced: at each of its 32 steps the GPU's argmax is
//    transformers' token, except where the fp32 logits (the CPU backend's, which equal
//    transformers' within 1e-4: tests/engine/cpu/hf_arch_test.cc) have a near-tie within that
//    tolerance; agreement is printed.
//  - fp8 weights (W8A8) and the fp8 KV cache against the CPU backend's fp8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sequence_runner.h"
#include "engine/cuda/cuda_executor.h"
#include "tests/engine/cuda/cuda_test_fixture.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ArchCase {
  const char* folder;
  DType dtype;
  bool gemv;  // small steps on the GEMV kernels (else cuBLASLt)
};

std::string ArchCaseName(const ::testing::TestParamInfo<ArchCase>& info) {
  return std::string(info.param.folder) + (info.param.dtype == DType::kBF16 ? "_bf16" : "_fp16") +
         (info.param.gemv ? "_gemv" : "_cublaslt");
}

class CudaHfArch : public test::CudaExecutorTest, public ::testing::WithParamInterface<ArchCase> {};

TEST_P(CudaHfArch, LogitsWithinHalfPrecisionToleranceAndGreedyAgrees) {
  const ArchCase& c = GetParam();
  const std::string dir = (test::SharedDir() / "models" / "hf-arch" / c.folder).string();
  const json ref = json::parse(test::ReadFile(fs::path(dir) / "reference.json"));
  CudaExecutorOptions o = test::SmallOptions(c.dtype);
  o.gemv_max_tokens = c.gemv ? 8 : 0;
  auto ex = CudaExecutor::Create(dir, o);
  LoadOptions lo;
  lo.weight_dtype = DType::kF32;
  const auto cpu = CpuModel::Load(dir, lo);
  const int64_t vocab = cpu->config().vocab_size;
  for (const json& p : ref["prompts"]) {
    const std::vector<int> prompt = p["ids"].get<std::vector<int>>();
    const std::vector<int> greedy = p["greedy_32"].get<std::vector<int>>();
    std::vector<int> ids = prompt;
    ids.insert(ids.end(), greedy.begin(), greedy.end() - 1);
    const double tol = 2 * p["bf16_vs_fp32_max_abs"].get<double>();
    // A prefill chunk of 10 tokens, then decode steps: both cross the 16-token blocks.
    const std::vector<float> got = test::AllLogits(*ex, ids, 10);
    SequenceRunner run(*cpu, std::ssize(ids) + 1);
    const std::vector<float> fp32 = run.Feed(ids, /*all_logits=*/true);
    ASSERT_EQ(got.size(), fp32.size());
    double max_diff = 0;
    const json& want = p["logits_fp32"];
    for (size_t r = 0; r < prompt.size(); ++r) {
      for (int64_t v = 0; v < vocab; ++v) {
        const double g = got[r * size_t(vocab) + size_t(v)];
        ASSERT_TRUE(std::isfinite(g)) << "row " << r;
        max_diff = std::max(max_diff, std::fabs(g - want[r][size_t(v)].get<double>()));
      }
    }
    int agree = 0, near_ties = 0;
    for (size_t step = 0; step < greedy.size(); ++step) {
      const size_t row = prompt.size() - 1 + step;
      const float* g = got.data() + row * size_t(vocab);
      const float* f = fp32.data() + row * size_t(vocab);
      const int mine = int(std::max_element(g, g + vocab) - g);
      if (mine == greedy[step]) {
        ++agree;
        continue;
      }
      // A disagreement must be a near-tie of the fp32 logits.
      EXPECT_LE(f[greedy[step]] - f[mine], tol)
          << c.folder << " step " << step << ": GPU " << mine << ", transformers " << greedy[step];
      ++near_ties;
    }
    std::printf(
        "  %s %s %s, %zu tokens: max |gpu - hf fp32| %.4f (bound %.4f), greedy %d/32 "
        "(%d near-ties)\n",
        c.folder, c.dtype == DType::kBF16 ? "bf16" : "fp16", c.gemv ? "gemv" : "cublaslt",
        prompt.size(), max_diff, tol, agree, near_ties);
    EXPECT_LE(max_diff, tol);
  }
  EXPECT_GT(ex->stats().graph_steps, 0) << "decode steps should replay CUDA graphs";
}

// --quantization fp8 (W8A8) and --kv-cache-dtype fp8 on each architecture that has an fp8 path
// (Gemma 3's is refused by name: cuda_executor_gpu_test): every prompt position against the
// CPU backend with the same fp8 weights and cache, within twice the model's bf16-vs-fp32
// difference plus twice what fp8 itself costs on the CPU (the bound of the fp8 tests in
// cuda_executor_gpu_test).
TEST_P(CudaHfArch, Fp8WeightsAndCacheMatchTheCpuFp8) {
  const ArchCase& c = GetParam();
  if (std::string(c.folder) == "gemma3") GTEST_SKIP() << "Gemma 3 has no fp8 path on CUDA yet";
  const std::string dir = (test::SharedDir() / "models" / "hf-arch" / c.folder).string();
  const json ref = json::parse(test::ReadFile(fs::path(dir) / "reference.json"));
  const std::vector<int> ids = ref["prompts"][0]["ids"].get<std::vector<int>>();
  auto cpu_logits = [&](bool fp8) {
    LoadOptions lo;
    lo.weight_dtype = DType::kF32;
    lo.fp8_weights = fp8;
    const auto m = CpuModel::Load(dir, lo);
    SequenceRunner run(*m, std::ssize(ids) + 1, 16,
                       fp8 ? KvCacheDType::kFp8E4m3 : KvCacheDType::kF32);
    return run.Feed(ids, /*all_logits=*/true);
  };
  const std::vector<float> f32 = cpu_logits(false), fp8 = cpu_logits(true);
  CudaExecutorOptions o = test::SmallOptions(c.dtype);
  o.gemv_max_tokens = c.gemv ? 8 : 0;
  o.fp8_weights = true;
  o.kv_cache_fp8 = true;
  auto ex = CudaExecutor::Create(dir, o);
  const std::vector<float> got = test::AllLogits(*ex, ids, 10);
  ASSERT_EQ(got.size(), fp8.size());
  double diff = 0, cost = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    diff = std::max(diff, std::fabs(double(got[i]) - fp8[i]));
    cost = std::max(cost, std::fabs(double(fp8[i]) - f32[i]));
  }
  const double bound = 2 * ref["prompts"][0]["bf16_vs_fp32_max_abs"].get<double>() + 2 * cost;
  std::printf(
      "  %s %s %s fp8 weights + KV: max |gpu - cpu fp8| %.4f (bound %.4f; cpu fp8 - "
      "fp32 %.4f)\n",
      c.folder, c.dtype == DType::kBF16 ? "bf16" : "fp16", c.gemv ? "gemv" : "cublaslt", diff,
      bound, cost);
  EXPECT_LE(diff, bound);
}

std::vector<ArchCase> ArchCases() {
  std::vector<ArchCase> cases;
  for (const char* folder : {"qwen2", "qwen3", "phi3", "llama31", "mistral_sw16", "gemma3"}) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      for (bool gemv : {false, true}) cases.push_back({folder, t, gemv});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Folders, CudaHfArch, ::testing::ValuesIn(ArchCases()), ArchCaseName);

}  // namespace
}  // namespace llm
