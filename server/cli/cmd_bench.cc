// `llm bench`: offline throughput, like nano-vllm's bench.py: N requests with random prompt
// and output lengths (fixed seed, random token ids, ignore_eos) submitted at once to the
// continuous-batching engine; reports requests/s and prompt / generated tokens/s, time to
// first token and decode time per token (from the engine's own per-request timings), and on
// the GPU the device-busy fraction of the run (CUDA events around each step's device work)
// and its decode-only steps' device time, mean batch and the bytes they read (DecodeJson).
// The same binary gives the end-to-end GPU benchmarks (scripts/gpu_e2e_bench.sh): batch-1
// latency (--num-requests 1), throughput, TTFT, and long context, with --load-format dummy.
// --json-schema: structured outputs against the same requests unconstrained
// (scripts/gpu_structured_bench.sh).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/engine.h"
#include "engine/error.h"
#include "engine/grammar/compiler.h"
#include "engine/grammar/matcher.h"
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
  EngineConfig engine;  // --max-num-seqs, --max-num-batched-tokens, --kv-reserve-*
  int64_t kv_cache_mb = 1024;
  BackendFlags backend;
  std::string tokenizer_dir;  // default: the model folder (the demo model's with dummy weights)
  double temperature = 0.6;
  bool warmup = false;
  int threads = 0;
  std::string output_ids_path;   // each request's generated ids, one line per request
  std::string json_schema_path;  // a JSON schema, or an array of them: constrained requests
  bool warm_grammars = false;    // an untimed constrained pass first (the grammars' mask caches)
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
  int64_t decode_overlap_steps = 0;  // --decode-overlap: steps run as two halves
  double mask_ms = 0;                // host time computing structured-output masks
  int64_t mask_rows = 0;
  // Decode-only steps (CudaExecutorStats::decode_*).
  int64_t decode_steps = 0, decode_seq_steps = 0, decode_kv_tokens_read = 0;
  double decode_device_ms = 0;
  // Constants of the executor (not differenced).
  int64_t weight_bytes_per_token = 0, kv_bytes_per_token = 0;
};

BenchDeviceStats DeviceStats(const Engine& engine) {
  BenchDeviceStats s;
#if defined(LLM_HAS_CUDA)
  if (const auto* cuda = dynamic_cast<const CudaExecutor*>(&engine.executor())) {
    const CudaExecutorStats st = cuda->stats();
    s.device_ms = st.device_ms;
    s.wall_ms = st.wall_ms;
    s.graph_steps = st.graph_steps;
    s.fp8_prefill_copies = st.fp8_prefill_copies;
    s.decode_overlap_steps = st.decode_overlap_steps;
    s.mask_ms = st.mask_ms;
    s.mask_rows = st.mask_rows;
    s.decode_steps = st.decode_steps;
    s.decode_seq_steps = st.decode_seq_steps;
    s.decode_kv_tokens_read = st.decode_kv_tokens_read;
    s.decode_device_ms = st.decode_device_ms;
    s.weight_bytes_per_token = st.weight_bytes_per_token;
    s.kv_bytes_per_token = st.kv_bytes_per_token;
  }
#else
  (void)engine;
#endif
  return s;
}

// What the executor counted between `before` and `after`.
BenchDeviceStats Delta(const BenchDeviceStats& after, const BenchDeviceStats& before) {
  BenchDeviceStats d = after;
  d.device_ms -= before.device_ms;
  d.wall_ms -= before.wall_ms;
  d.graph_steps -= before.graph_steps;
  d.fp8_prefill_copies -= before.fp8_prefill_copies;
  d.decode_overlap_steps -= before.decode_overlap_steps;
  d.mask_ms -= before.mask_ms;
  d.mask_rows -= before.mask_rows;
  d.decode_steps -= before.decode_steps;
  d.decode_seq_steps -= before.decode_seq_steps;
  d.decode_kv_tokens_read -= before.decode_kv_tokens_read;
  d.decode_device_ms -= before.decode_device_ms;
  return d;
}

// The decode-only steps' numbers as JSON members, each after a ", ": what they read (weights
// once a step, the KV of every key they attend to; bench/e2e_report.py divides it by the
// measured copy bandwidth for their memory floor) and their mean time and batch (0 without
// any).
std::string DecodeJson(const BenchDeviceStats& d) {
  const int64_t bytes_read =
      d.decode_steps * d.weight_bytes_per_token + d.decode_kv_tokens_read * d.kv_bytes_per_token;
  const double steps = double(std::max<int64_t>(d.decode_steps, 1));
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                ", \"decode_steps\": %lld, \"decode_device_ms\": %.3f, \"decode_seq_steps\": %lld, "
                "\"decode_kv_tokens_read\": %lld, \"kv_bytes_per_token\": %lld, "
                "\"decode_bytes_read\": %lld, \"decode_step_ms_mean\": %.4f, "
                "\"decode_batch_mean\": %.2f",
                (long long)d.decode_steps, d.decode_device_ms, (long long)d.decode_seq_steps,
                (long long)d.decode_kv_tokens_read, (long long)d.kv_bytes_per_token,
                (long long)bytes_read, d.decode_device_ms / steps,
                double(d.decode_seq_steps) / steps);
  return buf;
}

// One timed pass: `requests` submitted at once and run to the end.
struct Pass {
  double seconds = 0;
  int64_t prompt_tokens = 0, generated = 0, steps = 0, preemptions = 0;
  std::vector<double> ttft_ms, tpot_ms;
  std::vector<std::string> ids_lines, texts;  // per request
  std::vector<int> completion_tokens;         // per request
  BenchDeviceStats device;                    // this pass's share
};

Pass RunPass(Engine& engine, std::vector<Request> requests) {
  Pass p;
  const BenchDeviceStats before = DeviceStats(engine);
  const EngineStats stats_before = engine.Stats();
  std::vector<std::shared_ptr<OutputChannel>> channels;
  const auto start = std::chrono::steady_clock::now();
  for (Request& r : requests) {
    p.prompt_tokens += std::ssize(r.prompt_ids);
    channels.push_back(engine.AddRequest(std::move(r)));
  }
  engine.RunUntilIdle();
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& ch : channels) {
    RequestOutput out;
    std::string ids_line, text;
    p.completion_tokens.push_back(0);
    while (ch->TryPop(&out)) {
      for (int id : out.token_ids) ids_line += std::to_string(id) + " ";
      text += out.text;
      if (!out.is_last) continue;
      p.generated += out.usage.completion_tokens;
      p.completion_tokens.back() = int(out.usage.completion_tokens);
      p.ttft_ms.push_back(out.first_token_seconds * 1e3);
      if (out.usage.completion_tokens > 1) {
        p.tpot_ms.push_back((out.total_seconds - out.first_token_seconds) * 1e3 /
                            double(out.usage.completion_tokens - 1));
      }
    }
    p.ids_lines.push_back(std::move(ids_line));
    p.texts.push_back(std::move(text));
  }
  const EngineStats s = engine.Stats();
  p.steps = s.num_steps - stats_before.num_steps;
  p.preemptions = s.num_preemptions - stats_before.num_preemptions;
  p.device = Delta(DeviceStats(engine), before);
  return p;
}

// --json-schema: a file with one JSON schema, or a JSON array of schemas (request i gets
// schema i % count), compiled once each as the server compiles response_format json_schema.
struct Schemas {
  std::vector<std::shared_ptr<const grammar::CompiledGrammar>> grammars;
  double compile_ms = 0;  // all of them, first compile (no cache hits)
};

Schemas CompileSchemas(const std::string& path, const Tokenizer& tokenizer,
                       const ModelConfig& config) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read --json-schema file " + path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    throw Error("--json-schema " + path + ": " + e.what());
  }
  std::vector<nlohmann::json> list =
      doc.is_array() ? doc.get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{doc};
  if (list.empty()) throw Error("--json-schema " + path + ": no schema");
  const std::vector<int>& eos = config.generation.eos_token_ids.empty()
                                    ? config.eos_token_ids
                                    : config.generation.eos_token_ids;
  grammar::GrammarCompiler compiler(
      grammar::TokenVocabulary::FromTokenizer(tokenizer, eos, config.vocab_size));
  Schemas out;
  const auto start = std::chrono::steady_clock::now();
  for (const nlohmann::json& schema : list) {
    grammar::StructuredSpec spec;
    spec.kind = grammar::StructuredSpec::Kind::kJsonSchema;
    spec.text = schema.dump();
    out.grammars.push_back(compiler.Compile(spec));
  }
  out.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

// The pass's numbers as JSON members (no braces), the CUDA executor's when it is one.
std::string PassJson(const Pass& p, const Engine& engine, int num_requests) {
  char buf[768];
  std::snprintf(buf, sizeof(buf),
                "\"requests\": %d, \"seconds\": %.3f, \"requests_per_s\": %.3f, "
                "\"prompt_tokens\": %lld, \"generated_tokens\": %lld, "
                "\"prompt_tokens_per_s\": %.1f, \"generated_tokens_per_s\": %.1f, "
                "\"total_tokens_per_s\": %.1f, \"steps\": %lld, \"preemptions\": %lld, "
                "\"ttft_ms_mean\": %.3f, \"ttft_ms_p50\": %.3f, \"ttft_ms_p99\": %.3f, "
                "\"tpot_ms_mean\": %.4f, \"tpot_ms_p50\": %.4f",
                num_requests, p.seconds, num_requests / p.seconds, (long long)p.prompt_tokens,
                (long long)p.generated, p.prompt_tokens / p.seconds, p.generated / p.seconds,
                (p.prompt_tokens + p.generated) / p.seconds, (long long)p.steps,
                (long long)p.preemptions, Mean(p.ttft_ms), Percentile(p.ttft_ms, 50),
                Percentile(p.ttft_ms, 99), Mean(p.tpot_ms), Percentile(p.tpot_ms, 50));
  std::string json = buf;
  if (DeviceStats(engine).wall_ms > 0 || p.device.device_ms > 0) {
    std::snprintf(buf, sizeof(buf),
                  ", \"device_ms\": %.1f, \"executor_wall_ms\": %.1f, \"gpu_busy_fraction\": %.4f, "
                  "\"graph_steps\": %lld, \"mask_host_ms\": %.1f, \"mask_rows\": %lld",
                  p.device.device_ms, p.device.wall_ms, p.device.device_ms / (p.seconds * 1e3),
                  (long long)p.device.graph_steps, p.device.mask_ms, (long long)p.device.mask_rows);
    json += buf;
    json += DecodeJson(p.device);
  }
  return json;
}

int RunBench(const BenchFlags& f) {
  if (f.threads > 0) omp_set_num_threads(f.threads);
  EngineConfig config = f.engine;
  config.kv_cache_bytes = f.kv_cache_mb << 20;
  Backend backend = MakeBackend(f.model_dir, f.backend, &config);
  const std::string tok_dir = !f.tokenizer_dir.empty()           ? f.tokenizer_dir
                              : f.backend.load_format == "dummy" ? DefaultModelDir()
                                                                 : f.model_dir;
  auto tokenizer = Tokenizer::Load(tok_dir);
  const ModelConfig model_config = backend.executor->config();
  std::fprintf(stderr, "[llm] bench on %s\n", backend.executor->Describe().c_str());
  Schemas schemas;
  if (!f.json_schema_path.empty()) {
    schemas = CompileSchemas(f.json_schema_path, *tokenizer, model_config);
    std::fprintf(stderr, "[llm] bench: %zu JSON schemas compiled in %.1f ms\n",
                 schemas.grammars.size(), schemas.compile_ms);
  }
  Engine engine(std::move(backend.executor), *tokenizer, config);
  std::mt19937_64 rng(f.seed);
  auto uni = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  const int vocab = static_cast<int>(model_config.vocab_size);
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
  std::vector<Request> requests;
  for (int i = 0; i < f.num_requests; ++i) {
    Request r;
    for (int k = uni(f.min_input, f.max_input); k > 0; --k)
      r.prompt_ids.push_back(uni(3, vocab - 1));
    r.sampling.temperature = f.temperature;
    r.sampling.seed = f.seed + static_cast<uint64_t>(i);
    r.sampling.max_tokens = uni(f.min_output, f.max_output);
    r.sampling.ignore_eos = true;
    if (!schemas.grammars.empty()) {
      // Constrained: stops where its JSON is complete (EOS is allowed only there), or at
      // max_tokens.
      r.sampling.grammar = schemas.grammars[size_t(i) % schemas.grammars.size()];
      r.sampling.ignore_eos = false;
    }
    requests.push_back(std::move(r));
  }
  std::vector<Request> twins;  // --json-schema: the same requests unconstrained
  if (!schemas.grammars.empty()) {
    twins = requests;
    // Other random prompt tokens of the same lengths: no prefix-cache hits on the first pass.
    std::mt19937_64 trng(f.seed ^ 0x7a1bull);
    for (Request& r : twins) {
      for (int& id : r.prompt_ids) id = std::uniform_int_distribution<int>(3, vocab - 1)(trng);
      r.sampling.grammar = nullptr;
    }
  }
  if (f.warm_grammars && !schemas.grammars.empty()) {
    std::vector<Request> warm = requests;
    std::mt19937_64 grng(f.seed ^ 0x9a3dull);
    for (Request& r : warm) {
      for (int& id : r.prompt_ids) id = std::uniform_int_distribution<int>(3, vocab - 1)(grng);
    }
    (void)RunPass(engine, std::move(warm));
  }
  const Pass pass = RunPass(engine, std::move(requests));
  std::string schema_json;
  if (!schemas.grammars.empty()) {
    // The twins generate exactly as many tokens as each constrained request did.
    int64_t num_complete = 0, num_prefix = 0;
    for (size_t i = 0; i < twins.size(); ++i) {
      twins[i].sampling.max_tokens = std::max(1, pass.completion_tokens[i]);
      twins[i].sampling.ignore_eos = true;
      const grammar::CompiledGrammar& g = *schemas.grammars[i % schemas.grammars.size()];
      const int32_t state = g.NextBytes(g.initial_state(), pass.texts[i]);
      num_prefix += state >= 0;
      num_complete += state >= 0 && g.IsAccepting(state);
    }
    const Pass base = RunPass(engine, std::move(twins));
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  ", \"json_schemas\": %zu, \"schema_compile_ms\": %.1f, "
                  "\"outputs_in_language\": %lld, \"outputs_complete\": %lld, "
                  "\"warm_grammars\": %s, \"structured_ratio\": %.4f, ",
                  schemas.grammars.size(), schemas.compile_ms, (long long)num_prefix,
                  (long long)num_complete, f.warm_grammars ? "true" : "false",
                  (pass.generated / pass.seconds) / (base.generated / base.seconds));
    schema_json = buf;
    schema_json += "\"unconstrained\": {" + PassJson(base, engine, f.num_requests) + "}";
  }
  if (!f.output_ids_path.empty()) {
    std::FILE* ids_file = std::fopen(f.output_ids_path.c_str(), "w");
    if (ids_file == nullptr)
      throw llm::Error("cannot write --output-ids file " + f.output_ids_path);
    for (const std::string& line : pass.ids_lines) std::fprintf(ids_file, "%s\n", line.c_str());
    std::fclose(ids_file);
  }
  std::string device_json;
#if defined(LLM_HAS_CUDA)
  if (const auto* cuda = dynamic_cast<const CudaExecutor*>(&engine.executor())) {
    const CudaExecutorStats st = cuda->stats();
    const BenchDeviceStats& d = pass.device;
    char buf[1536];
    std::snprintf(buf, sizeof(buf),
                  ", \"device_ms\": %.1f, \"executor_wall_ms\": %.1f, \"gpu_busy_fraction\": %.4f, "
                  "\"graph_steps\": %lld, \"graphs_captured\": %lld, \"weight_bytes\": %lld, "
                  "\"kv_cache_bytes\": %lld, \"kv_cache_tokens\": %lld, "
                  "\"peak_device_bytes\": %lld, \"weight_bytes_per_token\": %lld, "
                  "\"tensor_parallel_size\": %d, \"kv_cache_dtype\": \"%s\", "
                  "\"quantization\": \"%s\", \"gemm_tuned_shapes\": %lld, "
                  "\"gemm_retuned_shapes\": %lld, \"fp8_prefill_copies\": %lld, "
                  "\"decode_overlap_steps\": %lld, \"mask_host_ms\": %.1f, \"mask_rows\": %lld",
                  d.device_ms, d.wall_ms, d.device_ms / (pass.seconds * 1e3),
                  (long long)d.graph_steps, (long long)st.graphs_captured,
                  (long long)st.weight_bytes, (long long)st.kv_cache_bytes,
                  (long long)engine.kv_capacity_tokens(), (long long)st.peak_device_bytes,
                  (long long)st.weight_bytes_per_token, f.backend.tensor_parallel_size,
                  f.backend.kv_cache_dtype.c_str(), f.backend.quantization.c_str(),
                  (long long)st.gemm_tuned_shapes, (long long)st.gemm_retuned_shapes,
                  (long long)d.fp8_prefill_copies, (long long)d.decode_overlap_steps, d.mask_ms,
                  (long long)d.mask_rows);
    device_json = buf;
    device_json += DecodeJson(d);
  }
#endif
  const Pass& p = pass;
  std::printf(
      "{\"model\": \"%s\", \"requests\": %d, \"seconds\": %.3f, \"requests_per_s\": %.3f, "
      "\"prompt_tokens\": %lld, \"generated_tokens\": %lld, \"prompt_tokens_per_s\": %.1f, "
      "\"generated_tokens_per_s\": %.1f, \"total_tokens_per_s\": %.1f, \"steps\": %lld, "
      "\"preemptions\": %lld, \"preemptions_per_1k_requests\": %.1f, \"kv_reserve_ratio\": %.2f, "
      "\"ttft_ms_mean\": %.3f, \"ttft_ms_p50\": %.3f, "
      "\"ttft_ms_p99\": %.3f, \"tpot_ms_mean\": %.4f, \"tpot_ms_p50\": %.4f, "
      "\"threads\": %d, \"async_scheduling\": %s%s%s}\n",
      f.model_dir.c_str(), f.num_requests, p.seconds, f.num_requests / p.seconds,
      (long long)p.prompt_tokens, (long long)p.generated, p.prompt_tokens / p.seconds,
      p.generated / p.seconds, (p.prompt_tokens + p.generated) / p.seconds, (long long)p.steps,
      (long long)p.preemptions, 1000.0 * double(p.preemptions) / f.num_requests,
      engine.config().kv_reserve_ratio, Mean(p.ttft_ms), Percentile(p.ttft_ms, 50),
      Percentile(p.ttft_ms, 99), Mean(p.tpot_ms), Percentile(p.tpot_ms, 50), omp_get_max_threads(),
      engine.config().async_scheduling ? "true" : "false", device_json.c_str(),
      schema_json.c_str());
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
  cmd->add_option("--max-num-seqs", f->engine.max_num_seqs)->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->engine.max_num_batched_tokens)
      ->capture_default_str();
  AddKvReserveOptions(cmd, &f->engine);
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb, "KV cache size")->capture_default_str();
  f->backend.AddTo(cmd);
  cmd->add_option("--tokenizer", f->tokenizer_dir, "folder with tokenizer.model (default: model)");
  cmd->add_option("--temperature", f->temperature)->capture_default_str();
  cmd->add_flag("--warmup", f->warmup, "run one untimed request of the largest shape first");
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)");
  cmd->add_option("--output-ids", f->output_ids_path,
                  "write each request's generated token ids to this file, one line per request "
                  "(compares the tokens of two builds)");
  cmd->add_option("--json-schema", f->json_schema_path,
                  "structured outputs: a file with a JSON schema, or a JSON array of schemas "
                  "(request i gets schema i % count), compiled as response_format json_schema; "
                  "the constrained requests stop where their JSON is complete (or at their "
                  "max_tokens), then the same requests run unconstrained (other prompt tokens of "
                  "the same lengths, each generating as many tokens as its constrained twin) and "
                  "the line gets both throughputs and their ratio (structured_ratio)");
  cmd->add_flag("--warm-grammars", f->warm_grammars,
                "--json-schema: run the constrained requests once untimed first (other prompt "
                "tokens), so that the compiled grammars hold the masks of the states such a load "
                "visits, as a server's grammar cache does once it has served these schemas");
  return [f] { return RunBench(*f); };
}

}  // namespace llm::cli
