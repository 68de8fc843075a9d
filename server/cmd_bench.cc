// `llm bench`: offline throughput, like nano-vllm's bench.py: N requests with random prompt
// and output lengths (fixed seed, random token ids, ignore_eos) submitted at once to the
// continuous-batching engine; reports requests/s and prompt / generated tokens/s.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "engine/engine.h"
#include "engine/llama_model.h"
#include "engine/tokenizer.h"
#include "server/commands.h"

namespace llm::cli {
namespace {

struct BenchFlags {
  std::string model_dir = DefaultModelDir();
  int num_requests = 64;
  int min_input = 16, max_input = 256;
  int min_output = 16, max_output = 128;
  uint64_t seed = 0;
  int64_t max_num_seqs = 64, max_num_batched_tokens = 2048;
  int64_t kv_cache_mb = 1024;
  std::string dtype = "auto";
  int threads = 0;
};

int RunBench(const BenchFlags& f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  LoadOptions load;
  if (f.dtype == "f32") load.weight_dtype = DType::kF32;
  if (f.dtype == "bf16") load.weight_dtype = DType::kBF16;
  auto model = LlamaModel::Load(f.model_dir, load);
  auto tokenizer = Tokenizer::Load(f.model_dir);
  EngineConfig config;
  config.kv_cache_bytes = f.kv_cache_mb << 20;
  config.max_num_seqs = f.max_num_seqs;
  config.max_num_batched_tokens = f.max_num_batched_tokens;
  Engine engine(*model, *tokenizer, config);
  std::mt19937_64 rng(f.seed);
  auto uni = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  const int vocab = static_cast<int>(model->config().vocab_size);
  std::vector<std::shared_ptr<OutputChannel>> channels;
  int64_t prompt_tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < f.num_requests; ++i) {
    Request r;
    for (int k = uni(f.min_input, f.max_input); k > 0; --k)
      r.prompt_ids.push_back(uni(3, vocab - 1));
    r.sampling.temperature = 0.6;
    r.sampling.seed = f.seed + static_cast<uint64_t>(i);
    r.sampling.max_tokens = uni(f.min_output, f.max_output);
    r.sampling.ignore_eos = true;
    prompt_tokens += std::ssize(r.prompt_ids);
    channels.push_back(engine.AddRequest(std::move(r)));
  }
  engine.RunUntilIdle();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t generated = 0;
  for (auto& ch : channels) {
    RequestOutput out;
    while (ch->TryPop(&out)) {
      if (out.is_last) generated += out.usage.completion_tokens;
    }
  }
  const EngineStats s = engine.Stats();
  std::printf(
      "{\"model\": \"%s\", \"requests\": %d, \"seconds\": %.3f, \"requests_per_s\": %.3f, "
      "\"prompt_tokens\": %lld, \"generated_tokens\": %lld, \"prompt_tokens_per_s\": %.1f, "
      "\"generated_tokens_per_s\": %.1f, \"total_tokens_per_s\": %.1f, \"steps\": %lld, "
      "\"preemptions\": %lld, \"threads\": %d}\n",
      f.model_dir.c_str(), f.num_requests, seconds, f.num_requests / seconds,
      (long long)prompt_tokens, (long long)generated, prompt_tokens / seconds, generated / seconds,
      (prompt_tokens + generated) / seconds, (long long)s.num_steps, (long long)s.num_preemptions,
      omp_get_max_threads());
  return 0;
}

}  // namespace

Command AddBench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "offline throughput of the continuous-batching engine");
  auto f = std::make_shared<BenchFlags>();
  cmd->add_option("--model", f->model_dir, "Hugging Face model folder")->capture_default_str();
  cmd->add_option("--num-requests", f->num_requests)
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--min-input", f->min_input)->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-input", f->max_input)->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--min-output", f->min_output)->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-output", f->max_output)->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seed", f->seed)->capture_default_str();
  cmd->add_option("--max-num-seqs", f->max_num_seqs)->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->max_num_batched_tokens)->capture_default_str();
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb, "KV cache size")->capture_default_str();
  cmd->add_option("--dtype", f->dtype)->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)");
  return [f] { return RunBench(*f); };
}

}  // namespace llm::cli
