// `llm serve --model DIR [--host H] [--port P] [--api-key KEY] ...`: the OpenAI-compatible
// HTTP server over the continuous-batching engine.
//
// Shutdown contract: the first SIGTERM/SIGINT stops accepting (503 on new requests and on
// /health), lets in-flight requests finish for up to --shutdown-timeout seconds, then exits
// 0; a second signal exits at once (status 1).
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/cpu/cpu_model.h"
#include "engine/engine.h"
#include "engine/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/cli/backend.h"
#include "server/cli/commands.h"
#include "server/grpc/grpc_server.h"
#include "server/http/http_server.h"

namespace llm::cli {
namespace {

struct ServeFlags {
  std::string model_dir = DefaultModelDir();
  std::string served_model_name;
  std::string tokenizer_dir;  // default: the model folder
  server::ServerConfig http;
  server::GrpcConfig grpc;
  server::AdmissionLimits admission;  // HTTP and gRPC together
  EngineConfig engine;
  int64_t kv_cache_mb = 1024;
  double shutdown_timeout = 30;
  grammar::CompilerOptions structured;    // --structured-output-compile-timeout
  std::string tool_call_parser = "auto";  // or a chat::ToolFormat name
  std::string reasoning_parser = "auto";  // "think", "none"
  BackendFlags backend;
  int threads = 0;
};

void Log(const std::string& line) { std::fprintf(stderr, "[llm] %s\n", line.c_str()); }

// Waits for signals on a dedicated thread (all threads block them): first drain, then exit.
void HandleSignals(server::HttpServer& http, server::GrpcServer* grpc,
                   const server::FrontEnd& front_end, double shutdown_timeout) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  Log("signal " + std::to_string(sig) + ": draining (a second signal exits at once)");
  http.BeginDrain();
  if (grpc) grpc->BeginDrain();
  std::thread([set]() mutable {
    int again = 0;
    sigwait(&set, &again);
    Log("second signal: exiting now");
    std::_Exit(1);
  }).detach();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(int64_t(shutdown_timeout * 1000));
  auto in_flight = [&] { return front_end.num_in_flight(); };  // HTTP and gRPC
  while (in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Log("stopping with " + std::to_string(in_flight()) + " requests in flight");
  if (grpc) grpc->Stop();
  http.Stop();
}

// Every client socket is a file descriptor: raise the soft limit to the hard one, and keep
// --max-connections within it (with room for the model's files, gRPC and the engine).
void RaiseFileLimit(ServeFlags* f) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  constexpr int64_t kReserve = 256;
  const int64_t fds =
      limit.rlim_cur == RLIM_INFINITY ? int64_t{1} << 20 : static_cast<int64_t>(limit.rlim_cur);
  const int64_t most = std::max<int64_t>(16, fds - kReserve);
  if (f->http.max_connections > most) {
    Log("--max-connections " + std::to_string(f->http.max_connections) + " lowered to " +
        std::to_string(most) + " (file descriptor limit " + std::to_string(fds) + ")");
    f->http.max_connections = most;
  }
  Log("file descriptors: " + std::to_string(fds) + "; HTTP holds up to " +
      std::to_string(f->http.max_connections) + " connections on " +
      std::to_string(f->http.num_io_threads) + " I/O threads");
}

int RunServe(ServeFlags f) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: all inherit it
  if (f.threads > 0) omp_set_num_threads(f.threads);
  RaiseFileLimit(&f);
  // /health answers 503 "loading" while the weights load (readiness probes wait for 200).
  server::LoadingResponder loading;
  f.http.port = loading.Start(f.http.host, f.http.port);
  Log("loading " + f.model_dir + " (http://" + f.http.host + ":" + std::to_string(f.http.port) +
      "/health answers 503 until ready)");
  f.engine.kv_cache_bytes = f.kv_cache_mb << 20;
  Backend backend = MakeBackend(f.model_dir, f.backend, &f.engine);
  const std::string tok_dir = f.tokenizer_dir.empty() ? f.model_dir : f.tokenizer_dir;
  auto tokenizer = Tokenizer::Load(tok_dir);
  const ModelConfig model_config = backend.executor->config();
  const std::string backend_name = backend.executor->Describe();
  Engine engine(std::move(backend.executor), *tokenizer, f.engine);
  server::ModelInfo info;
  info.id = f.served_model_name.empty()
                ? std::filesystem::path(f.model_dir).lexically_normal().filename().string()
                : f.served_model_name;
  if (info.id.empty()) info.id = "model";
  info.max_model_len = model_config.max_position_embeddings;
  info.vocab_size = model_config.vocab_size;
  {  // Structured outputs: the vocabulary's bytes once, grammars compiled per request (cached).
    const std::vector<int>& eos = model_config.generation.eos_token_ids.empty()
                                      ? model_config.eos_token_ids
                                      : model_config.generation.eos_token_ids;
    info.grammars = std::make_shared<grammar::GrammarCompiler>(
        grammar::TokenVocabulary::FromTokenizer(*tokenizer, eos, model_config.vocab_size),
        f.structured);
  }
  std::string template_source;
  server::ChatRenderer chat = server::MakeChatRenderer(tok_dir, *tokenizer, &template_source);
  // Tool calls and reasoning: the flags, else what the template shows.
  info.tool_format = f.tool_call_parser == "auto" ? chat::DetectToolFormat(template_source)
                                                  : *chat::ToolFormatFromName(f.tool_call_parser);
  info.reasoning = f.reasoning_parser == "auto" ? chat::DetectReasoning(template_source)
                                                : f.reasoning_parser == "think";
  if (chat) {
    Log(std::string("chat: tool calls ") + std::string(chat::ToolFormatName(info.tool_format)) +
        ", reasoning " + (info.reasoning ? "<think>" : "none"));
  }
  server::FrontEnd front_end(engine, info.id, f.admission);
  server::HttpServer http(engine, front_end, *tokenizer, info, f.http, chat);
  loading.Stop();
  const int port = http.Bind();
  std::unique_ptr<server::GrpcServer> grpc;
  int grpc_port = -1;
  if (f.grpc.port >= 0) {
    f.grpc.host = f.http.host;
    f.grpc.default_timeout_seconds = f.http.default_timeout_seconds;
    f.grpc.api_key = f.http.api_key;
    grpc = std::make_unique<server::GrpcServer>(engine, front_end, *tokenizer, info, f.grpc);
    grpc_port = grpc->Start();
  }
  engine.Start();
  // A folder that labels itself (the build's demo model) says so at start.
  if (std::ifstream notice(std::filesystem::path(f.model_dir) / "NOTICE"); notice) {
    std::string line;
    if (std::getline(notice, line)) Log(line);
  }
  Log("model " + info.id + " (" + f.model_dir + "), backend " + backend_name + ", KV cache " +
      std::to_string(engine.kv_capacity_tokens()) + " tokens, chat template " +
      (chat ? "yes" : "no"));
  Log("listening on http://" + f.http.host + ":" + std::to_string(port) +
      (grpc ? ", gRPC " + f.http.host + ":" + std::to_string(grpc_port) : ""));
  std::thread signals(HandleSignals, std::ref(http), grpc.get(), std::cref(front_end),
                      f.shutdown_timeout);
  signals.detach();
  http.Serve();
  engine.Stop();
  Log("stopped");
  return 0;
}

}  // namespace

Command AddServe(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  auto f = std::make_shared<ServeFlags>();
  cmd->add_option("--model", f->model_dir, "Hugging Face model folder")->capture_default_str();
  cmd->add_option("--served-model-name", f->served_model_name, "model id in the API");
  cmd->add_option("--tokenizer", f->tokenizer_dir,
                  "folder with tokenizer.model and tokenizer_config.json (default: --model)");
  cmd->add_option("--host", f->http.host)->capture_default_str();
  cmd->add_option("--port", f->http.port)->capture_default_str();
  cmd->add_option("--grpc-port", f->grpc.port, "gRPC port (-1: no gRPC)")->capture_default_str();
  cmd->add_option("--api-key", f->http.api_key, "require Authorization: Bearer KEY")
      ->envname("LLM_API_KEY");
  cmd->add_option("--max-body-bytes", f->http.max_body_bytes, "request body limit (413 beyond)")
      ->capture_default_str();
  cmd->add_option("--max-header-bytes", f->http.max_header_bytes,
                  "request line and headers limit (431 beyond)")
      ->capture_default_str();
  cmd->add_option("--max-connections", f->http.max_connections,
                  "open HTTP connections (beyond: 503 and close; kept within the file limit)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--io-threads", f->http.num_io_threads,
                  "HTTP event-loop threads (no thread per connection or stream)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--parse-threads", f->http.num_parse_threads,
                  "threads that parse, template and tokenize HTTP requests")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--header-timeout", f->http.header_timeout_seconds,
                  "seconds for a request's head to arrive (from its first byte)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--body-timeout", f->http.body_timeout_seconds,
                  "seconds for a request's body to arrive")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", f->http.idle_timeout_seconds,
                  "seconds an idle keep-alive connection stays open")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--write-timeout", f->http.write_timeout_seconds,
                  "seconds a write may wait for a client that stopped reading (then its "
                  "request is cancelled)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-queued-requests", f->admission.max_queued_requests,
                  "requests beyond the running batch, HTTP and gRPC together (then 429 / "
                  "RESOURCE_EXHAUSTED)")
      ->capture_default_str();
  cmd->add_option("--max-queued-prompt-tokens", f->admission.max_queued_prompt_tokens,
                  "prompt tokens of the admitted requests, HTTP and gRPC together")
      ->capture_default_str();
  cmd->add_option("--request-timeout", f->http.default_timeout_seconds,
                  "default per-request timeout in seconds (0 = none)")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", f->shutdown_timeout, "seconds to drain on SIGTERM")
      ->capture_default_str();
  cmd->add_option("--structured-output-compile-timeout", f->structured.timeout_seconds,
                  "seconds a request's JSON schema / regex / grammar may take to compile "
                  "(beyond: a 400)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tool-call-parser", f->tool_call_parser,
                  "how the model writes tool calls: hermes (Qwen 2.5 / Qwen3 <tool_call>), "
                  "llama3_json, mistral, none, or auto (read off the chat template)")
      ->check(CLI::IsMember({"auto", "hermes", "qwen", "llama3_json", "mistral", "none"}))
      ->capture_default_str();
  cmd->add_option("--reasoning-parser", f->reasoning_parser,
                  "think: <think>...</think> is reasoning_content; none; or auto (think when "
                  "the chat template knows </think>)")
      ->check(CLI::IsMember({"auto", "think", "none"}))
      ->capture_default_str();
  cmd->add_option("--disconnect-probe-interval", f->http.probe_interval_seconds,
                  "seconds between writes that look for a gone client while a response has "
                  "nothing to send; a non-streamed response keeps its status this long")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb)->capture_default_str();
  cmd->add_option("--block-size", f->engine.block_size)->capture_default_str();
  cmd->add_option("--max-num-seqs", f->engine.max_num_seqs)->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->engine.max_num_batched_tokens)
      ->capture_default_str();
  AddKvReserveOptions(cmd, &f->engine);
  cmd->add_option("--max-consecutive-step-failures", f->engine.max_consecutive_step_failures,
                  "failed engine steps in a row after which /health answers 503 (0: never)")
      ->capture_default_str();
  f->backend.AddTo(cmd);
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)");
  return [f] { return RunServe(*f); };
}

}  // namespace llm::cli
