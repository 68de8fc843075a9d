// `llm generate` and `llm make-model` as a user runs them (the built binary, real files).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "tests/test_util.h"

namespace llm {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `build/llm ARGS`, capturing stdout and stderr.
RunResult RunLlm(const std::string& args) {
  test::TempDir tmp;
  const auto err_path = tmp.path() / "stderr";
  const std::string cmd =
      (test::BuildDir() / "llm").string() + " " + args + " 2>" + err_path.string();
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = test::ReadFile(err_path);
  return r;
}

std::string Stories() { return (test::SharedDir() / "models" / "stories260K").string(); }

TEST(GenerateCli, GreedyStoriesOutput) {
  RunResult r = RunLlm("generate --model " + Stories() +
                       " --prompt 'Once upon a time' --temperature 0 --max-tokens 24");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stdout is only the generated text (the prompt is not echoed).
  EXPECT_EQ(r.out.rfind(", there was a little girl named Lily.", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
}

TEST(GenerateCli, SeedReproducesSampling) {
  const std::string args = "generate --model " + Stories() +
                           " --prompt 'The dog' --temperature 1.0 --top-p 0.9 --seed 7 "
                           "--max-tokens 30";
  RunResult a = RunLlm(args), b = RunLlm(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
}

TEST(GenerateCli, DefaultModelIsTheLabelledDemo) {
  RunResult r = RunLlm("generate --prompt 'hello' --max-tokens 8 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("DEMO MODEL"), std::string::npos) << r.err;
}

TEST(GenerateCli, BadModelFolderIsAClearError) {
  test::TempDir empty;
  RunResult r = RunLlm("generate --model " + empty.path().string() + " --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
}

TEST(GenerateCli, BadFlagsAreRejected) {
  EXPECT_NE(RunLlm("generate --model " + Stories() + " --prompt hi --top-p 0").exit_code, 0);
  EXPECT_NE(RunLlm("generate --model " + Stories() + " --prompt hi --max-tokens -3").exit_code, 0);
  EXPECT_NE(RunLlm("nonsense").exit_code, 0);
}

TEST(GenerateCli, TensorParallelismNeedsCudaAndAPositiveSize) {
  RunResult r = RunLlm("generate --device cpu --model " + Stories() +
                       " --prompt hi --tensor-parallel-size 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--tensor-parallel-size needs --device cuda"), std::string::npos) << r.err;
  EXPECT_NE(
      RunLlm("generate --model " + Stories() + " --prompt hi --tensor-parallel-size 0").exit_code,
      0);
}

TEST(GenerateCli, Fp8KvCacheRunsOnTheCpu) {
  RunResult r = RunLlm("generate --device cpu --model " + Stories() +
                       " --prompt 'Once upon a time' --temperature 0 --max-tokens 16 "
                       "--kv-cache-dtype fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_NE(RunLlm("generate --model " + Stories() + " --prompt hi --kv-cache-dtype fp9").exit_code,
            0);
}

// --quantization fp8: the linear layers as FP8 weights, on the CPU path a user takes; the log
// says so; an unknown scheme is rejected, and so is --fp8-precise-accum where it means nothing
// (the CPU, or cuda without fp8; the CUDA path itself: cuda_executor_gpu_test).
TEST(GenerateCli, Fp8WeightsRunOnTheCpu) {
  RunResult r = RunLlm("generate --device cpu --model " + Stories() +
                       " --prompt 'Once upon a time' --temperature 0 --max-tokens 16 "
                       "--quantization fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_NE(r.err.find("F8_E4M3 (linear layers"), std::string::npos) << r.err;
  EXPECT_NE(RunLlm("generate --model " + Stories() + " --prompt hi --quantization int4").exit_code,
            0);
  RunResult precise = RunLlm("generate --device cpu --model " + Stories() +
                             " --prompt hi --max-tokens 2 --quantization fp8 --fp8-precise-accum");
  EXPECT_NE(precise.exit_code, 0);
  EXPECT_NE(precise.err.find("--fp8-precise-accum"), std::string::npos) << precise.err;
}

TEST(MakeModelCli, WritesALoadableCheckpoint) {
  test::TempDir dir;
  const std::string config = (test::SourceDir() / "engine/configs/demo.json").string();
  RunResult made = RunLlm("make-model --config " + config + " --out " + dir.path().string() +
                          " --seed 3 --dtype bf16");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.model", "tokenizer_config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.path() / f)) << f;
  }
  RunResult gen = RunLlm("generate --model " + dir.path().string() +
                         " --prompt 'x' --max-tokens 5 --temperature 0 --ignore-eos");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_NE(gen.err.find("BF16"), std::string::npos) << gen.err;
  // Deterministic in the seed: the same seed writes the same bytes.
  test::TempDir dir2;
  RunLlm("make-model --config " + config + " --out " + dir2.path().string() +
         " --seed 3 --dtype bf16");
  EXPECT_EQ(test::ReadFile(dir.path() / "model.safetensors"),
            test::ReadFile(dir2.path() / "model.safetensors"));
}

}  // namespace
}  // namespace llm
