#include "server/http/http_server.h"

#include <boost/asio/post.hpp>

#include "engine/error.h"
#include "engine/loader/json_file.h"
#include "server/http/web_assets.h"

namespace llm::server {

using beast_http::field;
using beast_http::verb;
using nlohmann::json;

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse res{static_cast<beast_http::status>(status), 11};
  res.set(field::content_type, "application/json");
  res.body() = body.dump();
  return res;
}

HttpResponse ErrorResponse(const ApiError& error) {
  return JsonResponse(error.status, ErrorBody(error));
}

json ParseJsonBody(const std::string& text) {
  if (JsonNestingDepth(text) > kMaxJsonDepth) return json(json::value_t::discarded);
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

namespace {

ConnectionLimits LimitsOf(const ServerConfig& c) {
  return {.max_header_bytes = c.max_header_bytes,
          .max_body_bytes = c.max_body_bytes,
          .header_timeout_seconds = c.header_timeout_seconds,
          .body_timeout_seconds = c.body_timeout_seconds,
          .idle_timeout_seconds = c.idle_timeout_seconds,
          .write_timeout_seconds = c.write_timeout_seconds,
          .max_connections = c.max_connections};
}

// The routes and the one method each answers (any other method: 405 with Allow).
enum class Route {
  kHealth,
  kLive,
  kReady,
  kModels,
  kMetrics,
  kCompletions,
  kChat,
  kTokenize,
  kDetokenize,
  kPage
};
struct RouteSpec {
  std::string_view path;
  verb method;
  Route route;
};
constexpr RouteSpec kRoutes[] = {
    {"/health", verb::get, Route::kHealth},
    {"/health/live", verb::get, Route::kLive},
    {"/health/ready", verb::get, Route::kReady},
    {"/v1/models", verb::get, Route::kModels},
    {"/metrics", verb::get, Route::kMetrics},
    {"/v1/completions", verb::post, Route::kCompletions},
    {"/v1/chat/completions", verb::post, Route::kChat},
    {"/tokenize", verb::post, Route::kTokenize},
    {"/detokenize", verb::post, Route::kDetokenize},
    {"/", verb::get, Route::kPage},
};

}  // namespace

HttpServer::HttpServer(Engine& engine, FrontEnd& front_end, const Tokenizer& tokenizer,
                       ModelInfo model, ServerConfig config, ChatRenderer chat)
    : engine_(engine),
      front_end_(front_end),
      tokenizer_(tokenizer),
      model_(std::move(model)),
      config_(std::move(config)),
      chat_(std::move(chat)),
      parse_pool_(static_cast<size_t>(std::max(1, config_.num_parse_threads))),
      listener_(*this, LimitsOf(config_), config_.num_io_threads) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::Bind() { return listener_.Bind(config_.host, config_.port); }

void HttpServer::Serve() {
  listener_.Start();
  listener_.Wait();
}

void HttpServer::Stop() {
  listener_.Stop([this] {
    parse_pool_.join();  // no new responses after this
    wakers_.DetachAll();
  });
  parse_pool_.join();
}

void HttpServer::BeginDrain() { draining_ = true; }

HttpResponse HttpServer::Refusal(int status, const std::string& message, const std::string& code) {
  return ErrorResponse(
      {status, message, status >= 500 ? "server_error" : "invalid_request_error", "", code});
}

void HttpServer::Responded(int status) {
  if (status >= 400) front_end_.metrics().HttpResponse(status);
}

bool HttpServer::Authorized(const HttpRequest& req) const {
  if (config_.api_key.empty()) return true;
  const std::string_view got = req[field::authorization];
  constexpr std::string_view kBearer = "Bearer ";
  return got.starts_with(kBearer) &&
         ConstantTimeEquals(got.substr(kBearer.size()), config_.api_key);
}

HttpResponse HttpServer::Health() const {
  // Unhealthy (a fatal step error, or failing steps in a row): 503 so that the orchestrator
  // restarts the process (a liveness probe) and takes it out of rotation (readiness). Atomics
  // only (the reason string is read once the engine is unhealthy, which never changes back).
  const bool is_healthy = engine_.IsHealthy();
  const bool draining = draining_;
  json body = {{"status", draining ? "draining" : is_healthy ? "ok" : "unhealthy"}};
  if (!is_healthy) body["reason"] = engine_.UnhealthyReason();
  return JsonResponse(draining || !is_healthy ? 503 : 200, body);
}

// Liveness (restart me?): only an engine that turned unhealthy for good says no. A draining or
// overloaded server is alive, and restarting it would lose the requests it holds.
HttpResponse HttpServer::Live() const {
  const bool is_healthy = engine_.IsHealthy();
  json body = {{"status", is_healthy ? "ok" : "unhealthy"}};
  if (!is_healthy) body["reason"] = engine_.UnhealthyReason();
  return JsonResponse(is_healthy ? 200 : 503, body);
}

// Readiness (send me traffic?): no while draining, unhealthy, or with every admission slot
// taken (a new request would get a 429), so a Service sends it to the other replicas.
HttpResponse HttpServer::Ready() const {
  const bool is_healthy = engine_.IsHealthy();
  const char* status = draining_                  ? "draining"
                       : !is_healthy              ? "unhealthy"
                       : front_end_.at_capacity() ? "at_capacity"
                                                  : "ok";
  return JsonResponse(std::string_view(status) == "ok" ? 200 : 503, {{"status", status}});
}

HttpResponse HttpServer::Models() const {
  json model = {{"id", model_.id},
                {"object", "model"},
                {"owned_by", "llm"},
                {"max_model_len", model_.max_model_len}};
  return JsonResponse(200, {{"object", "list"}, {"data", json::array({model})}});
}

void HttpServer::OffStrand(const ConnPtr& conn, std::function<HttpResponse()> work) {
  asio::post(parse_pool_, [conn, work = std::move(work)] {
    HttpResponse res;
    try {
      res = work();
    } catch (const std::exception&) {
      res = ErrorResponse({500, "internal server error", "internal_error", "", ""});
    }
    asio::post(conn->executor(),
               [conn, res = std::move(res)]() mutable { conn->Reply(std::move(res)); });
  });
}

void HttpServer::Handle(const ConnPtr& conn, HttpRequest req) {
  const std::string_view target = req.target();
  const std::string_view path = target.substr(0, target.find('?'));
  const verb method = req.method() == verb::head ? verb::get : req.method();
  const RouteSpec* spec = nullptr;
  for (const RouteSpec& r : kRoutes) {
    if (r.path == path) spec = &r;
  }
  if (spec == nullptr && path.starts_with("/static/")) {
    static constexpr RouteSpec kStatic = {"/static/", verb::get, Route::kPage};
    spec = &kStatic;
  }
  if (spec == nullptr) {
    return conn->Reply(ErrorResponse({404,
                                      "Unknown route " + std::string(req.method_string()) + " " +
                                          std::string(path.substr(0, 200)),
                                      "invalid_request_error", "", "not_found"}));
  }
  if (method != spec->method) {
    const std::string allowed(beast_http::to_string(spec->method));
    HttpResponse res = ErrorResponse({405, "Method not allowed; use " + allowed,
                                      "invalid_request_error", "", "method_not_allowed"});
    res.set(field::allow, allowed);
    return conn->Reply(std::move(res));
  }
  // The chat page and /health are public (a browser loads the page, then asks for the key).
  if (spec->route == Route::kPage) return conn->Reply(WebAssetResponse(req, path));
  if (spec->route == Route::kHealth) return conn->Reply(Health());
  if (spec->route == Route::kLive) return conn->Reply(Live());
  if (spec->route == Route::kReady) return conn->Reply(Ready());
  if (!Authorized(req)) {
    return conn->Reply(
        ErrorResponse({401, "Invalid or missing API key (send Authorization: Bearer <key>).",
                       "authentication_error", "", "invalid_api_key"}));
  }
  switch (spec->route) {
    case Route::kModels:
      return conn->Reply(Models());
    case Route::kMetrics: {
      HttpResponse res{beast_http::status::ok, 11};
      res.set(field::content_type, "text/plain; version=0.0.4");
      res.body() = front_end_.metrics().Render(engine_.Stats());
      return conn->Reply(std::move(res));
    }
    case Route::kCompletions:
    case Route::kChat:
      return Generate(conn, std::move(req.body()), spec->route == Route::kChat);
    case Route::kTokenize:
      return OffStrand(conn, [this, body = std::move(req.body())] { return Tokenize(body); });
    case Route::kDetokenize:
      return OffStrand(conn, [this, body = std::move(req.body())] { return Detokenize(body); });
    case Route::kHealth:
    case Route::kLive:
    case Route::kReady:
    case Route::kPage:
      break;
  }
}

HttpResponse HttpServer::Tokenize(const std::string& text_body) const {
  json body = ParseJsonBody(text_body);
  if (body.is_object() && body.contains("messages")) {  // a chat prompt, as vLLM's /tokenize
    if (!chat_) {
      return ErrorResponse({400, "This model has no chat template.", "invalid_request_error",
                            "messages", "no_chat_template"});
    }
    std::vector<int> ids;
    try {
      ids = ParseChatBody(text_body, body, chat_, tokenizer_, model_).request.prompt_ids;
    } catch (const ApiError& e) {
      return ErrorResponse(e);
    } catch (const Error& e) {
      return ErrorResponse({400, e.what(), "invalid_request_error", "", "invalid_request"});
    }
    return JsonResponse(
        200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model_.max_model_len}});
  }
  const json* text = body.is_object() ? (body.contains("prompt") ? &body["prompt"]
                                         : body.contains("text") ? &body["text"]
                                                                 : nullptr)
                                      : nullptr;
  if (text == nullptr || !text->is_string()) {
    return ErrorResponse({400, "send {\"prompt\": \"text\"}", "invalid_request_error", "prompt",
                          "invalid_parameter"});
  }
  const bool special = body.value("add_special_tokens", true);
  const std::vector<int> ids = special ? tokenizer_.EncodePrompt(text->get<std::string>())
                                       : tokenizer_.Encode(text->get<std::string>());
  return JsonResponse(
      200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model_.max_model_len}});
}

HttpResponse HttpServer::Detokenize(const std::string& text_body) const {
  json body = ParseJsonBody(text_body);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    return ErrorResponse(
        {400, "send {\"tokens\": [ids]}", "invalid_request_error", "tokens", "invalid_parameter"});
  }
  std::vector<int> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model_.vocab_size) {
      return ErrorResponse({400,
                            "tokens must be ids in [0, " + std::to_string(model_.vocab_size) + ")",
                            "invalid_request_error", "tokens", "invalid_parameter"});
    }
    ids.push_back(t.get<int>());
  }
  const json::const_iterator skip = body.find("skip_special_tokens");
  if (skip != body.end() && !skip->is_boolean()) {
    return ErrorResponse({400, "skip_special_tokens must be true or false", "invalid_request_error",
                          "skip_special_tokens", "invalid_parameter"});
  }
  const bool skip_special = skip == body.end() || skip->get<bool>();
  // As transformers' decode: clean_up_tokenization_spaces (tokenizer_config.json) applies here;
  // generated text is streamed and is not cleaned up (as vLLM streams it).
  return JsonResponse(200,
                      {{"prompt", tokenizer_.CleanUpSpaces(tokenizer_.Decode(ids, skip_special))}});
}

}  // namespace llm::server

namespace llm::server {

LoadingResponder::LoadingResponder() : listener_(*this, ConnectionLimits{}, 1) {}

LoadingResponder::~LoadingResponder() { Stop(); }

int LoadingResponder::Start(const std::string& host, int port) {
  const int bound = listener_.Bind(host, port);
  listener_.Start();
  return bound;
}

void LoadingResponder::Stop() { listener_.Stop(); }

void LoadingResponder::Handle(const std::shared_ptr<Connection>& conn, HttpRequest request) {
  const std::string_view target = request.target();
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/health/live") return conn->Reply(JsonResponse(200, {{"status", "loading"}}));
  if (path == "/health" || path == "/health/ready") {
    return conn->Reply(JsonResponse(503, {{"status", "loading"}}));
  }
  conn->Reply(
      ErrorResponse({503, "The model is loading; retry shortly.", "server_error", "", "loading"}));
}

HttpResponse LoadingResponder::Refusal(int status, const std::string& message,
                                       const std::string& code) {
  return ErrorResponse(
      {status, message, status >= 500 ? "server_error" : "invalid_request_error", "", code});
}

}  // namespace llm::server
