// `llm generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K]
//               [--top-p P] [--seed S] [--dtype auto|f32|bf16|f16] [--threads N]`
// Prints only the generated text to stdout, streamed as it is produced; a summary with
// tokens/s goes to stderr.
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "engine/error.h"
#include "engine/generator.h"
#include "engine/llama_model.h"
#include "engine/tokenizer.h"
#include "server/commands.h"

namespace llm::cli {
namespace {

struct GenerateFlags {
  std::string model_dir = DefaultModelDir();
  std::string prompt;
  int max_tokens = 128;
  std::optional<double> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::string dtype = "auto";
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

void LogModel(const std::string& dir, const LlamaModel& model) {
  const ModelConfig& c = model.config();
  std::ifstream notice(std::filesystem::path(dir) / "NOTICE");
  std::string line;
  if (notice && std::getline(notice, line)) std::fprintf(stderr, "[llm] %s\n", line.c_str());
  std::fprintf(stderr,
               "[llm] model %s: %s, %lld layers, hidden %lld, heads %lld/%lld kv, vocab %lld, "
               "weights %s, %.1f MB per token, %d threads\n",
               dir.c_str(), c.architecture.c_str(), (long long)c.num_layers,
               (long long)c.hidden_size, (long long)c.num_heads, (long long)c.num_kv_heads,
               (long long)c.vocab_size, std::string(DTypeName(model.weight_dtype())).c_str(),
               model.weight_bytes_per_token() / 1e6, omp_get_max_threads());
}

int RunGenerate(const GenerateFlags& f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  LoadOptions load;
  if (f.dtype == "f32") load.weight_dtype = DType::kF32;
  if (f.dtype == "bf16") load.weight_dtype = DType::kBF16;
  if (f.dtype == "f16") load.weight_dtype = DType::kF16;
  auto model = LlamaModel::Load(f.model_dir, load);
  auto tokenizer = Tokenizer::Load(f.model_dir);
  LogModel(f.model_dir, *model);
  GenerateOptions options;
  options.max_tokens = f.max_tokens;
  options.sampling = ResolveSampling(f, model->config());
  options.ignore_eos = f.ignore_eos;
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
  cmd->add_option("--dtype", f->dtype, "weight dtype in memory (auto = as stored)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16"}))
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-sequence");
  return [f] { return RunGenerate(*f); };
}

}  // namespace llm::cli
