// The OpenAI-compatible HTTP front end, event-driven (server/http/http_connection.h: Beast
// and Asio on a few I/O threads; no thread per connection or stream). I/O threads only read,
// route and write; request bodies are parsed and tokenized on a small parse pool; the engine's
// channel wakes a response when it pushes (OutputWaker), so no thread waits on a stream.
// /health and /metrics are answered on the I/O threads from atomics and snapshots, never
// behind the engine, the parse pool or other clients.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health (200
// ok; 503 draining, unhealthy or loading), GET /health/live (liveness: 503 only when the
// engine turned unhealthy), GET /health/ready (readiness: 503 also while draining or with
// every admission slot taken), GET /metrics, POST /tokenize, POST /detokenize, and the chat page
// (GET /, GET /static/NAME: server/http/web_assets.h; public, no API key). Lifecycle: bounded
// admission (429 + Retry-After; the count is shared with gRPC: server/front_end.h), body limit
// (413), header limit (431), API key (401; compared in constant time), drain (503), connection
// limit (503 and close), deadlines for the head, the body, idle keep-alive and every write. A
// client that goes away, or stops reading past the write deadline, has its request cancelled in the
// engine (its KV blocks freed at the next step); long prefills and non-streamed responses still
// write probes (SSE comments / leading whitespace) every probe interval, for proxies. A request
// whose engine step failed: a 500 (503 once the engine is unhealthy) with an OpenAI error body, or
// in a stream an error event {"error": {...}} and then [DONE]; an unhealthy engine turns /health
// and new requests into 503s.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/front_end.h"
#include "server/http/http_connection.h"
#include "server/http/openai_api.h"

namespace llm::server {

struct Flight;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;           // 0: any free port (tests)
  std::string api_key = "";  // empty: no authentication
  size_t max_body_bytes = 4 << 20;
  double default_timeout_seconds = 0;   // 0: none
  double probe_interval_seconds = 1.0;  // disconnect probe while nothing else is written
  int num_io_threads = 4;               // the event loop's threads
  int num_parse_threads = 2;            // JSON parsing, chat templates, tokenization
  size_t max_header_bytes = 16 << 10;
  double header_timeout_seconds = 10;
  double body_timeout_seconds = 60;
  double idle_timeout_seconds = 60;
  double write_timeout_seconds = 30;
  int64_t max_connections = 10000;
};

// The model folder's chat template (tokenizer_config.json) as a renderer, or null when it
// has none. Throws llm::Error naming the file when the template cannot be parsed (an error
// at start-up, never a silent fallback). `source`, when given, gets the template's text ("" when
// none).
ChatRenderer MakeChatRenderer(const std::string& model_dir, const Tokenizer& tokenizer,
                              std::string* source = nullptr);

// A request body's JSON; discarded when it is not JSON or nests deeper than kMaxJsonDepth
// (engine/loader/json_file.h: copying or printing the value would recurse that deep).
nlohmann::json ParseJsonBody(const std::string& text);

// An HTTP response with a JSON body, and one with OpenAI's error body.
HttpResponse JsonResponse(int status, const nlohmann::json& body);
HttpResponse ErrorResponse(const ApiError& error);

class HttpServer : private RequestHandler {
 public:
  // `front_end` (admission, metrics) is shared with the gRPC server; it outlives this one.
  HttpServer(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer, ModelInfo model,
             ServerConfig config, ChatRenderer chat = nullptr);
  ~HttpServer() override;

  int Bind();    // binds host:port, returns the port (throws llm::Error when it cannot)
  void Serve();  // blocks until Stop()
  void Stop();
  // Stops accepting work: /health and new requests answer 503; in-flight ones continue.
  void BeginDrain();
  int64_t num_connections() const { return listener_.num_connections(); }

 private:
  using ConnPtr = std::shared_ptr<Connection>;
  void Handle(const ConnPtr& conn, HttpRequest request) override;
  HttpResponse Refusal(int status, const std::string& message, const std::string& code) override;
  void Responded(int status) override;

  bool Authorized(const HttpRequest& req) const;
  HttpResponse Health() const;
  HttpResponse Live() const;
  HttpResponse Ready() const;
  HttpResponse Models() const;
  // Runs `work` on the parse pool and sends its response from the connection's strand.
  void OffStrand(const ConnPtr& conn, std::function<HttpResponse()> work);
  HttpResponse Tokenize(const std::string& body) const;
  HttpResponse Detokenize(const std::string& body) const;
  // The generation routes (http_generate.cc): Generate runs on the parse pool, Begin,
  // Drain, Probe and Finish on the connection's strand.
  void Generate(const ConnPtr& conn, std::string body, bool is_chat);
  std::optional<HttpResponse> Prepare(Flight& flight, const std::string& body, bool is_chat);
  void Begin(const std::shared_ptr<Flight>& flight);
  void Drain(const std::shared_ptr<Flight>& flight);
  void DrainStream(Flight& flight);
  void DrainJson(Flight& flight);
  void ArmProbe(const std::shared_ptr<Flight>& flight, Clock::time_point at);
  void Probe(const std::shared_ptr<Flight>& flight);
  void Finish(Flight& flight, bool client_gone);
  void RecordFinished(Flight& flight, const RequestOutput& last);  // metrics and log line
  ApiError EngineFailure(const RequestOutput& out) const;

  Engine& engine_;
  FrontEnd& front_end_;
  const Tokenizer& tokenizer_;
  ModelInfo model_;
  ServerConfig config_;
  ChatRenderer chat_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
  WakerSet wakers_;
  boost::asio::thread_pool parse_pool_;
  HttpListener listener_;  // last: its threads stop before the members above go
};

// Answers on the server's address while the model loads: /health 503 {"status": "loading"},
// every other route 503 in OpenAI's error shape. Stop() frees the port for the real server.
class LoadingResponder : private RequestHandler {
 public:
  LoadingResponder();
  ~LoadingResponder() override;
  int Start(const std::string& host, int port);  // returns the bound port
  void Stop();

 private:
  void Handle(const std::shared_ptr<Connection>& conn, HttpRequest request) override;
  HttpResponse Refusal(int status, const std::string& message, const std::string& code) override;

  HttpListener listener_;
};

}  // namespace llm::server
