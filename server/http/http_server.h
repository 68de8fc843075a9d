// The OpenAI-compatible HTTP front end (cpp-httplib from Debian). Network threads only
// validate, build an engine Request, and stream its channel back; they never touch the model.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
// GET /metrics, POST /tokenize, POST /detokenize, and the chat page (GET /, GET /static/NAME:
// server/http/web_assets.h; public, no API key). Lifecycle: bounded admission (429 +
// Retry-After; the count is shared with gRPC: server/front_end.h), body limit (413), API key
// (401), drain (503), client disconnect -> the request is cancelled in the engine (a streamed
// response notices on its next write; long prefills and non-streamed responses are probed
// with SSE comments / leading whitespace).
// A request whose engine step failed: a 500 (503 once the engine is unhealthy) with an OpenAI
// error body, or in a stream an error event {"error": {...}} and then [DONE]; an unhealthy
// engine turns /health and new requests into 503s.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/front_end.h"
#include "server/http/openai_api.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace llm::server {

struct Flight;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;           // 0: any free port (tests)
  std::string api_key = "";  // empty: no authentication
  size_t max_body_bytes = 4 << 20;
  double default_timeout_seconds = 0;   // 0: none
  double probe_interval_seconds = 1.0;  // disconnect probe while nothing else is written
  int num_http_threads = 128;
};

// The model folder's chat template (tokenizer_config.json) as a renderer, or null when it
// has none. Throws llm::Error naming the file when the template cannot be parsed (an error
// at start-up, never a silent fallback).
ChatRenderer MakeChatRenderer(const std::string& model_dir, const Tokenizer& tokenizer);

class HttpServer {
 public:
  // `front_end` (admission, metrics) is shared with the gRPC server; it outlives this one.
  HttpServer(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer, ModelInfo model,
             ServerConfig config, ChatRenderer chat = nullptr);
  ~HttpServer();

  int Bind();    // binds host:port, returns the port (throws llm::Error when it cannot)
  void Serve();  // blocks until Stop()
  void Stop();
  // Stops accepting work: /health and new requests answer 503; in-flight ones continue.
  void BeginDrain();

 private:
  void Routes();
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;
  void Generate(const httplib::Request& req, httplib::Response& res, bool is_chat);
  void StreamResponse(std::shared_ptr<Flight> flight, httplib::Response& res);
  void JsonResponse(std::shared_ptr<Flight> flight, httplib::Response& res);
  void Tokenize(const httplib::Request& req, httplib::Response& res);
  void Detokenize(const httplib::Request& req, httplib::Response& res);
  void Finish(Flight& flight, bool client_gone);
  void RecordFinished(Flight& flight, const RequestOutput& last);  // metrics and log line
  ApiError EngineFailure(const RequestOutput& out) const;

  Engine& engine_;
  FrontEnd& front_end_;
  const Tokenizer& tokenizer_;
  ModelInfo model_;
  ServerConfig config_;
  ChatRenderer chat_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
};

void SendError(httplib::Response& res, const ApiError& error);

// Answers on the server's address while the model loads: /health 503 {"status": "loading"},
// every other route 503 in OpenAI's error shape. Stop() frees the port for the real server.
class LoadingResponder {
 public:
  LoadingResponder();
  ~LoadingResponder();
  int Start(const std::string& host, int port);  // returns the bound port
  void Stop();

 private:
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<std::thread> thread_;
};

}  // namespace llm::server
