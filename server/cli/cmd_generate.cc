// `llm generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K]
//               [--top-p P] [--seed S] [--dtype auto|f32|bf16|f16] [--threads N]
//               [--device cpu|cuda|auto] [--load-format auto|dummy] ...`
// Prints only the generated text to stdout, streamed as it is produced; a summary with
// tokens/s goes to stderr. On the CPU one sequence runs through SequenceRunner (the reference
// path); on the GPU the request runs through the engine (the server's path).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/generator.h"
#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/cli/backend.h"
#include "server/cli/commands.h"

namespace llm::cli {
namespace {

struct GenerateFlags {
  std::string model_dir = DefaultModelDir();
  std::string prompt;
  int max_tokens = 128;
  std::optional<double> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  BackendFlags backend;
  int threads = 0;
  bool ignore_eos = false;
};

// Sampling: flags, else generation_config.json (do_sample false = greedy), else T=1.
SamplingParams ResolveSampling(const GenerateFlags& f, const ModelConfig& config) {
  SamplingParams p;
  const GenerationDefaults& g = config.generation;
  p.temperature = g.do_sample.value_or(true) ? g.temperature.value_or(1.0) : 0.0;
  p.top_p = g.top_p.value_or(1.0);
  p.top_k = g.top_k.value_or(0);
  if (f.temperature) p.temperature = *f.temperature;
  if (f.top_p) p.top_p = *f.top_p;
  if (f.top_k) p.top_k = *f.top_k;
  p.seed = f.seed;
  return p;
}

void LogModel(const std::string& dir, const CpuModel& model) {
  const ModelConfig& c = model.config();
  std::ifstream notice(std::filesystem::path(dir) / "NOTICE");
  std::string line;
  if (notice && std::getline(notice, line)) std::fprintf(stderr, "[llm] %s\n", line.c_str());
  std::fprintf(stderr,
               "[llm] model %s: %s, %lld layers, hidden %lld, heads %lld/%lld kv, vocab %lld, "
               "weights %s, %.1f MB per token, %d threads\n",
               dir.c_str(), c.architecture.c_str(), (long long)c.num_layers,
               (long long)c.hidden_size, (long long)c.num_heads, (long long)c.num_kv_heads,
               (long long)c.vocab_size, model.WeightsDescription().c_str(),
               model.weight_bytes_per_token() / 1e6, omp_get_max_threads());
}

// The GPU path: one request through the engine, streamed as the engine steps.
int RunGenerateOnEngine(const GenerateFlags& f, Backend backend, EngineConfig engine_config) {
  using Clock = std::chrono::steady_clock;
  auto tokenizer = Tokenizer::Load(f.model_dir);
  const ModelConfig config = backend.executor->config();
  std::fprintf(stderr, "[llm] model %s on %s\n", f.model_dir.c_str(),
               backend.executor->Describe().c_str());
  Engine engine(std::move(backend.executor), *tokenizer, engine_config);
  Request r;
  r.prompt_ids = tokenizer->EncodePrompt(f.prompt);
  r.sampling = ResolveSampling(f, config);
  r.sampling.max_tokens = std::max(f.max_tokens, 1);
  r.sampling.ignore_eos = f.ignore_eos;
  const auto start = Clock::now();
  auto channel = engine.AddRequest(r);
  RequestOutput out;
  std::string finish = "length";
  int64_t generated = 0;
  double first = 0;
  while (true) {
    engine.Step();
    bool last = false;
    while (channel->TryPop(&out)) {
      if (generated == 0 && !out.token_ids.empty())
        first = std::chrono::duration<double>(Clock::now() - start).count();
      generated += std::ssize(out.token_ids);
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
      if (!out.error.empty()) throw Error(out.error);
      if (out.finish_reason != FinishReason::kNone) finish = FinishReasonName(out.finish_reason);
      last = last || out.is_last;
    }
    if (last) break;
  }
  std::fputc('\n', stdout);
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  std::fprintf(stderr,
               "[llm] prompt %zu tokens, first token after %.3f s; generated %lld tokens, "
               "decode %.2f tok/s; finish_reason=%s\n",
               r.prompt_ids.size(), first, (long long)generated,
               generated > 1 ? double(generated - 1) / (total - first) : 0.0, finish.c_str());
  return 0;
}

int RunGenerate(GenerateFlags f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  if (f.backend.device == "cuda" || (f.backend.device == "auto" && CudaDevicePresent())) {
    EngineConfig probe;
    probe.max_num_seqs = 1;
    probe.max_num_batched_tokens = 2048;
    Backend backend = MakeBackend(f.model_dir, f.backend, &probe);
    if (backend.device == "cuda") return RunGenerateOnEngine(f, std::move(backend), probe);
  }
  CheckCpuFlags(f.backend);
  auto model = CpuModel::Load(f.model_dir, CpuLoadOptions(f.backend));
  auto tokenizer = Tokenizer::Load(f.model_dir);
  LogModel(f.model_dir, *model);
  GenerateOptions options;
  options.max_tokens = f.max_tokens;
  options.sampling = ResolveSampling(f, model->config());
  options.ignore_eos = f.ignore_eos;
  options.kv_cache_dtype = ParseKvCacheDType(f.backend.kv_cache_dtype);
  if (const std::string problem = options.sampling.Validate(); !problem.empty()) {
    throw Error(problem);
  }
  GenerateResult r = Generate(*model, *tokenizer, f.prompt, options, [](std::string_view d) {
    std::fwrite(d.data(), 1, d.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  const size_t n = r.output_ids.size();
  const double decode_tps = n > 1 ? (n - 1) / r.decode_seconds : 0.0;
  std::fprintf(stderr,
               "[llm] prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu tokens, "
               "decode %.2f tok/s; finish_reason=%s\n",
               r.prompt_ids.size(), r.prefill_seconds, r.prompt_ids.size() / r.prefill_seconds, n,
               decode_tps, r.finish_reason.c_str());
  return 0;
}

}  // namespace

Command AddGenerate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt (streams to stdout)");
  auto f = std::make_shared<GenerateFlags>();
  cmd->add_option("--model", f->model_dir, "Hugging Face model folder")->capture_default_str();
  cmd->add_option("--prompt", f->prompt, "prompt text")->required();
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", f->temperature, "0 = greedy (default: generation_config)");
  cmd->add_option("--top-k", f->top_k, "sample from the k most likely tokens (0 = all)");
  cmd->add_option("--top-p", f->top_p, "nucleus sampling mass in (0, 1]");
  cmd->add_option("--seed", f->seed, "random seed (same seed, same output)");
  f->backend.AddTo(cmd);
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-sequence");
  return [f] { return RunGenerate(*f); };
}

}  // namespace llm::cli
