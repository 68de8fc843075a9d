// `llm bench`: offline throughput, like nano-vllm's bench.py: N requests with random prompt
// and output lengths (fixed seed, random token ids, ignore_eos) submitted at once to the
// continuous-batching engine; reports requests/s and prompt / generated tokens/s, time to
// first token and decode time per token (from the engine's own per-request timings), and on
// the GPU the device-busy fraction of the run (CUDA events around each step's device work).
// The same binary gives the end-to-end GPU benchmarks (scripts/gpu_e2e_bench.sh): batch-1
// latency (--num-requests 1), throughput, TTFT, and long context, with --load-format dummy.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/engine.h"
#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/cli/backend.h"
#include "server/cli/commands.h"

#if defined(LLM_HAS_CUDA)
#include "engine/cuda/cuda_executor.h"
#endif

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
  BackendFlags backend;
  std::string tokenizer_dir;  // default: the model folder (the demo model's with dummy weights)
  double temperature = 0.6;
  bool warmup = false;
  int threads = 0;
  std::string output_ids_path;  // each request's generated ids, one line per request
};

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p / 100.0 * double(v.size())))];
}

struct BenchDeviceStats {
  double device_ms = 0, wall_ms = 0;
  int64_t graph_steps = 0;
  int64_t fp8_prefill_copies = 0;
};

BenchDeviceStats DeviceStats(const Engine& engine) {
  BenchDeviceStats s;
#if defined(LLM_HAS_CUDA)
  if (const auto* cuda = dynamic_cast<const CudaExecutor*>(&engine.executor())) {
    const CudaExecutorStats st = cuda->stats();
    s = {st.device_ms, st.wall_ms, st.graph_steps, st.fp8_prefill_copies};
  }
#else
  (void)engine;
#endif
  return s;
}

int RunBench(const BenchFlags& f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  EngineConfig config;
  config.kv_cache_bytes = f.kv_cache_mb << 20;
  config.max_num_seqs = f.max_num_seqs;
  config.max_num_batched_tokens = f.max_num_batched_tokens;
  Backend backend = MakeBackend(f.model_dir, f.backend, &config);
  const std::string tok_dir = !f.tokenizer_dir.empty()           ? f.tokenizer_dir
                              : f.backend.load_format == "dummy" ? DefaultModelDir()
                                                                 : f.model_dir;
  auto tokenizer = Tokenizer::Load(tok_dir);
  const ModelConfig model_config = backend.executor->config();
  std::fprintf(stderr, "[llm] bench on %s\n", backend.executor->Describe().c_str());
  Engine engine(std::move(backend.executor), *tokenizer, config);
  std::mt19937_64 rng(f.seed);
  auto uni = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  const int vocab = static_cast<int>(model_config.vocab_size);
  std::vector<std::shared_ptr<OutputChannel>> channels;
  int64_t prompt_tokens = 0;
  if (f.warmup) {
    // One untimed request of the largest shape (other random tokens: no prefix-cache hits
    // later), so that lazily captured CUDA graphs and cuBLASLt plans exist before timing.
    std::mt19937_64 wrng(f.seed ^ 0x5eedull);
    Request r;
    for (int k = f.max_input; k > 0; --k)
      r.prompt_ids.push_back(std::uniform_int_distribution<int>(3, vocab - 1)(wrng));
    r.sampling.max_tokens = f.max_output;
    r.sampling.ignore_eos = true;
    engine.AddRequest(std::move(r));
    engine.RunUntilIdle();
  }
  const BenchDeviceStats before = DeviceStats(engine);
  (void)before;  // read only by the CUDA build
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < f.num_requests; ++i) {
    Request r;
    for (int k = uni(f.min_input, f.max_input); k > 0; --k)
      r.prompt_ids.push_back(uni(3, vocab - 1));
    r.sampling.temperature = f.temperature;
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
  std::vector<double> ttft_ms, tpot_ms;
  std::FILE* ids_file = nullptr;
  if (!f.output_ids_path.empty()) {
    ids_file = std::fopen(f.output_ids_path.c_str(), "w");
    if (ids_file == nullptr)
      throw llm::Error("cannot write --output-ids file " + f.output_ids_path);
  }
  for (auto& ch : channels) {
    RequestOutput out;
    std::string ids_line;
    while (ch->TryPop(&out)) {
      for (int id : out.token_ids) ids_line += std::to_string(id) + " ";
      if (!out.is_last) continue;
      if (ids_file != nullptr) std::fprintf(ids_file, "%s\n", ids_line.c_str());
      generated += out.usage.completion_tokens;
      ttft_ms.push_back(out.first_token_seconds * 1e3);
      if (out.usage.completion_tokens > 1) {
        tpot_ms.push_back((out.total_seconds - out.first_token_seconds) * 1e3 /
                          double(out.usage.completion_tokens - 1));
      }
    }
  }
  if (ids_file != nullptr) std::fclose(ids_file);
  const EngineStats s = engine.Stats();
  std::string device_json;
#if defined(LLM_HAS_CUDA)
  if (const auto* cuda = dynamic_cast<const CudaExecutor*>(&engine.executor())) {
    CudaExecutorStats st = cuda->stats();
    st.device_ms -= before.device_ms;
    st.wall_ms -= before.wall_ms;
    st.graph_steps -= before.graph_steps;
    char buf[1024];
    std::snprintf(buf, sizeof(buf),
                  ", \"device_ms\": %.1f, \"executor_wall_ms\": %.1f, \"gpu_busy_fraction\": %.4f, "
                  "\"graph_steps\": %lld, \"graphs_captured\": %lld, \"weight_bytes\": %lld, "
                  "\"kv_cache_bytes\": %lld, \"kv_cache_tokens\": %lld, "
                  "\"peak_device_bytes\": %lld, \"weight_bytes_per_token\": %lld, "
                  "\"tensor_parallel_size\": %d, \"kv_cache_dtype\": \"%s\", "
                  "\"quantization\": \"%s\", \"gemm_tuned_shapes\": %lld, "
                  "\"gemm_retuned_shapes\": %lld, \"fp8_prefill_copies\": %lld",
                  st.device_ms, st.wall_ms, st.device_ms / (seconds * 1e3),
                  (long long)st.graph_steps, (long long)st.graphs_captured,
                  (long long)st.weight_bytes, (long long)st.kv_cache_bytes,
                  (long long)engine.kv_capacity_tokens(), (long long)st.peak_device_bytes,
                  (long long)st.weight_bytes_per_token, f.backend.tensor_parallel_size,
                  f.backend.kv_cache_dtype.c_str(), f.backend.quantization.c_str(),
                  (long long)st.gemm_tuned_shapes, (long long)st.gemm_retuned_shapes,
                  (long long)(st.fp8_prefill_copies - before.fp8_prefill_copies));
    device_json = buf;
  }
#endif
  std::printf(
      "{\"model\": \"%s\", \"requests\": %d, \"seconds\": %.3f, \"requests_per_s\": %.3f, "
      "\"prompt_tokens\": %lld, \"generated_tokens\": %lld, \"prompt_tokens_per_s\": %.1f, "
      "\"generated_tokens_per_s\": %.1f, \"total_tokens_per_s\": %.1f, \"steps\": %lld, "
      "\"preemptions\": %lld, \"ttft_ms_mean\": %.3f, \"ttft_ms_p50\": %.3f, "
      "\"ttft_ms_p99\": %.3f, \"tpot_ms_mean\": %.4f, \"tpot_ms_p50\": %.4f, "
      "\"threads\": %d, \"async_scheduling\": %s%s}\n",
      f.model_dir.c_str(), f.num_requests, seconds, f.num_requests / seconds,
      (long long)prompt_tokens, (long long)generated, prompt_tokens / seconds, generated / seconds,
      (prompt_tokens + generated) / seconds, (long long)s.num_steps, (long long)s.num_preemptions,
      Mean(ttft_ms), Percentile(ttft_ms, 50), Percentile(ttft_ms, 99), Mean(tpot_ms),
      Percentile(tpot_ms, 50), omp_get_max_threads(),
      engine.config().async_scheduling ? "true" : "false", device_json.c_str());
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
  f->backend.AddTo(cmd);
  cmd->add_option("--tokenizer", f->tokenizer_dir, "folder with tokenizer.model (default: model)");
  cmd->add_option("--temperature", f->temperature)->capture_default_str();
  cmd->add_flag("--warmup", f->warmup, "run one untimed request of the largest shape first");
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)");
  cmd->add_option("--output-ids", f->output_ids_path,
                  "write each request's generated token ids to this file, one line per request "
                  "(compares the tokens of two builds)");
  return [f] { return RunBench(*f); };
}

}  // namespace llm::cli
